#!/usr/bin/env bash
# GPU checks: CUDA correctness in fp32 and bf16, chain vs tree vs default policy timings with CUDA
# events, at a Qwen3-8B-shaped random target; projected to the published acceptance lengths. Run on a machine with
# one CUDA GPU, from the repository root, in an environment where `pip install -e .` worked (no internet needed):
#   bash benchmarks/gpu_check.sh            -> benchmarks/gpu_check.json
set -euo pipefail
cd "$(dirname "$0")/.."
python -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name(0))"
python benchmarks/gpu_check.py --device cuda --json benchmarks/gpu_check.json "$@"
