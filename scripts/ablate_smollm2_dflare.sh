#!/usr/bin/env bash
# DFlash vs DFlare vs each DFlare component alone, on the SmolLM2-135M-Instruct setup, with EQUAL data and steps.
#
#   scripts/ablate_smollm2_dflare.sh            # after scripts/train_smollm2_drafter.sh built the regenerated data
#   VARIANTS="dflash dflare" scripts/ablate_smollm2_dflare.sh
#   CONTINUE=1 scripts/ablate_smollm2_dflare.sh   # as in docs/benchmarks/history/2026-11-29-dflare-ablation.md (+ DFlash/DFlare trained further)
#
# Every variant trains from the same seed on the same samples (the first $SAMPLES regenerated ones), for the same
# epochs (hence the same optimizer steps and anchors), with the same drafter depth and target layers; only the
# switches differ:
#   dflash       fc fusion, shared K/V projections, constant gamma           (the DFlash paper)
#   fusion       + layer-wise softmax fusion of the target layers instead of fc
#   split_kv     + separate K/V projections for context tokens
#   progressive  + progressive gamma (per epoch, gamma-2.5 -> +1 per epoch)
#   dflare       all three                                                    (the DFlare paper)
# Then each drafter is measured by `hf-dflash bench` against plain generate, side by side in one process
# (greedy, --threads 1). Results: $ABLATION/<variant>/eval.json and $ABLATION/bench-<variant>.json; the table in
# docs/benchmarks/history/2026-11-29-dflare-ablation.md was filled from them.
set -euo pipefail

source "$(dirname "$0")/common.sh"
ABLATION="$TRAIN/ablation"

SAMPLES="${SAMPLES:-240}"
EPOCHS="${EPOCHS:-2}"
LAYERS="${LAYERS:-2}"
VARIANTS="${VARIANTS:-dflash fusion split_kv progressive dflare}"
DATA="$TRAIN/smollm2_ablation.jsonl"
FEATURES="$TRAIN/smollm2-features-ablation"

if [[ ! -s "$DATA" ]]; then
  head -n "$SAMPLES" "$TRAIN/smollm2_regen.jsonl" > "$DATA.tmp" && mv "$DATA.tmp" "$DATA"
fi
mkdir -p "$ABLATION"

switches() {
  case "$1" in
    dflash) echo "--variant dflash" ;;
    fusion) echo "--variant dflash --layer-fusion --gamma-schedule constant" ;;
    split_kv) echo "--variant dflash --split-context-kv --gamma-schedule constant" ;;
    progressive) echo "--variant dflash --gamma-schedule per-epoch" ;;
    dflare) echo "--variant dflare" ;;
    *) echo "unknown variant $1" >&2; exit 2 ;;
  esac
}

train_and_bench() {  # train_and_bench OUTPUT_NAME SWITCHES... : train (resumable) then bench one drafter
  local name="$1"; shift
  local out="$ABLATION/$name"
  if [[ ! -f "$out/eval.json" ]]; then
    local resume=()
    [[ -d "$out/checkpoints" ]] && resume=(--resume)
    $HF_DFLASH train --target smollm2 --data "$DATA" --output "$out" "$@" \
      --num-layers "$LAYERS" --block-size 16 --target-layer-ids 1,8,15,22,27 --position-weighting fixed \
      --epochs "$EPOCHS" --lr 6e-4 --num-anchors 32 --max-length 512 --batch-size 1 \
      --feature-cache "$FEATURES" --num-eval-prompts 8 --eval-max-new-tokens 96 \
      --save-every 200 --logging-steps 50 --seed 0 "${resume[@]}"
  fi
  if [[ ! -f "$ABLATION/bench-$name.json" ]]; then
    $HF_DFLASH bench --drafter "$out" --threads 1 --methods plain,dflash --limit 1 --max-new-tokens 64 \
      --json "$ABLATION/bench-$name.json"
  fi
}

for variant in $VARIANTS; do
  # shellcheck disable=SC2046
  train_and_bench "$variant" $(switches "$variant")
done

# CONTINUE=1: DFlash and DFlare trained for the same epochs again from their weights (fresh optimizer and
# schedule), to see whether the gap persists with twice the steps.
if [[ "${CONTINUE:-0}" == 1 ]]; then
  for variant in dflash dflare; do
    # shellcheck disable=SC2046
    train_and_bench "$variant-continued" $(switches "$variant") --init-drafter "$ABLATION/$variant"
  done
fi
