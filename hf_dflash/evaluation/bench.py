# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""``hf-dflash bench``: DFlash against plain decoding and the other lossless accelerators, side by side.

Methods (all greedy, same ``max_new_tokens``, run interleaved per prompt in one process so that a busy machine
slows them alike; the order rotates from prompt to prompt):

- ``plain``: ``target.generate(ids)``, the reference every other output must equal token for token;
- ``pld``: prompt lookup decoding (``prompt_lookup_num_tokens=10``);
- ``early_exit``: transformers' self-speculation (``assistant_early_exit=N``, N ~ a third of the depth);
- ``builtin_dflash``: transformers' own DFlash generator driving our drafter
  (``with hf_dflash.builtin_generation(): generate(..., assistant_model=drafter, speculation_type="dflash")``);
- ``dflash``: this package's DFlash loop verifying the whole block every cycle (``dflash_policy="full"``);
- ``dflash_default``: what ``generate(assistant_model=drafter)`` does by default: the cost-aware policy picks each
  cycle's draft source (the drafter, or prompt-lookup drafts) and count (0 = a plain target step) from measured
  costs and acceptance;
- ``dflash_heuristic``: the same loop verifying an adaptive number of drafts per cycle
  (``num_assistant_tokens_schedule="heuristic"``: +2 after a fully accepted block, -1 otherwise);
