# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""The bench's results: every method on each prompt (:class:`PromptResult`), the check against plain generate, and
the JSON-ready report: per-method figures (tau, tokens/s, speedups, TTFT and TPOT, per-cycle costs and the ceiling
they allow) for each dataset and overall, each prompt's record and the run's settings.
"""

import dataclasses
import statistics
from dataclasses import dataclass, field

import torch

from ..models import portable_name
from ..stats_dflash import DFlashStats
from .acceptance import acceptance_histogram, pooled_acceptance_by_position
from .methods import GREEDY, PROMPT_LOOKUP_TOKENS, Run, Sampling, first_difference
from .prompts import DATASET_LICENSES


@dataclass
class PromptResult:
    """All methods on one prompt."""

    dataset: str
    index: int
    prompt_tokens: int
    runs: dict[str, Run] = field(default_factory=dict)
    unstable: set[str] = field(default_factory=set)  # methods whose repeated runs gave different tokens
    sampled: bool = False  # outputs are draws: nothing to compare token for token

    def keep_faster(self, method: str, run: Run) -> None:
        """Keep `run` of `method` if it is the first or faster; repeated greedy runs must give the same tokens
        (:meth:`identical` reads none of it for sampled runs)."""
        previous = self.runs.get(method)
        if previous is not None and previous.new_tokens != run.new_tokens:
            self.unstable.add(method)
        if previous is None or run.seconds < previous.seconds:
            self.runs[method] = run

    def identical(self, method: str) -> bool | None:
        """Whether `method` gave plain's tokens (and repeated runs agreed); None for sampled outputs."""
        if self.sampled:
            return None
        return not {method, "plain"} & self.unstable and self.runs[method].new_tokens == self.runs["plain"].new_tokens

    def speedup(self, method: str) -> float:
        """End to end: plain per-token time over the method's per-token time, on this prompt (the headline)."""
        plain, run = self.runs["plain"], self.runs[method]
        plain_per_token = plain.seconds / max(1, len(plain.new_tokens))
        return plain_per_token / max(run.seconds / max(1, len(run.new_tokens)), 1e-12)

    def tpot_speedup(self, method: str) -> float | None:
        """Plain's time per output token after the first over the method's, on this prompt: the speedup once the
        prompt is read, what drafting changes (None when either TPOT is unknown, see :attr:`Run.tpot_seconds`).

        Example:
            >>> result = PromptResult("gsm8k", 0, 5, {"plain": Run([1, 2, 3], 1.0, 3, prefill_seconds=0.2),
            ...                                      "pld": Run([1, 2, 3], 0.6, 2, prefill_seconds=0.2)})
            >>> round(result.tpot_speedup("pld"), 6)
            2.0
        """
        plain, run = self.runs["plain"].tpot_seconds, self.runs[method].tpot_seconds
        return None if plain is None or run is None else plain / max(run, 1e-12)


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


def summary_of(results: list[PromptResult], methods: list[str]) -> dict:
    """Per-method figures over a set of prompts (one dataset, or all).

    Times are medians over prompts (a shared machine's load spikes hit single runs): ``tokens_per_s`` is the median
    per-prompt rate, ``speedup`` the median per-prompt ratio to plain end to end (the headline), TTFT / TPOT and the
    TPOT speedup as :func:`serving_times` says, t(1) the median plain per-token time.
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
            **serving_times(method, results),
            "identical": identical_on_all(results, method),
            "prompts": len(results),
            "new_tokens": sum(len(run.new_tokens) for run in runs),
            "seconds": seconds,
        }
        if method.startswith("dflash"):
            entry.update(cycle_costs([run.stats for run in runs], t1))
        summary[method] = entry
    return summary


def identical_on_all(results: list[PromptResult], method: str) -> bool | None:
    """Whether `method` gave plain's tokens on every prompt; None when the outputs were sampled."""
    each = [r.identical(method) for r in results]
    return None if None in each else all(each)


def serving_times(method: str, results: list[PromptResult]) -> dict:
    """A method's times as serving engines report them, medians over prompts: ``ttft_ms`` (time to first token: the
    prompt's prefill), ``tpot_ms`` (time per output token after the first) and ``tpot_speedup`` (the median
    per-prompt ratio of plain's TPOT to the method's). None where a prefill was not timed.

    Example:
        >>> result = PromptResult("gsm8k", 0, 5, {"plain": Run([1, 2, 3], 1.0, 3, prefill_seconds=0.2),
        ...                                      "pld": Run([1, 2, 3], 0.6, 2, prefill_seconds=0.2)})
        >>> {k: round(v, 6) for k, v in serving_times("pld", [result]).items()}
        {'ttft_ms': 200.0, 'tpot_ms': 200.0, 'tpot_speedup': 2.0}
    """
    ttft = median_or_none([r.runs[method].ttft_seconds for r in results])
    tpot = median_or_none([r.runs[method].tpot_seconds for r in results])
    return {"ttft_ms": None if ttft is None else 1e3 * ttft, "tpot_ms": None if tpot is None else 1e3 * tpot,
            "tpot_speedup": median_or_none([r.tpot_speedup(method) for r in results])}


