#!/usr/bin/env bash
# Downloads into .whl/ (gitignored) the wheels a GPU run carries: the lent GPU machine has no network and its image
# has Python 3.12, torch 2.11, transformers 5.17 and huggingface_hub 1.33, so transformers 5.25 and what it newly
# needs there travel as wheels (docs/development.md, "GPU runs"). scripts/gpu_run.sh installs them on the GPU.
#   bash scripts/gpu_wheels.sh            # -> .whl/*.whl, then their total size
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS="${WHEELS:-.whl}"
mkdir -p "$WHEELS"
# one version of each (two versions of one package stop the whole install there)
PACKAGES=(
  transformers==5.25.0 huggingface-hub==2.4.0 kernels==0.19.1 httpx2==2.16.2 httpcore2==2.16.2 truststore
  "click>=8.4.2" tomlkit "idna>=3.18" "anyio>=4.10" "regex>=2025.10.22" hf-xet==1.8.0 gguf==0.19.0
)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$WHEELS" "${PACKAGES[@]}"
ls -1 "$WHEELS"
du -cb "$WHEELS"/*.whl | tail -1 | awk '{printf "total: %.1f MB\n", $1 / 1e6}'
