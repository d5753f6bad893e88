# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""``hf-dflash bench``: DFlash against plain decoding and the other lossless accelerators, side by side.

Methods (all greedy, same ``max_new_tokens``, run interleaved per prompt in one process so that a busy machine
slows them alike; the order rotates from prompt to prompt):

- ``plain``: ``target.generate(ids)``, the reference every other output must equal token for token;
- ``pld``: prompt lookup decoding (``prompt_lookup_num_tokens=10``);
- ``early_exit``: transformers' self-speculation (``assistant_early_exit=N``, N ~ a third of the depth);
- ``builtin_dflash``: transformers' own DFlash generator driving our drafter
  (``with hf_dflash.builtin_generation(): generate(..., assistant_model=drafter, speculation_type="dflash")``);
- ``dflash``: this package's DFlash loop (``generate(..., assistant_model=drafter)``);
- ``dflash_heuristic``: the same loop verifying an adaptive number of drafts per cycle
  (``num_assistant_tokens_schedule="heuristic"``: +2 after a fully accepted block, -1 otherwise).

Reported per dataset and overall: tau (tokens per target forward: ``drafter.last_stats`` for ours, counted target
forwards for the others), acceptance by block position, tokens/s, speedup vs plain (median of per-prompt ratios),
the per-cycle costs t(draft), t(verify), t(1) (plain per-token time) and the ceiling
``tau * t(1) / (t(verify) + t(draft))`` that no implementation of the loop can beat on this machine.

Example:
    $ hf-dflash bench --datasets gsm8k,humaneval --limit 5 --max-new-tokens 128 --json bench.json --plot bench.png
