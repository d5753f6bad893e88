# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""Captured forwards on a CPU (``dflash_compile=True``, inductor): do they pay end to end?

SmolLM2-135M-Instruct (fp32) and the shipped drafter, the demo's three prompts (chat, code edit, document question),
greedy; four methods side by side: plain ``generate`` eager, plain on a static cache compiled as transformers does it
(``compile_config`` with ``_compile_all_devices``), ours eager (the default policy) and ours captured. One warm-up pass
per method compiles what it compiles (its seconds are printed apart); then `--repeats` interleaved passes, the least
time per prompt and method counts. Prints a markdown table: tokens per second, the ratio to plain eager and to plain
compiled, tau, ours' drafter milliseconds per drafter run and target milliseconds per cycle (the split of a cycle:
does capturing pay for the drafter, the verify, neither?), and whether every output equals plain eager's.

    python benchmarks/captured_cpu.py --threads 1
    python benchmarks/captured_cpu.py --threads 2 --max-new-tokens 128
"""

import argparse
import time

import torch
from transformers import CompileConfig

from hf_dflash.data.chat import chat_input_ids
from hf_dflash.evaluation.demo import default_prompts
from hf_dflash.models import load_drafter, load_target
from hf_dflash.stats_dflash import DFlashStats

METHODS = ("plain eager", "plain compiled", "ours eager", "ours captured")


def compile_everywhere() -> CompileConfig:
    """transformers' default compile settings, on a CPU too (it compiles plain decoding on accelerators only)."""
    config = CompileConfig()
    config._compile_all_devices = True
    return config


def method_kwargs(method: str, drafter) -> dict:
    """generate() keyword arguments of one method."""
    return {
        "plain eager": {},
        "plain compiled": {"cache_implementation": "static", "compile_config": compile_everywhere()},
        "ours eager": {"assistant_model": drafter},
        "ours captured": {"assistant_model": drafter, "dflash_compile": True},
    }[method]


def timed(target, drafter, ids, method: str, max_new_tokens: int) -> tuple[float, list[int], DFlashStats | None]:
    """(seconds, new tokens, ours' DFlashStats of the call or None)."""
    start = time.perf_counter()
    with torch.inference_mode():
        out = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                              do_sample=False, **method_kwargs(method, drafter))
    seconds = time.perf_counter() - start
    return seconds, out[0, ids.shape[1]:].tolist(), drafter.last_stats if method.startswith("ours") else None


def cycle_split(calls: list[DFlashStats]) -> tuple[float, float]:
    """(drafter ms per drafter run, target ms per cycle: verify or plain step) over ours' timed calls; a graph compiled
    inside the timed passes counts in its forward's share (the header prints those seconds apart)."""
    drafter_runs = sum(s.drafted_verifications for s in calls)
    cycles = sum(s.num_verifications for s in calls)
    target_seconds = sum(s.verify_seconds for s in calls)
    return 1e3 * sum(s.draft_seconds for s in calls) / max(drafter_runs, 1), 1e3 * target_seconds / max(cycles, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target, tokenizer = load_target(None, device="cpu", dtype=torch.float32)
    drafter = load_drafter(None, target)
    prompts = [chat_input_ids(tokenizer, prompt) for _, prompt in default_prompts()]
    warmup = {}
    for method in METHODS:  # compiles happen here, timed apart
        start = time.perf_counter()
        for ids in prompts:
            timed(target, drafter, ids, method, args.max_new_tokens)
        warmup[method] = time.perf_counter() - start
    best = {m: [float("inf")] * len(prompts) for m in METHODS}
    tokens, calls = {}, {m: [] for m in METHODS}
    for _ in range(args.repeats):
        for i, ids in enumerate(prompts):
            for method in METHODS:
                seconds, new, stats = timed(target, drafter, ids, method, args.max_new_tokens)
                best[method][i] = min(best[method][i], seconds)
                tokens[method, i] = new
                if stats is not None:
                    calls[method].append(stats)
    report(args, prompts, best, tokens, calls, warmup)


def report(args, prompts, best, tokens, calls, warmup) -> None:
    total_new = sum(len(tokens["plain eager", i]) for i in range(len(prompts)))
    rate = {m: total_new / sum(best[m]) for m in METHODS}
    recompiles = sum(s.compile_seconds for m in METHODS for s in calls[m])
    print(f"SmolLM2-135M fp32 + shipped drafter, {len(prompts)} demo prompts x {args.max_new_tokens} new tokens, "
          f"{args.threads} thread(s), best of {args.repeats}; compile seconds after warm-up: {recompiles:.1f}\n")
    print("| method | tokens/s | vs plain eager | vs plain compiled | tau | drafter ms/run | target ms/cycle "
          "| warm-up pass s | same tokens |")
    print("|---|---|---|---|---|---|---|---|---|")
    for m in METHODS:
        same = all(tokens[m, i] == tokens["plain eager", i] for i in range(len(prompts)))
        tau = f"{sum(s.mean_acceptance_length for s in calls[m]) / len(calls[m]):.2f}" if calls[m] else "-"
        split = " | ".join(f"{ms:.1f}" for ms in cycle_split(calls[m])) if calls[m] else "- | -"
        print(f"| {m} | {rate[m]:.1f} | {rate[m] / rate['plain eager']:.2f}x | {rate[m] / rate['plain compiled']:.2f}x "
              f"| {tau} | {split} | {warmup[m]:.0f} | {'yes' if same else 'NO'} |")


if __name__ == "__main__":
    main()
