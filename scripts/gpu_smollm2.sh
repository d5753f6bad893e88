#!/usr/bin/env bash
# The real model on a lent GPU: SmolLM2-135M-Instruct with the shipped drafter on CUDA, as a user runs it. Called by
# scripts/gpu_run.sh once scripts/gpu_carry.sh has brought the SmolLM2 and evaluation wheels (their parts travel
# over earlier calls); runs alone too:
#
#   OUT=... bash scripts/gpu_smollm2.sh [SECONDS]      # default 240 s; writes $OUT/smollm2.json and $OUT/smollm2.log
#   OUT=... GPU_SMOLLM2_DEVICE=cpu bash scripts/gpu_smollm2.sh 150     # a smoke run of the plumbing on a CPU machine
#
# 1. `hf-dflash demo --device cuda` with hub kernels left to transformers' default (the offline load must work);
# 2. chain tau on the 11 prompts of benchmarks/heldout_generate_tau.py, fp32 and bf16 (CPU: training_info.json);
# 3. `hf-dflash bench --device cuda` on HumanEval, GSM8K and MT-Bench (2 prompts each, 64 tokens), fp32 and bf16:
#    plain, prompt lookup, transformers' built-in DFlash, full blocks and the default policy, identity checked.
# Every step runs whatever the earlier ones did; smollm2.json holds each one's exit code and result.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:?set OUT to the folder the results go to}"
BUDGET="${1:-240}"
START=$(date +%s)
PYTHON="${PYTHON:-python3}"
SCRATCH="$(mktemp -d)"
LOG="$OUT/smollm2.log"
left() { echo $((BUDGET - ($(date +%s) - START))); }
step() {  # step NAME SECONDS COMMAND...: runs it under a timeout, logs it, records its exit code
  local name=$1 seconds=$2; shift 2
  if ((seconds <= 10)); then
    echo "$name: skipped (no time left)" | tee -a "$LOG"; echo skipped > "$SCRATCH/$name.rc"; return
  fi
  echo "== $name ($seconds s): $*" | tee -a "$LOG"
  timeout "$seconds" "$@" >> "$LOG" 2>&1
  echo $? > "$SCRATCH/$name.rc"
}

DEVICE="${GPU_SMOLLM2_DEVICE:-cuda}"  # cpu: a smoke run of this script on a CPU machine
BENCH=(--device "$DEVICE" --datasets humaneval,gsm8k,mtbench --limit 2 --max-new-tokens 64 --repeats 2
       --methods plain,pld,builtin_dflash,dflash,dflash_default)
# the demo as a user types it: no USE_HUB_KERNELS, so hf-dflash's own loads must keep hub kernels off
step demo $(($(left) / 6)) env -u USE_HUB_KERNELS "$PYTHON" -m hf_dflash demo --device "$DEVICE" --max-new-tokens 32
for dtype in float32 bfloat16; do
  step "tau_$dtype" $(($(left) / 4)) "$PYTHON" benchmarks/heldout_generate_tau.py hf_dflash/assets/smollm2-dflash \
    --device "$DEVICE" --dtype "$dtype" --json "$SCRATCH/tau_$dtype.json"
done
for dtype in float32 bfloat16; do
  [[ $dtype == float32 ]] && share=2 || share=1
  step "bench_$dtype" $(($(left) / share)) "$PYTHON" -m hf_dflash bench "${BENCH[@]}" --dtype "$dtype" \
    --json "$SCRATCH/bench_$dtype.json"
done

"$PYTHON" - "$SCRATCH" "$OUT/smollm2.json" <<'EOF'
import json, pathlib, sys
scratch, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
shipped = json.loads(pathlib.Path("hf_dflash/assets/smollm2-dflash/training_info.json").read_text())
report = {"cpu_tau_fp32": shipped["tau"], "steps": {}}  # the shipped drafter's one tau, on the same 11 prompts
for rc in sorted(scratch.glob("*.rc")):
    name = rc.stem
    result = scratch / f"{name}.json"
    report["steps"][name] = {"exit_code": rc.read_text().strip(),
                             "result": json.loads(result.read_text()) if result.exists() else None}
out.write_text(json.dumps(report, indent=2) + "\n")
print(json.dumps({name: step["exit_code"] for name, step in report["steps"].items()}))
EOF
rm -rf "$SCRATCH"
