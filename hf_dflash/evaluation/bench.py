# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""``hf-dflash bench``: DFlash against plain decoding and the other lossless accelerators, side by side.

Methods (greedy unless ``sampling`` says otherwise, same ``max_new_tokens``, run interleaved per prompt in one process
so that a busy machine slows them alike; the order rotates from prompt to prompt):

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
  branch);
- ``dflash_default_kernel``: the default policy with the few-row CPU matrix kernel (``dflash_cpu_kernels=True``; on a
  CPU, beside ``dflash_default``, which runs torch's product unless ``HF_DFLASH_CPU_KERNELS=1``, it measures the
  kernel side by side).

Reported per dataset and overall: tau (tokens per target forward: ``drafter.last_stats`` for ours, counted target
forwards for the others), acceptance by block position, tokens/s, speedup vs plain (median of per-prompt ratios),
TTFT (time to first token: the prompt's prefill), TPOT (time per output token after the first) and its speedup vs
plain's, the per-cycle costs t(draft), t(verify), t(1) (plain per-token time) and the ceiling
``tau * t(1) / (t(verify) + t(draft))`` that no implementation of the loop can beat on this machine.

Example:
    $ hf-dflash bench --datasets gsm8k,humaneval --limit 5 --max-new-tokens 128 --json bench.json --plot bench.png
    $ hf-dflash bench --threads 1 --limit 5 --max-new-tokens 64 --repeats 2   # each method's faster of 2 runs
    $ hf-dflash bench --preset long-documents --json long.json   # context_2k/4k/8k, 256-token answers (see PRESETS)
    $ hf-dflash bench --temperature 0.7 --top-p 0.9 --limit 5    # sampled: timed side by side, not compared
"""

import os
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm
from transformers.utils import logging

from ..data.chat import chat_input_ids
from .machine import OtherLoad, load_average, run_stamp
from .methods import (GREEDY, METHODS, ForwardCounter, Run, Sampling, default_early_exit_layer, first_difference,
                      timed_generation)
from .progress import BenchProgress
from .prompts import CONTEXT_LENGTHS, DATASETS
from .summaries import (PromptResult, all_identical, bench_config, bench_report, cycle_costs,
                        differences_from_plain)

logger = logging.get_logger(__name__)

# what callers outside the package import from here (cli, benchmarks/, tests), beside run_benchmark
__all__ = ["DEFAULT_PRESET", "GREEDY", "METHODS", "PRESETS", "BenchPreset", "BenchProgress", "ForwardCounter", "Run",
           "Sampling", "all_identical", "cycle_costs", "first_difference", "run_benchmark", "timed_generation"]


@dataclass(frozen=True)
class BenchPreset:
    """A named set of bench settings (``hf-dflash bench --preset NAME``); an explicit flag overrides each."""

    datasets: tuple[str, ...]
    max_new_tokens: int
    summary: str  # one line for ``--help``


# What `hf-dflash bench` runs without --preset, --datasets or --max-new-tokens.
DEFAULT_PRESET = BenchPreset(DATASETS, 256, "short questions")
# Kept out of the default datasets: every method's prefill of each 2K-8K-token prompt makes a CPU run long.
PRESETS: dict[str, BenchPreset] = {
    "long-documents": BenchPreset(
        tuple(name for name, tokens in CONTEXT_LENGTHS.items() if 2048 <= tokens <= 8192), 256,
        "a question after 2K-8K tokens of documents"),
}


# ----------------------------------------------------------------------------------------------------------------------
# the benchmark: run, check, summarise
def run_benchmark(target, tokenizer, drafter, prompts: dict[str, list[str]], methods: list[str] = METHODS,
                  max_new_tokens: int = DEFAULT_PRESET.max_new_tokens, early_exit_layer: int | None = None,
                  warmup: bool = True, repeats: int = 1, progress: str | os.PathLike | None = None,
                  sampling: Sampling = GREEDY) -> dict:
    """Run every method on every prompt (interleaved, rotating order) and return the JSON-ready report.

    Args:
        prompts: dataset name -> user messages (chat template applied here).
        methods: subset of :data:`METHODS`; ``plain`` is always run (the reference).
        repeats: rounds over each dataset's prompts; each method's faster run of a prompt counts (one 64-token run
            moves by ~10% on a shared machine; a load spike only ever slows a run).
        progress: a JSON-lines file that records each finished prompt round; a rerun with the same file and
            settings skips what it holds (see :class:`BenchProgress`).
        sampling: greedy (every output checked against plain's), or sampled (:class:`Sampling`: every method of a
            prompt round seeded alike; timed, not compared: the tests prove the law).

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
    config = bench_config(target, drafter, encoded, methods, max_new_tokens, repeats, early_exit_layer, sampling)
    journal = None if progress is None else BenchProgress(progress, config)  # other settings: refused before any run

    results = timed_results(target, drafter, encoded, methods, max_new_tokens, early_exit_layer, warmup, repeats,
                            journal, sampling)
    for difference in differences_from_plain(results, methods):
        logger.warning(difference)
    machine = {**run_stamp(target.device, load_before), "other_load_cores": other_load.cores()}
    return bench_report(machine, config, results, methods)


def timed_results(target, drafter, encoded: dict[str, list[torch.Tensor]], methods: list[str], max_new_tokens: int,
                  early_exit_layer: int, warmup: bool, repeats: int, journal: BenchProgress | None,
                  sampling: Sampling = GREEDY) -> list[PromptResult]:
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
                timed_generation(target, first, min(8, max_new_tokens), method, drafter, early_exit_layer, counter,
                                 sampling, sampling.seed)
        results: list[PromptResult] = []
        with tqdm(total=repeats * sum(len(batch) for batch in encoded.values()), desc="bench", unit="prompt") as bar:
            for name, batch in encoded.items():
                dataset = [PromptResult(name, index, ids.shape[1], sampled=not sampling.greedy)
                           for index, ids in enumerate(batch)]
                for round_ in range(repeats):
                    for result, ids in zip(dataset, batch):
                        bar.set_postfix_str(f"{name} #{result.index}" + (f" round {round_ + 1}" if repeats > 1 else ""))
                        key = (name, result.index, round_)
                        runs = None if journal is None else journal.done.get(key)
                        if runs is None:
                            shift = (len(results) + result.index + round_) % len(methods)
                            seed = sampling.seed + 1000 * (len(results) + result.index) + round_  # alike per round
                            runs = {method: timed_generation(target, ids, max_new_tokens, method, drafter,
                                                             early_exit_layer, counter, sampling, seed)
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