"""

import argparse
import contextlib
import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers.utils import logging

from .generation_dflash import DFlashStats, builtin_generation
from .prompts import DATASET_LICENSES, DATASETS, chat_input_ids, load_eval_prompts
from .targets import add_model_arguments, load_models_from_args


logger = logging.get_logger(__name__)

METHODS: tuple[str, ...] = ("plain", "pld", "early_exit", "builtin_dflash", "dflash", "dflash_heuristic")
METHOD_LABELS = {
    "plain": "plain generate",
    "pld": "prompt lookup (10)",
    "early_exit": "early exit",
    "builtin_dflash": "transformers DFlash",
    "dflash": "hf-dflash (ours)",
    "dflash_heuristic": "hf-dflash, heuristic draft length",
}
PROMPT_LOOKUP_TOKENS = 10


# ----------------------------------------------------------------------------------------------------------------------
# running one method on one prompt
@dataclass
class Run:
    """One ``generate`` call: the new tokens, wall-clock seconds, target forwards and (ours) the drafter stats."""

    new_tokens: list[int]
    seconds: float
    target_forwards: int
    stats: DFlashStats | None = None

    @property
    def tokens_per_second(self) -> float:
        return len(self.new_tokens) / self.seconds if self.seconds > 0 else 0.0


class ForwardCounter:
    """Counts forward calls of a module (the target's verification passes, prefill included).

    Example:
        >>> counter = ForwardCounter(target)  # doctest: +SKIP
        >>> counter.reset(); target.generate(ids, max_new_tokens=8); counter.calls  # doctest: +SKIP
        8
    """

    def __init__(self, module: torch.nn.Module):
        self.calls = 0
        self.handle = module.register_forward_hook(self._count)

    def _count(self, *args) -> None:
        self.calls += 1

    def reset(self) -> None:
        self.calls = 0

    def remove(self) -> None:
        self.handle.remove()


def first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first new token where two outputs differ (a shorter output differs where it ends), else None.

    Example:
        >>> first_difference([1, 2, 3], [1, 5, 3]), first_difference([1, 2], [1, 2, 3]), first_difference([1], [1])
        (1, 2, None)
    """
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def synchronize(device: torch.device) -> None:
    """Wait for queued device work, so wall-clock times cover it (no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def default_early_exit_layer(target) -> int:
    """The early-exit depth used for the ``early_exit`` method: a third of the target's layers (at least 1).

    Example:
        >>> default_early_exit_layer(target)  # SmolLM2: 30 layers  # doctest: +SKIP
        10
    """
    return max(1, target.config.get_text_config().num_hidden_layers // 3)


def method_kwargs(method: str, drafter=None, early_exit_layer: int | None = None) -> dict:
    """Extra ``generate`` arguments of a method.

    Example:
        >>> method_kwargs("pld")
        {'prompt_lookup_num_tokens': 10}
    """
    if method == "plain":
        return {}
    if method == "pld":
        return {"prompt_lookup_num_tokens": PROMPT_LOOKUP_TOKENS}
    if method == "early_exit":
        return {"assistant_early_exit": early_exit_layer}
    if method == "builtin_dflash":
        return {"assistant_model": drafter, "speculation_type": "dflash"}
    if method == "dflash":
        return {"assistant_model": drafter}
    if method == "dflash_heuristic":
        return {"assistant_model": drafter, "num_assistant_tokens_schedule": "heuristic"}
    raise ValueError(f"Unknown method {method!r}; choose from {list(METHODS)}.")


def timed_generation(
    target,
    input_ids: torch.Tensor,
    max_new_tokens: int,
    method: str = "plain",
    drafter=None,
    early_exit_layer: int | None = None,
    counter: ForwardCounter | None = None,
) -> Run:
    """Greedy ``generate`` with one method; returns the new tokens, the time taken and the counted forwards.

    Example:
        >>> run = timed_generation(target, ids, 64, "dflash", drafter)  # doctest: +SKIP
        >>> run.stats.mean_acceptance_length  # doctest: +SKIP
        3.4
    """
    kwargs = method_kwargs(method, drafter, early_exit_layer)
    context = builtin_generation() if method == "builtin_dflash" else contextlib.nullcontext()
    pad_token_id = target.generation_config.pad_token_id
    if pad_token_id is None:
        eos = target.generation_config.eos_token_id
        pad_token_id = eos[0] if isinstance(eos, list) else eos
    if counter is not None:
        counter.reset()
    synchronize(input_ids.device)
    start = time.perf_counter()
    with context, torch.inference_mode():
        output = target.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=pad_token_id,
            **kwargs,
        )
    synchronize(input_ids.device)
    seconds = time.perf_counter() - start
    stats = drafter.last_stats if method.startswith("dflash") else None
    forwards = counter.calls if counter is not None else 0
    return Run(output[0, input_ids.shape[1] :].tolist(), seconds, forwards, stats)


# ----------------------------------------------------------------------------------------------------------------------
# summaries
@dataclass
class PromptResult:
    """All methods on one prompt."""

    dataset: str
    index: int
    prompt_tokens: int
    runs: dict[str, Run] = field(default_factory=dict)

    def identical(self, method: str) -> bool:
        return self.runs[method].new_tokens == self.runs["plain"].new_tokens

    def speedup(self, method: str) -> float:
        """Plain per-token time over the method's per-token time, on this prompt."""
        plain, run = self.runs["plain"], self.runs[method]
        plain_per_token = plain.seconds / max(1, len(plain.new_tokens))
        return plain_per_token / max(run.seconds / max(1, len(run.new_tokens)), 1e-12)


def method_tau(method: str, results: list[PromptResult]) -> float | None:
    """Tokens committed per target verification.

    Ours: the mean of ``last_stats.acceptance_lengths``. transformers' DFlash spends its first target forward on the
    prompt alone, so ``(new - 1) / (forwards - 1)``; prompt lookup verifies from the first forward on:
    ``new / forwards``. Early exit drafts with the target itself, so its forwards are not verifications: None.
    """
    runs = [r.runs[method] for r in results]
    if method.startswith("dflash"):
        lengths = [a for run in runs for a in run.stats.acceptance_lengths]
        return sum(lengths) / len(lengths) if lengths else None
    if method == "builtin_dflash":
        cycles = sum(run.target_forwards - 1 for run in runs)
        return sum(len(run.new_tokens) - 1 for run in runs) / cycles if cycles > 0 else None
    if method in ("plain", "pld"):
        forwards = sum(run.target_forwards for run in runs)
        return sum(len(run.new_tokens) for run in runs) / forwards if forwards > 0 else None
    return None


def acceptance_histogram(stats: list[DFlashStats]) -> list[int]:
    """Counts of acceptance lengths 1..block_size over all verifications (index 0 = nothing accepted).

    Example:
        >>> acceptance_histogram([DFlashStats(block_size=4, acceptance_lengths=[1, 4, 2, 1])])
        [2, 1, 0, 1]
    """
    if not stats:
        return []
    counts = [0] * stats[0].block_size
    for s in stats:
        for a in s.acceptance_lengths:
            counts[a - 1] += 1
    return counts


def acceptance_by_position(stats: list[DFlashStats]) -> list[float]:
    """Fraction of all verifications whose draft at block position k (1 .. block_size-1) was accepted.

    Example:
        >>> acceptance_by_position([DFlashStats(block_size=4, acceptance_lengths=[1, 4, 2, 1])])
        [0.5, 0.25, 0.25]
    """
    histogram = acceptance_histogram(stats)
    total = max(1, sum(histogram))
    return [sum(histogram[k:]) / total for k in range(1, len(histogram))]


def summary_of(results: list[PromptResult], methods: list[str]) -> dict:
    """Per-method figures over a set of prompts (one dataset, or all).

    Times are medians over prompts (a shared machine's load spikes hit single runs): ``tokens_per_s`` is the median
    per-prompt rate, ``speedup`` the median per-prompt ratio to plain, t(1) the median plain per-token time.
    """
    summary = {}
    t1 = statistics.median(r.runs["plain"].seconds / max(1, len(r.runs["plain"].new_tokens)) for r in results)
    for method in methods:
        runs = [r.runs[method] for r in results]
        seconds = sum(run.seconds for run in runs)
        entry = {
            "tau": method_tau(method, results),
            "tokens_per_s": statistics.median(run.tokens_per_second for run in runs),
            "speedup": statistics.median(r.speedup(method) for r in results) if results else None,
            "identical": all(r.identical(method) for r in results),
            "prompts": len(results),
            "new_tokens": sum(len(run.new_tokens) for run in runs),
            "seconds": seconds,
        }
        if method.startswith("dflash"):
            entry.update(cycle_costs([run.stats for run in runs], t1))
        summary[method] = entry
    return summary


def cycle_costs(stats: list[DFlashStats], t1: float) -> dict:
    """Per-cycle draft/verify times, plain per-token time t(1), and the speedup ceiling they allow.

    tau pools all verifications; t(draft) and t(verify) are medians over prompts of the per-cycle means (t1 is given,
    see :func:`summary_of`). ceiling = tau * t(1) / (t(verify) + t(draft)): the speedup of a loop with zero overhead
    beyond its two forwards.
    """
    stats = [s for s in stats if s.num_verifications > 0]
    cycles = sum(s.num_verifications for s in stats)
    if cycles == 0:
        return {}
    tau = sum(sum(s.acceptance_lengths) for s in stats) / cycles
    t_draft = statistics.median(s.draft_seconds / s.num_verifications for s in stats)
    t_verify = statistics.median(s.verify_seconds / s.num_verifications for s in stats)
    return {
        "cycles": cycles,
        "t1_ms": 1e3 * t1,
        "t_draft_ms": 1e3 * t_draft,
        "t_verify_ms": 1e3 * t_verify,
        "prefill_ms": 1e3 * statistics.median(s.prefill_seconds for s in stats),
        "ceiling": tau * t1 / (t_draft + t_verify) if t_draft + t_verify > 0 else None,
        "acceptance_by_position": acceptance_by_position(stats),
        "acceptance_length_histogram": acceptance_histogram(stats),
    }


# ----------------------------------------------------------------------------------------------------------------------
# the benchmark
def run_benchmark(
    target,
    tokenizer,
    drafter,
    prompts: dict[str, list[str]],
    methods: list[str] = METHODS,
    max_new_tokens: int = 256,
    early_exit_layer: int | None = None,
    warmup: bool = True,
) -> dict:
    """Run every method on every prompt (interleaved, rotating order) and return the JSON-ready report.

    Args:
        prompts: dataset name -> user messages (chat template applied here).
        methods: subset of :data:`METHODS`; ``plain`` is always run (the reference).

    Returns:
        ``{"config": ..., "results": {dataset or "overall": {method: {"tau", "tokens_per_s", "speedup",
        "identical", ...}}}, "per_prompt": [...]}``.

    Example:
        >>> prompts = {"gsm8k": load_eval_prompts("gsm8k", 2)}  # doctest: +SKIP
        >>> report = run_benchmark(target, tokenizer, drafter, prompts)  # doctest: +SKIP
        >>> report["results"]["gsm8k"]["dflash"]["tau"]  # doctest: +SKIP
    """
    methods = ["plain"] + [m for m in methods if m != "plain"]
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise ValueError(f"Unknown methods {unknown}; choose from {list(METHODS)}.")
    if drafter is None and any("dflash" in m for m in methods):
        raise ValueError("The dflash methods need a drafter.")
    early_exit_layer = early_exit_layer or default_early_exit_layer(target)
    device = target.device
    encoded = {name: [chat_input_ids(tokenizer, p, device) for p in texts] for name, texts in prompts.items()}
    counter = ForwardCounter(target)
    try:
        if warmup and any(encoded.values()):
            first = next(ids for batch in encoded.values() for ids in batch)
            for method in methods:  # first calls pay for lazy initialisation
                timed_generation(target, first, min(8, max_new_tokens), method, drafter, early_exit_layer, counter)
        results: list[PromptResult] = []
        total = sum(len(batch) for batch in encoded.values())
        with tqdm(total=total, desc="bench", unit="prompt") as bar:
            for name, batch in encoded.items():
                for index, ids in enumerate(batch):
                    bar.set_postfix_str(f"{name} #{index}")
                    result = PromptResult(name, index, ids.shape[1])
                    shift = len(results) % len(methods)
                    for method in methods[shift:] + methods[:shift]:
                        result.runs[method] = timed_generation(
                            target, ids, max_new_tokens, method, drafter, early_exit_layer, counter
                        )
                    for method in methods[1:]:
                        if not result.identical(method):
                            at = first_difference(result.runs[method].new_tokens, result.runs["plain"].new_tokens)
                            logger.warning(
                                f"{method} differs from plain generate on {name} prompt {index}, from new token {at}."
                            )
                    results.append(result)
                    bar.update(1)
    finally:
        counter.remove()

    report = {"config": {}, "results": {}, "per_prompt": []}
    for name in encoded:
        subset = [r for r in results if r.dataset == name]
        if subset:
            report["results"][name] = summary_of(subset, methods)
    if results:
        report["results"]["overall"] = summary_of(results, methods)
    report["config"] = {
        "target": getattr(target.config, "_name_or_path", "") or type(target).__name__,
        "drafter": (getattr(drafter.config, "_name_or_path", "") or "untrained") if drafter is not None else None,
        "block_size": drafter.config.block_size if drafter is not None else None,
        "device": str(device),
        "dtype": str(target.dtype).removeprefix("torch."),
        "threads": torch.get_num_threads(),
        "max_new_tokens": max_new_tokens,
        "methods": methods,
        "early_exit_layer": early_exit_layer,
        "prompt_lookup_num_tokens": PROMPT_LOOKUP_TOKENS,
        "datasets": {name: len(batch) for name, batch in encoded.items()},
        "dataset_licenses": {name: DATASET_LICENSES.get(name) for name in encoded},
    }
    for r in results:
        report["per_prompt"].append({
            "dataset": r.dataset,
            "index": r.index,
            "prompt_tokens": r.prompt_tokens,
            **{
                method: {
                    "new_tokens": len(run.new_tokens),
                    "seconds": run.seconds,
                    "identical": r.identical(method),
                    "tau": run.stats.mean_acceptance_length if run.stats is not None else None,
                }
                for method, run in r.runs.items()
            },
        })
    return report


def all_identical(report: dict) -> bool:
    """True when every method reproduced plain generate exactly on every prompt."""
    return all(entry["identical"] for per_method in report["results"].values() for entry in per_method.values())


# ----------------------------------------------------------------------------------------------------------------------
# output
def _fmt(value, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def markdown_report(report: dict) -> str:
    """The report as Markdown tables: methods side by side, then DFlash's per-cycle costs and acceptance.

    Example:
        >>> print(markdown_report(report))  # doctest: +SKIP
    """
    config, results = report["config"], report["results"]
    lines = [
        f"Target `{config['target']}`, drafter `{config['drafter']}` (block {config['block_size']}), "
        f"{config['device']}/{config['dtype']}, {config['threads']} threads, greedy, max_new_tokens="
        f"{config['max_new_tokens']}, prompts per dataset: {config['datasets']}.",
        "",
        "| dataset | method | tau | tokens/s (median) | speedup (median) | identical |",
        "|---|---|---|---|---|---|",
    ]
    for name, per_method in results.items():
        for method, entry in per_method.items():
            lines.append(
                f"| {name} | {METHOD_LABELS[method]} | {_fmt(entry['tau'])} | {_fmt(entry['tokens_per_s'], '.1f')} | "
                f"{_fmt(entry['speedup'])}x | {'yes' if entry['identical'] else '**NO**'} |"
            )
    costs = {name: m["dflash"] for name, m in results.items() if "dflash" in m and "cycles" in m["dflash"]}
    if costs:
        lines += [
            "",
            "hf-dflash per cycle (medians over prompts): ceiling = tau x t(1) / (t(verify) + t(draft)).",
            "",
            "| dataset | tau | t(1) ms | t(draft) ms | t(verify) ms | ceiling | measured |",
            "|---|---|---|---|---|---|---|",
        ]
        for name, e in costs.items():
            lines.append(
                f"| {name} | {_fmt(e['tau'])} | {_fmt(e['t1_ms'], '.1f')} | {_fmt(e['t_draft_ms'], '.1f')} | "
                f"{_fmt(e['t_verify_ms'], '.1f')} | {_fmt(e['ceiling'])}x | {_fmt(e['speedup'])}x |"
            )
        block = max(len(e["acceptance_by_position"]) for e in costs.values()) + 1
        lines += [
            "",
            "hf-dflash acceptance rate by block position k (fraction of verifications accepting draft k).",
            "",
            "| dataset | " + " | ".join(str(k) for k in range(1, block)) + " |",
            "|---|" + "---|" * (block - 1),
        ]
        for name, e in costs.items():
            lines.append(f"| {name} | " + " | ".join(f"{p:.2f}" for p in e["acceptance_by_position"]) + " |")
    return "\n".join(lines) + "\n"


def save_plot(report: dict, path: str | Path) -> bool:
    """PNG: speedup per dataset and method (left), DFlash acceptance by block position (right).

    Needs matplotlib (``pip install 'hf-dflash[bench]'``); returns False with a message when it is missing.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        logger.warning(f"matplotlib is not installed: skipping the plot {path} (pip install matplotlib).")
        return False
    results = report["results"]
    datasets = list(results)
    methods = [m for m in report["config"]["methods"] if m != "plain"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    width = 0.8 / max(1, len(methods))
    for i, method in enumerate(methods):
        values = [results[d][method]["speedup"] or 0.0 for d in datasets]
        left.bar([x + i * width for x in range(len(datasets))], values, width, label=METHOD_LABELS[method])
    left.axhline(1.0, color="black", linewidth=0.8)
    left.set_xticks([x + width * (len(methods) - 1) / 2 for x in range(len(datasets))], datasets)
    left.set_ylabel("speedup vs plain generate (median)")
    left.legend(fontsize=8)
    for d in datasets:
        positions = results[d].get("dflash", {}).get("acceptance_by_position")
        if positions:
            right.plot(range(1, len(positions) + 1), positions, marker="o", label=d)
    right.set_xlabel("block position k")
    right.set_ylabel("acceptance rate")
    right.set_ylim(0, 1)
    right.legend(fontsize=8)
    config = report["config"]
    fig.suptitle(f"{Path(config['target']).name}: {config['device']}, {config['dtype']}, {config['threads']} threads")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


# ----------------------------------------------------------------------------------------------------------------------
# batched throughput
def left_padded_batch(prompts: list[torch.Tensor], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[1, n_i] prompts -> left-padded ids [b, max n] and their attention mask."""
    longest = max(p.shape[1] for p in prompts)
    ids = torch.full((len(prompts), longest), pad_token_id, dtype=torch.long, device=prompts[0].device)
    mask = torch.zeros_like(ids)
    for row, prompt in enumerate(prompts):
        ids[row, longest - prompt.shape[1] :] = prompt[0]
        mask[row, longest - prompt.shape[1] :] = 1
    return ids, mask


def new_token_count(output: torch.Tensor, prompt_length: int, pad_token_id: int) -> int:
    """Generated tokens in a batch output, without the padding of rows that finished early."""
    return int((output[:, prompt_length:] != pad_token_id).sum())


def run_batch_benchmark(target, tokenizer, drafter, prompts: list[str], batch_sizes: list[int],
                        max_new_tokens: int = 128, repeats: int = 2) -> list[dict]:
    """Tokens/s of plain batched generate vs the DFlash path at each batch size, measured side by side.

    Each batch size runs the first `b` prompts, alternating plain and DFlash `repeats` times (medians), and checks
    the outputs are identical.

    Example:
        >>> rows = run_batch_benchmark(target, tok, drafter, load_eval_prompts("gsm8k", 16), [1, 4, 16])  # doctest: +SKIP
        >>> rows[0]["speedup"]  # doctest: +SKIP
    """
    pad = target.generation_config.pad_token_id
    if pad is None:
        eos = target.generation_config.eos_token_id
        pad = eos[0] if isinstance(eos, list) else eos
    encoded = [chat_input_ids(tokenizer, p, target.device) for p in prompts]
    rows = []
    for batch_size in tqdm(batch_sizes, desc="batch bench", unit="batch size"):
        if batch_size > len(encoded):
            raise ValueError(f"batch size {batch_size} needs {batch_size} prompts, got {len(encoded)}.")
        ids, mask = left_padded_batch(encoded[:batch_size], pad)
        settings = dict(attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=pad)
        times = {"plain": [], "dflash": []}
        outputs = {}
        for _ in range(repeats):
            for method, extra in (("plain", {}), ("dflash", {"assistant_model": drafter})):
                synchronize(target.device)
                start = time.perf_counter()
                with torch.inference_mode():
                    outputs[method] = target.generate(ids, **settings, **extra)
                synchronize(target.device)
                times[method].append(time.perf_counter() - start)
        tokens = new_token_count(outputs["plain"], ids.shape[1], pad)
        plain_s, dflash_s = statistics.median(times["plain"]), statistics.median(times["dflash"])
        rows.append({
            "batch_size": batch_size,
            "new_tokens": tokens,
            "plain_tokens_per_s": tokens / plain_s,
            "dflash_tokens_per_s": tokens / dflash_s,
            "speedup": plain_s / dflash_s,
            "tau": drafter.last_stats.mean_acceptance_length,
            "identical": bool(torch.equal(outputs["plain"], outputs["dflash"])),
        })
    return rows


def batch_markdown(rows: list[dict]) -> str:
    lines = [
        "| batch | plain tok/s | DFlash tok/s | speedup | tau | identical |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['batch_size']} | {r['plain_tokens_per_s']:.1f} | {r['dflash_tokens_per_s']:.1f} | "
            f"{r['speedup']:.2f}x | {r['tau']:.2f} | {'yes' if r['identical'] else 'NO'} |"
        )
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------------------------------------
# command line
def comma_list(value: str) -> list[str]:
    return [item.strip() for item in value.split(",") if item.strip()]


def add_parser(subparsers) -> None:
    """Register ``hf-dflash bench``."""
    parser = subparsers.add_parser(
        "bench",
        help="benchmark DFlash against plain decoding, prompt lookup, early exit and transformers' DFlash",
        description=__doc__.split("\n\n")[0],
    )
    add_model_arguments(parser)
    parser.add_argument(
        "--datasets", type=comma_list, default=list(DATASETS), help=f"comma list of {','.join(DATASETS)}"
    )
    parser.add_argument("--limit", type=int, default=10, help="prompts per dataset (default 10)")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument(
        "--methods",
        type=comma_list,
        default=list(METHODS),
        help=f"comma list of {','.join(METHODS)} (plain always runs)",
    )
    parser.add_argument("--early-exit-layer", type=int, default=None, help="default: a third of the target's depth")
    parser.add_argument("--json", default=None, help="write the report as JSON")
    parser.add_argument("--markdown", default=None, help="write the tables as Markdown")
    parser.add_argument("--plot", default=None, help="write a PNG plot (needs matplotlib)")
    parser.add_argument(
        "--batch-sizes", type=comma_list, default=None,
        help="instead of the method comparison: plain vs DFlash tokens/s at these batch sizes, e.g. 1,4,8,16",
    )
    parser.add_argument("--verbose", action="store_true")
    parser.set_defaults(func=main)


def write_outputs(args: argparse.Namespace, report, text: str) -> None:
    """Print the Markdown; write it and the JSON report where --markdown / --json ask."""
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    if args.markdown:
        Path(args.markdown).write_text(text, encoding="utf-8")


def main(args: argparse.Namespace) -> int:
    """Exit code 0 when every method's output equals plain generate on every prompt, else 1."""
    with_drafter = bool(args.batch_sizes) or any("dflash" in m for m in args.methods)
    target, tokenizer, drafter, _ = load_models_from_args(args, with_drafter)
    prompts = {name: load_eval_prompts(name, args.limit) for name in args.datasets}
    if args.batch_sizes:
        sizes = [int(b) for b in args.batch_sizes]
        pool = [p for texts in prompts.values() for p in texts]
        rows = run_batch_benchmark(target, tokenizer, drafter, pool, sizes, args.max_new_tokens)
        write_outputs(args, rows, batch_markdown(rows))
        return 0 if all(r["identical"] for r in rows) else 1
    report = run_benchmark(
        target, tokenizer, drafter, prompts, args.methods, args.max_new_tokens, args.early_exit_layer
    )
    write_outputs(args, report, markdown_report(report))
    if args.plot:
        save_plot(report, args.plot)
    if not all_identical(report):
        print("Some outputs differ from plain generate (see the 'identical' column).")
        return 1
    return 0
