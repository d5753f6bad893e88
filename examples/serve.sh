#!/usr/bin/env bash
# Serve a target with a DFlash drafter (ours or z-lab's) in vLLM or SGLang: both read the checkpoint layout that
# hf-dflash writes (config.json with dflash_config, z-lab weight names). Needs a GPU and the engine installed.
#   bash examples/serve.sh vllm  Qwen/Qwen3-8B me/my-drafter 16
#   bash examples/serve.sh sglang Qwen/Qwen3-8B me/my-drafter 16
set -euo pipefail
engine=${1:?vllm or sglang}; target=${2:?target}; drafter=${3:?drafter}; block=${4:-16}

case "$engine" in
  vllm)
    # num_speculative_tokens = block_size - 1. vLLM 0.32 serves DFlash (and, on GPUs, DFlash2) drafters with
    # "method": "dflash"; it has no DFlare architecture and refuses DFlare drafters at load (docs/serving.md)
    vllm serve "$target" --speculative-config \
      "{\"method\": \"dflash\", \"model\": \"$drafter\", \"num_speculative_tokens\": $((block - 1))}"
    ;;
  sglang)
    python -m sglang.launch_server --model-path "$target" \
      --speculative-algorithm DFLASH --speculative-draft-model-path "$drafter"
    ;;
  *) echo "unknown engine: $engine (vllm or sglang)" >&2; exit 2 ;;
esac