- ``dflash_tree``: the same loop verifying a tree of 16 drafts per cycle (``dflash_tree_budget=16``, DDTree: built
  best-first by joint draft probability from the drafter's one forward, verified in one target forward);
- ``dflash_tree_ngram``: the same tree plus the prompt-lookup continuation (10 tokens) as one more branch
  (``prompt_lookup_num_tokens=10``);
- ``dflash_default_tree``: the default policy with trees (``dflash_tree_budget=16, prompt_lookup_num_tokens=10``):
  each cycle a plain step, prompt-lookup drafts alone, or a tree of the budget the policy picks (with the n-gram
  branch).

Reported per dataset and overall: tau (tokens per target forward: ``drafter.last_stats`` for ours, counted target
forwards for the others), acceptance by block position, tokens/s, speedup vs plain (median of per-prompt ratios),
the per-cycle costs t(draft), t(verify), t(1) (plain per-token time) and the ceiling
``tau * t(1) / (t(verify) + t(draft))`` that no implementation of the loop can beat on this machine.

Example:
    $ hf-dflash bench --datasets gsm8k,humaneval --limit 5 --max-new-tokens 128 --json bench.json --plot bench.png
    $ hf-dflash bench --threads 1 --limit 5 --max-new-tokens 64 --repeats 2   # each method's faster of 2 runs
"""

import contextlib
import dataclasses
import os
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers.utils import logging

from ..data.chat import chat_input_ids
from ..data.records import append_record, read_records
from ..generation_dflash import builtin_generation
from ..timing_dflash import synchronized_clock
from ..stats_dflash import DFlashStats
from ..models import pad_token_id, portable_name
from .acceptance import acceptance_histogram, pooled_acceptance_by_position
from .machine import OtherLoad, load_average, run_stamp
from .prompts import DATASET_LICENSES

logger = logging.get_logger(__name__)

METHODS: tuple[str, ...] = (
    "plain", "pld", "early_exit", "builtin_dflash", "dflash", "dflash_heuristic", "dflash_default", "dflash_tree",
    "dflash_tree_ngram", "dflash_default_tree",
)
TREE_BUDGET = 16  # draft nodes per verification of the ``dflash_tree`` method


METHOD_LABELS = {
    "plain": "plain generate",
    "pld": "prompt lookup (10)",
    "early_exit": "early exit",
    "builtin_dflash": "transformers DFlash",
    "dflash": "hf-dflash, full blocks",
    "dflash_heuristic": "hf-dflash, heuristic draft length",
    "dflash_default": "hf-dflash default (cost-aware)",
    "dflash_tree": f"hf-dflash, tree ({TREE_BUDGET} nodes)",
    "dflash_tree_ngram": f"hf-dflash, tree ({TREE_BUDGET}) + n-gram branch",
    "dflash_default_tree": f"hf-dflash default + tree (up to {TREE_BUDGET})",
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
    prefill_seconds: float | None = None  # the first target forward: the prompt (None: not counted)

    @property
    def tokens_per_second(self) -> float:
        return len(self.new_tokens) / self.seconds if self.seconds > 0 else 0.0

    @property
    def decode_seconds(self) -> float | None:
        """Seconds after the prompt was read: what speculative decoding can change (a long prompt's prefill is the
        same forward with or without drafts)."""
        return None if self.prefill_seconds is None else self.seconds - self.prefill_seconds


class ForwardCounter:
    """Counts forward calls of a module (the target's verification passes, prefill included) and times the first
    one since :meth:`reset` (a generate call's prefill).

    Example:
        >>> counter = ForwardCounter(target)  # doctest: +SKIP
        >>> counter.reset(); target.generate(ids, max_new_tokens=8); counter.calls, counter.first_seconds > 0  # doctest: +SKIP
        (8, True)
    """

    def __init__(self, module: torch.nn.Module):
        self.calls, self.first_seconds, self._started = 0, None, None
        self.device = next(module.parameters()).device
        self.handles = [module.register_forward_pre_hook(self._start), module.register_forward_hook(self._count)]

    def _start(self, *args) -> None:
        if self.calls == 0:
            self._started = synchronized_clock(self.device)

    def _count(self, *args) -> None:
        if self.calls == 0 and self._started is not None:
            self.first_seconds = synchronized_clock(self.device) - self._started
        self.calls += 1

    def reset(self) -> None:
        self.calls, self.first_seconds, self._started = 0, None, None

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


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
        return {"assistant_model": drafter, "dflash_policy": "full"}
    if method == "dflash_default":
        return {"assistant_model": drafter}
    if method == "dflash_heuristic":
        return {"assistant_model": drafter, "num_assistant_tokens_schedule": "heuristic"}
    if method == "dflash_tree":
        return {"assistant_model": drafter, "dflash_tree_budget": TREE_BUDGET, "dflash_policy": "full"}
    if method == "dflash_tree_ngram":
        return {"assistant_model": drafter, "dflash_tree_budget": TREE_BUDGET, "dflash_policy": "full",
                "prompt_lookup_num_tokens": PROMPT_LOOKUP_TOKENS}
    if method == "dflash_default_tree":
        return {"assistant_model": drafter, "dflash_tree_budget": TREE_BUDGET,
                "prompt_lookup_num_tokens": PROMPT_LOOKUP_TOKENS}
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
    if counter is not None:
        counter.reset()
    start = synchronized_clock(input_ids.device)
    with context, torch.inference_mode():
        output = target.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=pad_token_id(target),
            **kwargs,
        )
    seconds = synchronized_clock(input_ids.device) - start
    stats = drafter.last_stats if method.startswith("dflash") else None
    forwards, prefill = (counter.calls, counter.first_seconds) if counter is not None else (0, None)
    return Run(output[0, input_ids.shape[1] :].tolist(), seconds, forwards, stats, prefill)


# ----------------------------------------------------------------------------------------------------------------------
# resuming a killed run
class BenchProgress:
    """The finished prompt rounds of a bench run, one JSON line each, so that a killed run resumes where it stopped
    (a run at 8K-token prompts takes minutes per prompt). The first line records what was asked (target, drafter,
    methods, tokens, threads...); a rerun asking something else is refused before any work. A line cut short by a
    kill is dropped when the file is opened again, and each line is flushed to disk before the next prompt starts.

    Example:
        >>> import tempfile
        >>> path = Path(tempfile.mkdtemp()) / "bench.progress.jsonl"
        >>> BenchProgress(path, {"methods": ["plain"]}).record(("gsm8k", 0, 0), {"plain": Run([1, 2], 0.5, 2)})
        >>> BenchProgress(path, {"methods": ["plain"]}).done[("gsm8k", 0, 0)]["plain"].new_tokens
        [1, 2]
    """

    def __init__(self, path: str | os.PathLike, asked: dict):
        self.path = Path(path)
        self.done: dict[tuple[str, int, int], dict[str, Run]] = {}
        if not self.path.exists():
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._append(asked)
            return
        self._drop_cut_line()  # or the next record would be glued to it, and lost on the next resume
        recorded, *entries = read_records(self.path)
        if recorded != asked:
            changed = sorted(k for k in set(asked) | set(recorded) if asked.get(k) != recorded.get(k))
            differences = "; ".join(f"{k}: {recorded.get(k)!r} there, {asked.get(k)!r} now" for k in changed)
            raise ValueError(f"{self.path} holds a bench run of other settings ({differences}); delete it to "
                             "start over, or pass the same settings to resume it.")
        for entry in entries:
            runs = {method: run_from_json(run) for method, run in entry["runs"].items()}
            self.done[(entry["dataset"], entry["index"], entry["round"])] = runs
        if self.done:
            logger.warning(f"Resuming the bench from {self.path}: {len(self.done)} prompt runs already done.")

    def _drop_cut_line(self) -> None:
        """Cut the file back to its last complete line (atomically: temporary file + rename)."""
        text = self.path.read_text(encoding="utf-8")
        if not text.endswith("\n"):
            partial = self.path.with_name(self.path.name + ".tmp")
            partial.write_text(text[: text.rfind("\n") + 1], encoding="utf-8")
            partial.replace(self.path)

    def record(self, key: tuple[str, int, int], runs: dict[str, Run]) -> None:
        dataset, index, round_ = key
        self._append({"dataset": dataset, "index": index, "round": round_,
                      "runs": {method: dataclasses.asdict(run) for method, run in runs.items()}})

    def _append(self, entry: dict) -> None:
        append_record(self.path, entry)


def run_from_json(entry: dict) -> Run:
    """A :class:`Run` as :class:`BenchProgress` wrote it (``dataclasses.asdict``)."""
    stats = entry.get("stats")
    return Run(entry["new_tokens"], entry["seconds"], entry["target_forwards"],
               None if stats is None else DFlashStats(**stats), entry.get("prefill_seconds"))


# ----------------------------------------------------------------------------------------------------------------------
# summaries
@dataclass
class PromptResult:
    """All methods on one prompt."""

    dataset: str
    index: int
    prompt_tokens: int
    runs: dict[str, Run] = field(default_factory=dict)
    unstable: set[str] = field(default_factory=set)  # methods whose repeated runs gave different tokens

    def keep_faster(self, method: str, run: Run) -> None:
        """Keep `run` of `method` if it is the first or faster; repeated runs must give the same tokens (greedy)."""
        previous = self.runs.get(method)
        if previous is not None and previous.new_tokens != run.new_tokens:
            self.unstable.add(method)
        if previous is None or run.seconds < previous.seconds:
            self.runs[method] = run

    def identical(self, method: str) -> bool:
        return not {method, "plain"} & self.unstable and self.runs[method].new_tokens == self.runs["plain"].new_tokens

    def speedup(self, method: str, decode: bool = False) -> float | None:
        """Plain per-token time over the method's per-token time, on this prompt (`decode`: after the prompt was
        read, both ways; None when a prefill was not timed)."""
        plain, run = self.runs["plain"], self.runs[method]
        plain_s, run_s = (plain.decode_seconds, run.decode_seconds) if decode else (plain.seconds, run.seconds)
        if plain_s is None or run_s is None:
            return None
        plain_per_token = plain_s / max(1, len(plain.new_tokens))
        return plain_per_token / max(run_s / max(1, len(run.new_tokens)), 1e-12)


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
            "decode_speedup": median_or_none([r.speedup(method, decode=True) for r in results]),
            "prefill_s": median_or_none([r.runs[method].prefill_seconds for r in results]),
            "identical": all(r.identical(method) for r in results),
            "prompts": len(results),
            "new_tokens": sum(len(run.new_tokens) for run in runs),
            "seconds": seconds,
        }
        if method.startswith("dflash"):
            entry.update(cycle_costs([run.stats for run in runs], t1))
        summary[method] = entry
    return summary


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


# ----------------------------------------------------------------------------------------------------------------------
# the benchmark: run, check, summarise
def run_benchmark(target, tokenizer, drafter, prompts: dict[str, list[str]], methods: list[str] = METHODS,
                  max_new_tokens: int = 256, early_exit_layer: int | None = None, warmup: bool = True,
                  repeats: int = 1, progress: str | os.PathLike | None = None) -> dict:
    """Run every method on every prompt (interleaved, rotating order) and return the JSON-ready report.

    Args:
        prompts: dataset name -> user messages (chat template applied here).
        methods: subset of :data:`METHODS`; ``plain`` is always run (the reference).
        repeats: rounds over each dataset's prompts; each method's faster run of a prompt counts (one 64-token run
            moves by ~10% on a shared machine; a load spike only ever slows a run).
        progress: a JSON-lines file that records each finished prompt round; a rerun with the same file and
            settings skips what it holds (see :class:`BenchProgress`).

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
    other_load, load_before = OtherLoad(), load_average()
    encoded = {name: [chat_input_ids(tokenizer, p, target.device) for p in texts] for name, texts in prompts.items()}
    config = bench_config(target, drafter, encoded, methods, max_new_tokens, repeats, early_exit_layer)
    journal = None if progress is None else BenchProgress(progress, config)  # other settings: refused before any run

    results = timed_results(target, drafter, encoded, methods, max_new_tokens, early_exit_layer, warmup, repeats,
                            journal)
    for difference in differences_from_plain(results, methods):
        logger.warning(difference)
    machine = {**run_stamp(target.device, load_before), "other_load_cores": other_load.cores()}
    return bench_report(machine, config, results, methods)


def timed_results(target, drafter, encoded: dict[str, list[torch.Tensor]], methods: list[str], max_new_tokens: int,
                  early_exit_layer: int, warmup: bool, repeats: int, journal: BenchProgress | None
                  ) -> list[PromptResult]:
    """Step 1, run: every method on every prompt, `repeats` rounds, each method's faster run kept (dataset by
    dataset, in order). A prompt round that `journal` holds is read back instead of run; a new one is recorded there
    before the next starts.

    Rounds go over a whole dataset in order, so the call before each prompt's run is the same in every round (the
    default policy carries what it learned from one call to the next); the methods' order rotates from prompt to
    prompt.
    """
    counter = ForwardCounter(target)
    try:
        if warmup and any(encoded.values()):
            first = next(ids for batch in encoded.values() for ids in batch)
            for method in methods:  # first calls pay for lazy initialisation
                timed_generation(target, first, min(8, max_new_tokens), method, drafter, early_exit_layer, counter)
        results: list[PromptResult] = []
        with tqdm(total=repeats * sum(len(batch) for batch in encoded.values()), desc="bench", unit="prompt") as bar:
            for name, batch in encoded.items():
                dataset = [PromptResult(name, index, ids.shape[1]) for index, ids in enumerate(batch)]
                for round_ in range(repeats):
                    for result, ids in zip(dataset, batch):
                        bar.set_postfix_str(f"{name} #{result.index}" + (f" round {round_ + 1}" if repeats > 1 else ""))
                        key = (name, result.index, round_)
                        runs = None if journal is None else journal.done.get(key)
                        if runs is None:
                            shift = (len(results) + result.index + round_) % len(methods)
                            runs = {method: timed_generation(target, ids, max_new_tokens, method, drafter,
                                                             early_exit_layer, counter)
                                    for method in methods[shift:] + methods[:shift]}
                            if journal is not None:
                                journal.record(key, runs)
                        for method, run in runs.items():
                            result.keep_faster(method, run)
                        bar.update(1)
                results.extend(dataset)
        return results
    finally:
        counter.remove()


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
            for r in results for method in methods[1:] if not r.identical(method)]


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
                 early_exit_layer: int) -> dict:
    """What a bench run asks for (the report's ``config``; a resumed run must ask the same), without this machine's
    paths."""
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
    }


def cycle_record(run: Run) -> dict:
    """Ours: each cycle's drafts verified (0: a plain step) and tokens committed, to see what the policy chose."""
    if run.stats is None:
        return {}
    return {"drafts_per_cycle": run.stats.drafts_per_cycle, "acceptance_lengths": run.stats.acceptance_lengths}


def all_identical(report: dict) -> bool:
    """True when every method reproduced plain generate exactly on every prompt."""
    return all(entry["identical"] for per_method in report["results"].values() for entry in per_method.values())