def median_or_none(values: list[float | None]) -> float | None:
    """The median of `values`, None if any is None (a run whose prefill was not timed).

    Example:
        >>> median_or_none([1.0, 3.0, 2.0]), median_or_none([1.0, None])
        (2.0, None)
    """
    return None if not values or any(v is None for v in values) else statistics.median(values)


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
        "acceptance_by_position": pooled_acceptance_by_position(stats),
        "acceptance_length_histogram": acceptance_histogram(stats),
        "chosen_drafts": chosen_drafts(stats),
        "lookup_cycles": sum(s.lookup_cycles for s in stats),
    }


def chosen_drafts(stats: list[DFlashStats]) -> dict[int, int]:
    """How many cycles verified k drafts, by k (0: a plain target step of the cost-aware policy).

    Example:
        >>> chosen_drafts([DFlashStats(block_size=4, acceptance_lengths=[1, 1, 3], drafts_per_cycle=[0, 0, 3])])
        {0: 2, 3: 1}
    """
    counts: dict[int, int] = {}
    for s in stats:
        for k in s.drafts_per_cycle:
            counts[k] = counts.get(k, 0) + 1
    return dict(sorted(counts.items()))


def differences_from_plain(results: list[PromptResult], methods: list[str]) -> list[str]:
    """Step 2, check: a line for each prompt on which a method's output is not plain generate's, token for token
    (every method here is lossless: a difference is a bug), or on which repeated greedy runs disagreed. The report
    records the same as ``identical``; these lines say where.

    Example:
        >>> result = PromptResult("gsm8k", 0, 5, {"plain": Run([1, 2, 3], 1.0, 3), "pld": Run([1, 2, 4], 0.5, 2)})
        >>> differences_from_plain([result], ["plain", "pld"])
        ['pld differs from plain generate on gsm8k prompt 0, from new token 2.']
    """
    return [f"{method} differs from plain generate on {r.dataset} prompt {r.index}, from new token "
            f"{first_difference(r.runs[method].new_tokens, r.runs['plain'].new_tokens)}."
            for r in results for method in methods[1:] if r.identical(method) is False]


def bench_report(machine: dict, config: dict, results: list[PromptResult], methods: list[str]) -> dict:
    """Step 3, summarise: the JSON-ready report: per-method figures for each dataset that ran and overall, and each
    prompt's record."""
    datasets = dict.fromkeys(r.dataset for r in results)  # in run order
    summaries = {name: summary_of([r for r in results if r.dataset == name], methods) for name in datasets}
    if results:
        summaries["overall"] = summary_of(results, methods)
    return {"machine": machine, "config": config, "results": summaries,
            "per_prompt": [prompt_record(r) for r in results]}


def prompt_record(result: PromptResult) -> dict:
    """One prompt's line of the report: each method's tokens, times, identity and (ours) cycles."""
    return {
        "dataset": result.dataset,
        "index": result.index,
        "prompt_tokens": result.prompt_tokens,
        **{
            method: {
                "new_tokens": len(run.new_tokens),
                "seconds": run.seconds,
                "prefill_seconds": run.prefill_seconds,
                "identical": result.identical(method),
                "tau": run.stats.mean_acceptance_length if run.stats is not None else None,
                **cycle_record(run),
            }
            for method, run in result.runs.items()
        },
        "plain_tokens": result.runs["plain"].new_tokens,  # what every identical method generated (replays, checks)
    }


def bench_config(target, drafter, encoded: dict, methods: list[str], max_new_tokens: int, repeats: int,
                 early_exit_layer: int, sampling: Sampling = GREEDY) -> dict:
    """What a bench run asks for (the report's ``config``; a resumed run must ask the same), without this machine's
    paths; ``sampling`` only where the run samples."""
    drafter_name = None if drafter is None else getattr(drafter.config, "_name_or_path", "") or "untrained"
    return {
        "target": portable_name(getattr(target.config, "_name_or_path", "") or type(target).__name__),
        "drafter": None if drafter_name is None else portable_name(drafter_name),
        "block_size": drafter.config.block_size if drafter is not None else None,
        "device": str(target.device),
        "dtype": str(target.dtype).removeprefix("torch."),
        "threads": torch.get_num_threads(),
        "max_new_tokens": max_new_tokens,
        "repeats": repeats,
        "methods": methods,
        "early_exit_layer": early_exit_layer,
        "prompt_lookup_num_tokens": PROMPT_LOOKUP_TOKENS,
        "datasets": {name: len(batch) for name, batch in encoded.items()},
        "dataset_licenses": {name: DATASET_LICENSES.get(name) for name in encoded},
        **({} if sampling.greedy else {"sampling": dataclasses.asdict(sampling)}),
    }


def cycle_record(run: Run) -> dict:
    """Ours: each cycle's drafts verified (0: a plain step) and tokens committed, to see what the policy chose."""
    if run.stats is None:
        return {}
    return {"drafts_per_cycle": run.stats.drafts_per_cycle, "acceptance_lengths": run.stats.acceptance_lengths}


def all_identical(report: dict) -> bool:
    """True when no method's output differed from plain generate's (sampled runs have nothing to compare)."""
    return all(entry["identical"] is not False
               for per_method in report["results"].values() for entry in per_method.values())
