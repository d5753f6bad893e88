#!/usr/bin/env bash
# GPU benchmark at the Qwen3-8B shape (random weights made peaked, scripted acceptance): lossless checks in fp32 and
# bf16, then bf16 (the headline) and fp32 timings of plain generate (eager and static cache + compile), prompt lookup,
# transformers' DFlash and ours at tau 4 / 6.5 / 7.5, long prompts with peak memory (benchmarks/gpu_check.py).
# Run on a machine with one CUDA GPU, from any folder, where `import hf_dflash` works (no network needed); ~5 min on
# an H200. Arguments go to gpu_check.py; a later --json wins:
#   bash benchmarks/gpu_check.sh                          -> benchmarks/gpu_check.json
#   bash benchmarks/gpu_check.sh --quick --json "$OUT/gpu_check.json"
set -euo pipefail
cd "$(dirname "$0")/.."
python -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name(0))"
python benchmarks/gpu_check.py --device cuda --json benchmarks/gpu_check.json "$@"
