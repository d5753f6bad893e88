# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""What a long prompt costs: the target's verify time by width t(k)/t(1) and the drafter's time per cycle against
the cached context, and peak memory (RSS) of plain generate against generate with the drafter.

Costs (one process): for each context length the target prefills a document prompt cut to that many tokens, then a
verify of k rows is timed on that cache (median of `--repeats`, the cache cut back after each), with the key/value
heads grouped as the DFlash loop runs it on CPU (``t_k_over_t1``), the same with the few-row matrix kernel DFlash calls
use on a CPU when they opt in (``t_k_over_t1_few_row_kernel``, over torch's one-row time: hf_dflash/kernels_cpu.py)
and as transformers' SDPA does for masked forwards (``t_k_over_t1_transformers_sdpa``: every cached key and value
copied per query head); one full-block DFlash generate reads the drafter's time per cycle from
``drafter.last_stats``.

Memory (one fresh process per case, so that each peak is its own): peak RSS after loading the models, and after
``generate`` with and without the drafter, and the call's peak tensor memory counted to the byte
(:class:`~hf_dflash.evaluation.memory.PeakTensorMemory`: the tensors themselves, without the allocator's arenas);
the drafter's own context cache (its K/V of the target features) is
estimated from its config.

    python benchmarks/long_context_costs.py --threads 1 --json costs.json
    python benchmarks/long_context_costs.py --threads 1 --memory --json memory.json

Writes JSON with the run's stamp (:func:`hf_dflash.evaluation.machine.run_stamp`).
"""

import argparse
import contextlib
import json
import resource
import statistics
import subprocess
import sys

import torch
from transformers import DynamicCache

from hf_dflash.cache_dflash import cache_argument
from hf_dflash.data.chat import chat_input_ids
from hf_dflash.evaluation.machine import load_average, run_stamp
from hf_dflash.evaluation.memory import PeakTensorMemory
from hf_dflash.generation_dflash import grouped_query_attention
from hf_dflash.evaluation.prompts import load_eval_prompts
from hf_dflash.kernels_cpu import few_row_kernels
from hf_dflash.models import load_drafter, load_target
from hf_dflash.timing_dflash import synchronized_clock

CONTEXTS = {"context_512": 512, "context_2k": 2048, "context_4k": 4096, "context_8k": 7934}
WIDTHS = tuple(range(1, 17))  # every width a block of 16 can verify (the GEMM kernel changes along the way)


def short_prompt_ids(tokenizer) -> torch.Tensor:
    return chat_input_ids(tokenizer, load_eval_prompts("gsm8k", 1)[0])


def context_ids(tokenizer, dataset: str) -> torch.Tensor:
    return short_prompt_ids(tokenizer) if dataset == "short" else chat_input_ids(
        tokenizer, load_eval_prompts(dataset, 1, tokenizer)[0])


def verify_seconds(target, ids: torch.Tensor, widths, repeats: int, ways: dict) -> dict[str, dict[int, float]]:
    """{way: {k: median seconds of a k-row forward on a cache holding `ids`}} for each of `ways` (name -> a context
    factory the forward runs in): one prefill, each verify cut back after it, ways and widths interleaved round by
    round (a load spike hits them alike)."""
    cache = DynamicCache(config=target.config)
    kwargs = {cache_argument(target): cache, "use_cache": True}
    times = {way: {k: [] for k in widths} for way in ways}
    with torch.inference_mode():
        target(ids, **kwargs)
        for _ in range(repeats):
            for way, context in ways.items():
                with context():
                    for k in widths:
                        start = synchronized_clock(ids.device)
                        target(ids[:, -k:], **kwargs)
                        times[way][k].append(synchronized_clock(ids.device) - start)
                        cache.crop(-k)
    return {way: {k: statistics.median(t) for k, t in by_width.items()} for way, by_width in times.items()}


@contextlib.contextmanager
def as_dflash_runs_it(target, kernel: bool):
    """The context a DFlash call's target forwards run in on a CPU: grouped key/value heads, and the few-row matrix
    kernel unless `kernel` is False."""
    with grouped_query_attention("cpu"), few_row_kernels(target) if kernel else contextlib.nullcontext():
        yield


def drafter_seconds_per_cycle(target, drafter, ids: torch.Tensor, new_tokens: int = 48) -> dict:
    """One full-block DFlash generate: the drafter's and the target's seconds per cycle, and tau."""
    with torch.inference_mode():
        target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, do_sample=False,
                        assistant_model=drafter, dflash_policy="full")
    stats = drafter.last_stats
    cycles = max(1, stats.num_verifications)
    return {"draft_ms": 1e3 * stats.draft_seconds / cycles, "verify_ms": 1e3 * stats.verify_seconds / cycles,
            "tau": stats.mean_acceptance_length, "cycles": stats.num_verifications}


def measure_costs(args) -> dict:
    target, tokenizer = load_target(dtype="float32", device="cpu")
    drafter = load_drafter(None, target)
    rows = {}
    for dataset in ["short", *args.contexts]:
        ids = context_ids(tokenizer, dataset)
        seconds = verify_seconds(target, ids, WIDTHS, args.repeats, {
            "transformers_sdpa": contextlib.nullcontext,
            "grouped": lambda: as_dflash_runs_it(target, kernel=False),
            "kernel": lambda: as_dflash_runs_it(target, kernel=True),
        })
        grouped, plain_sdpa, kernel = seconds["grouped"], seconds["transformers_sdpa"], seconds["kernel"]
        rows[dataset] = {
            "prompt_tokens": ids.shape[1],
            "t1_ms": 1e3 * grouped[1],
            "t_k_over_t1": {k: round(grouped[k] / grouped[1], 3) for k in WIDTHS},
            "t_k_over_t1_transformers_sdpa": {k: round(plain_sdpa[k] / plain_sdpa[1], 3) for k in WIDTHS},
            # the few-row kernel's k rows over torch's one row (a plain step)
            "t_k_over_t1_few_row_kernel": {k: round(kernel[k] / grouped[1], 3) for k in WIDTHS},
            **drafter_seconds_per_cycle(target, drafter, ids),
        }
        print(dataset, json.dumps(rows[dataset]), flush=True)
    return rows


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def memory_case(dataset: str, method: str, new_tokens: int) -> dict:
    """Run in a fresh process: peak RSS after loading, then after one generate of `method`."""
    target, tokenizer = load_target(dtype="float32", device="cpu")
    drafter = load_drafter(None, target)
    ids = context_ids(tokenizer, dataset)
    loaded = peak_rss_mib()
    extra = {} if method == "plain" else {"assistant_model": drafter}
    with torch.inference_mode(), PeakTensorMemory() as tensors:
        target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, do_sample=False,
                        **extra)
    config = drafter.config
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    drafter_cache_mib = 2 * config.num_hidden_layers * kv_heads * head_dim * (ids.shape[1] + new_tokens) * 4 / 2**20
    return {"prompt_tokens": ids.shape[1], "loaded_mib": loaded, "peak_mib": peak_rss_mib(),
            "tensor_peak_mib": tensors.peak_bytes / 2**20,
            "drafter_context_cache_mib": drafter_cache_mib}


def measure_memory(args) -> dict:
    rows = {}
    for dataset in [d for d in CONTEXTS if d != "context_512"]:
        for method in ("plain", "dflash_default"):
            command = [sys.executable, __file__, "--memory-case", dataset, method, "--threads", str(args.threads),
                       "--new-tokens", str(args.new_tokens)]
            out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
            rows.setdefault(dataset, {})[method] = json.loads(out.strip().splitlines()[-1])
            print(dataset, method, rows[dataset][method], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--memory", action="store_true", help="peak RSS per case (fresh processes) instead of costs")
    parser.add_argument("--memory-case", nargs=2, metavar=("DATASET", "METHOD"), help=argparse.SUPPRESS)
    parser.add_argument("--contexts", default=",".join(CONTEXTS), type=lambda v: [c for c in v.split(",") if c],
                        help=f"context datasets after the short prompt (comma list of {','.join(CONTEXTS)})")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.memory_case:
        print(json.dumps(memory_case(*args.memory_case, args.new_tokens)))
        return
    before = load_average()
    rows = measure_memory(args) if args.memory else measure_costs(args)
    report = {"machine": run_stamp("cpu", before), "threads": args.threads, "rows": rows}
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
