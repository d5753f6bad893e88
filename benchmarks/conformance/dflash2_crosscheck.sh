#!/usr/bin/env bash
# Cross-implementation check of DFlash2: hf-dflash against vLLM 0.32's own DFlash2 code on a tiny random
# drafter (logits, candidates, selector scores, drafted paths, sampled-path law and q). Run from anywhere in a clone
# whose Python environment has hf-dflash installed (`pip install -e .`):
#
#   bash benchmarks/conformance/dflash2_crosscheck.sh    # Markdown on stdout (~6 min here),
#                                   JSON in benchmarks/results/<today>-dflash2-crosscheck/
#
# vLLM pins an older transformers than hf-dflash, so it runs in its own venv: $VLLM_VENV when set, else the one
# benchmarks/conformance/vllm_check.sh creates ($HF_DFLASH_CACHE/vllm-venv, made on first use there).
# PYTHON (default: the repository's .venv/bin/python when it exists, else python3) is hf-dflash's side; OMP_NUM_THREADS defaults to 1.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
if [[ -n "${VLLM_VENV:-}" ]]; then
  VENV="$VLLM_VENV"
else
  VENV="$(bash benchmarks/conformance/vllm_check.sh --print-venv || true)"
  if [[ ! -x "$VENV/bin/python" ]]; then
    echo "[dflash2_crosscheck] no vLLM venv: run 'bash benchmarks/conformance/vllm_check.sh --tiny' once to create it" >&2
    exit 2
  fi
fi
exec "$PYTHON" benchmarks/conformance/dflash2_crosscheck.py --vllm-python "$VENV/bin/python" "$@"
