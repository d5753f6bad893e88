# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""GPU checks for hf-dflash: correctness in fp32 and bf16 on CUDA, and timings of chain, tree and default policy.

A Qwen3-8B-shaped target with random weights (no download: the device has no internet) and a 5-layer block-16
drafter sized for it. Random weights give random drafts, so acceptance comes from a scripted oracle drafter that
proposes the target's own continuation with a chosen per-draft acceptance rate; speed is measured side by side with
plain generate in one process, with CUDA events, and projected to the published acceptance lengths.

    python benchmarks/gpu_check.py --json gpu_check.json            # on a CUDA machine (benchmarks/gpu_check.sh)
    python benchmarks/gpu_check.py --tiny --device cpu               # a smoke run of the script itself

Checks (exit code 1 if any fails): greedy output identical to plain generate in fp32 (must) for chain, tree and
default policy; bf16 identical or the first difference reported (near-ties may break differently, README);
DFlashStats times are synchronised (their sum is within 10% of the CUDA-event wall time).

Long context (bf16, ``--context-lengths``): plain generate, full blocks and the default policy after prompts of 512 to
32K tokens, at the published chain acceptance: speedup, the drafter's and the target's milliseconds per cycle (the
drafter's grow with the context it attends to), and peak ``torch.cuda.max_memory_allocated`` of each, ours against
plain's; ``fp32`` outputs must be identical at every length, bf16 differences are reported.
"""

import argparse
import contextlib
import json
import random
import sys
import time

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

import hf_dflash
from hf_dflash.candidates_dflash import DFlashCandidateGenerator
from hf_dflash.evaluation.machine import load_average, run_stamp


QWEN3_8B = dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                num_key_value_heads=8, head_dim=128, vocab_size=151936)
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, vocab_size=512)
# Published tau (Qwen3-8B, DFlash b16, MATH-500 / HumanEval, DFLASH.md) -> a per-draft acceptance rate a with
# tau = (1 - a^16) / (1 - a).
PUBLISHED_TAU = {"dflash_chain": 7.79, "ddtree_tree": 10.73}


def rate_for_tau(tau: float, block: int = 16) -> float:
    low, high = 0.0, 0.9999
    for _ in range(60):
        mid = (low + high) / 2
        if (1 - mid**block) / (1 - mid) < tau:
            low = mid
        else:
            high = mid
    return low


@contextlib.contextmanager
def oracle_drafts(continuation: list[int], rate: float, seed: int = 0):
    """The drafter proposes the reference continuation; each draft stays right with probability `rate` (else
    a wrong token), so acceptance is controlled while the drafter still runs its forward."""
    original = DFlashCandidateGenerator.propose
    rng = random.Random(seed)
    state = {"start": None}

    def propose(self, histories, context, context_positions, anchor_positions, slot_mask=None, num_drafts=None):
        drafts, scores = original(self, histories, context, context_positions, anchor_positions, slot_mask,
                                  num_drafts)
        if state["start"] is None:
            state["start"] = len(histories[0]) - 1
        drafts = drafts.clone()
        done = len(histories[0]) - state["start"]
        for j in range(drafts.shape[1]):
            if done + j < len(continuation):
                drafts[0, j] = continuation[done + j]
            if rng.random() > rate:
                drafts[0, j] = (int(drafts[0, j]) + 1) % scores.shape[-1]
        mass = torch.full_like(scores, float("-inf"))
        mass.scatter_(2, drafts[..., None], 0.0)
        return drafts, mass

    DFlashCandidateGenerator.propose = propose
    try:
        yield
    finally:
        DFlashCandidateGenerator.propose = original


def timed(fn, device):
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = fn()
        end.record()
        torch.cuda.synchronize(device)
        return out, start.elapsed_time(end) / 1e3
    begin = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - begin


def peak_memory(fn, device):
    """(result, seconds, peak bytes allocated during `fn`; None on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    out, seconds = timed(fn, device)
    return out, seconds, torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None


def long_context_rows(target, drafter, lengths: list[int], new_tokens: int, device) -> dict:
    """Plain, full blocks and the default policy after prompts of each length, at the published chain acceptance:
    speed, per-cycle times and peak memory, ours against plain's."""
    rows = {}
    rate = rate_for_tau(PUBLISHED_TAU["dflash_chain"])
    vocab = target.config.vocab_size
    for length in lengths:
        ids = torch.randint(0, vocab, (1, length), device=device, generator=torch.Generator(device=device).manual_seed(2))
        settings = dict(max_new_tokens=new_tokens, do_sample=False)
        plain, plain_s, plain_peak = peak_memory(lambda: target.generate(ids, **settings), device)
        continuation = plain[0, length:].tolist()
        row = {"plain": {"seconds": plain_s, "peak_bytes": plain_peak}}
        for method, extra in {"chain": {"dflash_policy": "full"}, "default": {}}.items():
            with oracle_drafts(continuation, rate):
                out, seconds, peak = peak_memory(
                    lambda: target.generate(ids, assistant_model=drafter, **settings, **extra), device)
            stats = drafter.last_stats
            cycles = max(1, stats.num_verifications)
            row[method] = {
                "seconds": seconds, "speedup": plain_s / seconds, "tau": stats.mean_acceptance_length,
                "identical": out[0, length:].tolist() == continuation, "peak_bytes": peak,
                "peak_over_plain": peak / plain_peak if peak and plain_peak else None,
                "draft_ms_per_cycle": 1e3 * stats.draft_seconds / cycles,
                "verify_ms_per_cycle": 1e3 * stats.verify_seconds / cycles,
            }
        rows[str(length)] = row
        print(f"long context {length}: " + json.dumps(row), flush=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="a tiny target (smoke run of the script)")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--prompt-length", type=int, default=512)
    parser.add_argument("--tree-budget", type=int, default=32)
    parser.add_argument("--context-lengths", default="512,8192,32768",
                        help="prompt lengths of the long-context case (bf16), comma list; empty to skip")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    device = torch.device(args.device)
    shape = TINY if args.tiny else QWEN3_8B
    load_before = load_average()
    report = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", "shape": shape,
              "checks": {}, "timings": {}}
    ok = True
    for dtype in (torch.float32, torch.bfloat16):
        torch.manual_seed(0)
        config = Qwen3Config(**shape, max_position_embeddings=40960, tie_word_embeddings=False)
        with torch.device(device):
            target = Qwen3ForCausalLM(config).to(dtype).eval().requires_grad_(False)
        drafter = hf_dflash.DFlashDraftModel.from_target(target, num_hidden_layers=1 if args.tiny else 5,
                                                        block_size=16).to(device, dtype).eval()
        ids = torch.randint(0, shape["vocab_size"], (1, args.prompt_length), device=device,
                            generator=torch.Generator(device=device).manual_seed(1))
        settings = dict(max_new_tokens=args.max_new_tokens, do_sample=False)
        target.generate(ids, max_new_tokens=4)  # warm-up
        plain, plain_s = timed(lambda: target.generate(ids, **settings), device)
        continuation = plain[0, ids.shape[1] :].tolist()
        name = str(dtype).removeprefix("torch.")
        report["timings"][f"{name}/plain"] = {"seconds": plain_s, "tokens_per_s": len(continuation) / plain_s}
        methods = {"chain": {"dflash_policy": "full"}, "tree": {"dflash_tree_budget": args.tree_budget},
                   "default": {}}
        for label, rate in (("published_chain", rate_for_tau(PUBLISHED_TAU["dflash_chain"])),
                            ("published_tree", rate_for_tau(PUBLISHED_TAU["ddtree_tree"]))):
            for method, extra in methods.items():
                with oracle_drafts(continuation, rate):
                    try:
                        out, seconds = timed(lambda: target.generate(ids, assistant_model=drafter, **settings,
                                                                     **extra), device)
                    except (TypeError, ValueError) as error:  # e.g. trees not available in this build
                        report["timings"][f"{name}/{label}/{method}"] = {"error": str(error)}
                        continue
                stats = drafter.last_stats
                got = out[0, ids.shape[1] :].tolist()
                first_diff = next((i for i, (a, b) in enumerate(zip(got, continuation)) if a != b), None)
                identical = got == continuation
                key = f"{name}/{label}/{method}"
                report["checks"][key] = {"identical": identical, "first_difference": first_diff}
                timed_sum = stats.prefill_seconds + stats.draft_seconds + stats.verify_seconds
                report["timings"][key] = {
                    "seconds": seconds, "speedup": plain_s / seconds, "tau": stats.mean_acceptance_length,
                    "acceptance_rate_per_draft": rate, "stats_seconds_vs_events": timed_sum / seconds,
                    "draft_ms_per_cycle": 1e3 * stats.draft_seconds / max(1, stats.num_verifications),
                    "verify_ms_per_cycle": 1e3 * stats.verify_seconds / max(1, stats.num_verifications),
                }
                if dtype == torch.float32 and not identical:
                    ok = False
                if device.type == "cuda" and not 0.6 <= timed_sum / seconds <= 1.1:
                    ok = False
        if dtype == torch.bfloat16 and args.context_lengths:
            lengths = [int(n) for n in args.context_lengths.split(",") if n]
            report["long_context"] = long_context_rows(target, drafter, lengths, min(args.max_new_tokens, 128), device)
        target = drafter = None  # free the memory before the next dtype
        if device.type == "cuda":
            torch.cuda.empty_cache()
    report["ok"] = ok
    report["machine"] = run_stamp(device, load_before)
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
