# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""GPU benchmark of hf-dflash: lossless checks and side-by-side timings at the Qwen3-8B shape, bf16 first, fp32 beside.

A Qwen3-8B-shaped target (36 layers, hidden 4096, vocab 151936) with random weights (the GPU machine has no network)
and a 5-layer block-16 DFlash drafter sized for it. Random weights give random drafts, so a scripted oracle sets the
acceptance: the drafter still runs its forward, then its drafts are replaced by plain ``generate``'s own continuation,
right or wrong by the law of a per-draft rate ``rate_for_tau(tau)`` (:class:`ScriptedDrafts`). The same oracle drives
transformers' built-in DFlash generator (``speculation_type="dflash"``: its ``get_candidates`` is wrapped the same
way), so both loops are compared at the same acceptance, cycle for cycle. The oracle proposes one path: trees cannot
gain under it and are left out of the scripted tables (the real-model rows show them).

Peaked logits. A random target's logits are all near-ties (its top-2 gap is a few bf16 rounding steps), so in bf16 a
16-row verify and a 1-row plain step pick different argmaxes and scripted acceptance collapses. Scaling the LM head
does not help (gap and rounding error scale together); instead the timed target is made peaked without changing a
single shape or kernel: the embeddings get a large norm (std ``EMBEDDING_STD``) and the LM head's row of token
``next(x)`` is the embedding of ``x`` (``next``: one random cycle through the vocabulary), so the embedding carried by
the residual stream decides the argmax by a wide margin. The fraction of plain's steps whose top-2 gap is within
``NEAR_TIE_STEPS`` bf16 steps is measured and reported (it should be 0). Such a target's next token depends on the
current token only, so the fp32 check that must catch cache, position and mask faults runs first on the untouched
random target (context-dependent, chaotic logits). Its text never repeats the prompt, so prompt lookup finds little to
copy: its rows show what it costs at tau ~1.

Phases (each method and shape is warmed by one untimed call before it is timed; methods of a shape are interleaved
A B C A B C ..., ``--repeats`` rounds, median; CUDA events on CUDA, a synchronised perf_counter on CPU):

1. ``check``: random fp32 target, plain vs ours (full blocks, default policy): identical (exit 1 if not).
2. ``fp32``: peaked fp32 target, plain vs ours at the top tau level.
3. ``bf16`` (the headline): plain eager; plain with a static cache (compiled automatically by transformers on CUDA;
   its first call, compile included, is reported apart); prompt lookup; ours (full blocks, default policy) and
   transformers' DFlash at each tau level; ``--extra-method`` rows.
4. ``long``: bf16 after prompts of ``--context-lengths`` tokens: plain vs ours, peak memory (the
   ``torch.cuda.max_memory_allocated`` of each call, reset before it).
5. ``static``: transformers' DFlash and prompt lookup on a static cache (compiled on CUDA) at the top tau level,
   skipped once ``--budget-seconds`` is spent. Their cache is a ``StaticCache`` passed in, with room for a block of
   drafts past ``max_length`` (STATIC_ASSISTED).

Per cycle of ours (``drafter.last_stats``): drafter ms, verify ms and the rest of the loop (commit, policy); for
transformers' DFlash the drafter's ms (its ``get_candidates``, synchronised) and the target's share. Each baseline that
fails is reported with its error; the run goes on. Checks (exit 1): fp32 output identical to plain; a bf16 output that
differs from plain where plain's top-2 gap is not a near-tie.

Budget at the 8B shape on an H200, counted from the first run's costs (eager ~30 ms per plain step, a 16-row verify
~36 ms, the drafter 8-10 ms, prefill of 32K tokens seconds): ~190 s of calls (check 4, fp32 25, bf16 70, long 55,
static 25) plus torch.compile's compiles (plain with a static cache in ``bf16``; transformers' DFlash and prompt lookup
in ``static``, which starts only before ``--budget-seconds``); ``--quick`` ~60 s plus the compiles; ``--no-static``
leaves every compile out.

    bash benchmarks/gpu_check.sh                                          # CUDA: -> benchmarks/gpu_check.json
    python benchmarks/gpu_check.py --device cuda --quick --json gpu_quick.json
    python benchmarks/gpu_check.py --tiny --device cpu --json gc.json   # a smoke run of the script (~30 s)
"""

import argparse
import contextlib
import copy
import dataclasses
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM, StaticCache

import hf_dflash
from hf_dflash.cache_dflash import cache_argument
from hf_dflash.candidates_dflash import DFlashCandidateGenerator
from hf_dflash.evaluation.bench import ForwardCounter, first_difference
from hf_dflash.evaluation.machine import load_average, run_stamp
from hf_dflash.evaluation.near_ties import logit_ulp
from hf_dflash.timing_dflash import synchronized_clock

QWEN3_8B = dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                num_key_value_heads=8, head_dim=128, vocab_size=151936)
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, vocab_size=512)
BLOCK_SIZE = 16
PROMPT_LOOKUP_TOKENS = 10
# The peaked target: embedding std (default init 0.02; each random layer adds ~2.3 rms to the residual stream at the
# 8B shape, ~14 over 36 layers) and the top logit's rough size.
EMBEDDING_STD = 8.0
TOP_LOGIT = 30.0
NEAR_TIE_STEPS = 8  # a top-2 gap within this many bf16 rounding steps of the top logit (~3%) is a near-tie
STATIC_ASSISTED = ("transformers' DFlash and prompt lookup get a StaticCache of max_cache_len = prompt + new tokens + "
                   "block, reset before each call: with cache_implementation='static' transformers 5.25 sizes the "
                   "cache to max_length - 1 and their verify writes past it (IndexError: index_copy_() out of bounds "
                   "on CPU; on CUDA an out-of-bounds index_copy_ can be a device-side assert that ends the process), "
                   "so that form is not run")
TREES = ("left out of the scripted tables: the oracle proposes one path, so a tree verifies more rows for the same "
         "accepted tokens; the real-model rows show trees")


@dataclasses.dataclass(frozen=True)
class Sizes:
    """How much each phase runs: prompt and new tokens of the headline, rounds, tau levels, long prompts."""

    prompt_length: int
    new_tokens: int
    check_tokens: int
    long_new_tokens: int
    repeats: int
    long_repeats: int
    taus: tuple[float, ...]
    context_lengths: tuple[int, ...]


FULL = Sizes(512, 128, 64, 64, 3, 2, (4.0, 6.5, 7.5), (512, 8192, 32768))
QUICK = Sizes(512, 64, 48, 32, 2, 1, (7.5,), (512, 8192))
SMOKE = Sizes(32, 32, 24, 16, 2, 1, (4.0, 6.5, 7.5), (64, 256))


def rate_for_tau(tau: float, block: int = BLOCK_SIZE) -> float:
    """The per-draft acceptance rate a with expected tau = (1 - a^block) / (1 - a) (every draft of a block right
    with probability a, independently).

    Example:
        >>> round(rate_for_tau(7.5), 4), rate_for_tau(1.0)
        (0.8858, 0.0)
    """
    low, high = 0.0, 0.9999
    for _ in range(60):
        mid = (low + high) / 2
        if (1 - mid**block) / (1 - mid) < tau:
            low = mid
        else:
            high = mid
    return low


# ----------------------------------------------------------------------------------------------------------------------
# models
def random_target(shape: dict, device: torch.device, seed: int = 0) -> Qwen3ForCausalLM:
    """A Qwen3 target of `shape` with random weights, fp32, on `device`; no end-of-sequence token (so every call
    runs to its max_new_tokens)."""
    torch.manual_seed(seed)
    config = Qwen3Config(**shape, max_position_embeddings=40960, tie_word_embeddings=False)
    with torch.device(device):
        target = Qwen3ForCausalLM(config).eval().requires_grad_(False)
    target.generation_config.eos_token_id = None
    target.generation_config.pad_token_id = 0
    return target


def drafter_for(target, num_layers: int, device: torch.device, dtype: torch.dtype):
    """A freshly initialised block-16 DFlash drafter of `num_layers` layers sized for `target` (initialised on
    `device`: a billion weights at the 8B shape; on the CPU if that fails)."""
    torch.manual_seed(1)
    try:
        with torch.device(device):
            drafter = hf_dflash.DFlashDraftModel.from_target(target, num_hidden_layers=num_layers,
                                                            block_size=BLOCK_SIZE)
    except (RuntimeError, TypeError):
        drafter = hf_dflash.DFlashDraftModel.from_target(target, num_hidden_layers=num_layers, block_size=BLOCK_SIZE)
    return drafter.to(device, dtype).eval().requires_grad_(False)


@torch.no_grad()
def make_peaked(target, seed: int = 3) -> dict:
    """Make `target`'s greedy argmax decided by a wide margin, in place: embeddings of std EMBEDDING_STD, and the LM
    head row of ``next(x)`` set to the embedding of ``x`` (``next``: one random cycle through the vocabulary), scaled
    so the top logit is about TOP_LOGIT. No shape changes: every forward costs what it did. Returns what was done."""
    embed = target.get_input_embeddings().weight
    head = target.get_output_embeddings().weight
    generator = torch.Generator(device=embed.device).manual_seed(seed)
    vocab, hidden = embed.shape
    embed.normal_(0.0, EMBEDDING_STD, generator=generator)
    order = torch.randperm(vocab, generator=generator, device=embed.device)
    successor = torch.empty_like(order)
    successor[order] = order.roll(-1)
    head[successor] = embed * (TOP_LOGIT / (hidden * EMBEDDING_STD))
    return {"embedding_std": EMBEDDING_STD, "lm_head": "row next(x) = embedding(x), one random cycle through the "
            "vocabulary", "top_logit_target": TOP_LOGIT}


def logit_margins(logits: list[torch.Tensor]) -> dict:
    """Top-2 gaps of plain's steps (its ``output_logits``): the fraction that are near-ties in bf16 (gap within
    NEAR_TIE_STEPS bf16 steps of the top logit), the smallest gap, medians."""
    tops = torch.cat([step.float() for step in logits]).topk(2, dim=-1).values  # [steps, 2]
    gaps = (tops[:, 0] - tops[:, 1]).tolist()
    steps = [gap / logit_ulp(top, torch.bfloat16) for gap, top in zip(gaps, tops[:, 0].tolist())]
    return {"steps": len(gaps), "near_tie_fraction": sum(s <= NEAR_TIE_STEPS for s in steps) / max(1, len(steps)),
            "min_gap": min(gaps), "median_gap": statistics.median(gaps),
            "median_top_logit": statistics.median(tops[:, 0].tolist()), "min_gap_in_bf16_steps": min(steps)}


def difference_at(logits: list[torch.Tensor], got: list[int], reference: list[int]) -> dict | None:
    """Where `got` first differs from plain's `reference`, and whether plain's own logits there make it a near-tie
    (the two tokens plain's top two, their gap within NEAR_TIE_STEPS bf16 steps). None: identical."""
    at = first_difference(got, reference)
    if at is None:
        return None
    if at >= min(len(got), len(reference), len(logits)):
        return {"index": at, "near_tie": False, "why": "lengths differ"}
    step = logits[at][0].float()
    taken, plain = got[at], reference[at]
    top2 = step.topk(2).indices.tolist()
    gap, are_top2 = float(step[plain] - step[taken]), sorted(top2) == sorted([taken, plain])
    return {"index": at, "tokens": [taken, plain], "gap": gap, "are_top2": are_top2,
            "near_tie": are_top2 and gap <= NEAR_TIE_STEPS * logit_ulp(float(step[plain]), torch.bfloat16)}


# ----------------------------------------------------------------------------------------------------------------------
# the scripted oracle
class ScriptedDrafts:
    """Replaces the drafts of both DFlash loops (ours: ``DFlashCandidateGenerator.propose``; transformers':
    ``DFlashTokenCandidateGenerator.get_candidates``) with plain's `continuation` (the new tokens after a
    `prompt_length`-token prompt). In the i-th drafting cycle of a call the first N drafts are right and the rest
    wrong, N = min(block - 1, floor(log u_i / log rate)): the law of drafts each right with probability `rate`
    independently (P(N >= k) = rate^k, expected tau = (1 - rate^block) / (1 - rate)), with u_i = frac((i + 1) x
    golden ratio) instead of random draws, so that a call of ~20 cycles already averages close to tau, and two loops
    that commit the same tokens get the same acceptance cycle for cycle. The drafter's forward still runs. Counts
    the cycles and (transformers' loop) their synchronised seconds; ours count theirs in ``drafter.last_stats``.

    Example:
        >>> oracle = ScriptedDrafts([5, 6, 7, 8, 9], prompt_length=2, rate=1.0, vocab=10)
        >>> oracle.script(3, 3)  # after the prompt and the first new token (the anchor): new tokens 1..3
        [6, 7, 8]
        >>> ScriptedDrafts([5, 6, 7, 8, 9], prompt_length=2, rate=0.0, vocab=10).script(3, 3)
        [7, 8, 9]
    """

    def __init__(self, continuation: list[int], prompt_length: int, rate: float, vocab: int):
        self.continuation, self.prompt_length, self.rate, self.vocab = continuation, prompt_length, rate, vocab
        self.cycles, self.draft_seconds = 0, 0.0

    def right_drafts(self) -> int:
        """How many leading drafts the next cycle gets right."""
        u = ((self.cycles + 1) * 0.6180339887498949) % 1.0
        if self.rate <= 0.0:
            return 0
        return BLOCK_SIZE - 1 if self.rate >= 1.0 else min(BLOCK_SIZE - 1, int(math.log(u) / math.log(self.rate)))

    def script(self, length: int, count: int) -> list[int]:
        """The next cycle's `count` drafts after a sequence of `length` tokens (prompt, committed tokens, anchor)."""
        done = length - self.prompt_length  # drafts start at new token `done` (the anchor is new token done - 1)
        right = self.right_drafts()
        self.cycles += 1
        drafts = []
        for j in range(count):
            token = self.continuation[done + j] if done + j < len(self.continuation) else 0
            drafts.append(token if j < right else (token + 1) % self.vocab)
        return drafts

    @contextlib.contextmanager
    def installed(self):
        ours = DFlashCandidateGenerator.propose
        theirs_class = builtin_generator_class()
        theirs = theirs_class.get_candidates if theirs_class is not None else None
        oracle = self

        def propose(generator, histories, context, context_positions, anchor_positions, slot_mask=None,
                    num_drafts=None):
            drafts, scores = ours(generator, histories, context, context_positions, anchor_positions, slot_mask,
                                  num_drafts)
            scripted = [oracle.script(len(history), drafts.shape[1]) for history in histories]
            drafts = torch.tensor(scripted, dtype=drafts.dtype).to(drafts.device, non_blocking=True)
            mass = torch.full_like(scores, float("-inf")).scatter_(2, drafts[..., None].to(scores.device), 0.0)
            return drafts, mass

        def get_candidates(generator, input_ids, *args, **kwargs):
            start = synchronized_clock(input_ids.device)
            candidates, logits = theirs(generator, input_ids, *args, **kwargs)
            count = candidates.shape[1] - input_ids.shape[1]
            if count > 0:
                scripted = torch.tensor([oracle.script(input_ids.shape[1], count)], dtype=candidates.dtype)
                candidates = torch.cat([input_ids, scripted.to(candidates.device)], dim=1)
                oracle.draft_seconds += synchronized_clock(input_ids.device) - start
            return candidates, logits

        DFlashCandidateGenerator.propose = propose
        if theirs_class is not None:
            theirs_class.get_candidates = get_candidates
        try:
            yield self
        finally:
            DFlashCandidateGenerator.propose = ours
            if theirs_class is not None:
                theirs_class.get_candidates = theirs


def builtin_generator_class():
    """transformers' DFlash candidate generator class (5.25), None where this transformers has none."""
    from transformers.generation import candidate_generator

    return getattr(candidate_generator, "DFlashTokenCandidateGenerator", None)


class PolicyMemories:
    """Each of our methods keeps its own memory of the cost-aware policy (which carries what it learned of a drafter
    from call to call): interleaved tau levels must not teach each other. A method's first call (its warm-up) starts
    from nothing."""

    def __init__(self):
        self.saved: dict[str, dict] = {}

    @contextlib.contextmanager
    def of(self, method: "Method"):
        try:
            from hf_dflash.policy_dflash import policy_memory
        except ImportError:
            policy_memory = None
        if not method.ours or policy_memory is None:
            yield
            return
        memory = policy_memory(method.kwargs["assistant_model"])
        memory.clear()
        memory.update(copy.deepcopy(self.saved.get(method.key, {})))
        try:
            yield
        finally:
            self.saved[method.key] = copy.deepcopy(memory)


# ----------------------------------------------------------------------------------------------------------------------
# methods and timed calls
@dataclasses.dataclass
class Method:
    """One timed configuration: `kwargs` for ``generate``; `tau` the scripted level (None: no oracle); `builtin`
    runs inside ``hf_dflash.builtin_generation()``; `ours` reads ``drafter.last_stats``."""

    name: str
    kwargs: dict
    tau: float | None = None
    builtin: bool = False
    ours: bool = False
    count_forwards: bool = False  # hooks on the target: only where its forward is not compiled
    static_cache_with_room: bool = False  # pass a StaticCache with room for a block of drafts (STATIC_ASSISTED)

    @property
    def key(self) -> str:
        return self.name if self.tau is None else f"{self.name}@{self.tau:g}"


PLAIN = Method("plain", {})
PLAIN_STATIC = Method("plain_static", {"cache_implementation": "static"})  # compiled by transformers on CUDA
PROMPT_LOOKUP = Method("pld", {"prompt_lookup_num_tokens": PROMPT_LOOKUP_TOKENS})


def ours_methods(drafter, taus, extra: dict[str, dict] | None = None, builtin: bool = True) -> list[Method]:
    """At each tau level: ours with full blocks and with the default policy, the `extra` rows of ours, and
    (`builtin`) transformers' DFlash."""
    methods = []
    for tau in taus:
        methods += [Method("ours_full", {"assistant_model": drafter, "dflash_policy": "full"}, tau, ours=True),
                    Method("ours_default", {"assistant_model": drafter}, tau, ours=True)]
        methods += [Method(name, {"assistant_model": drafter, **kwargs}, tau, ours=True)
                    for name, kwargs in (extra or {}).items()]
        if builtin:
            methods.append(Method("builtin", {"assistant_model": drafter, "speculation_type": "dflash"}, tau,
                                  builtin=True, count_forwards=True))
    return methods


class Clock:
    """Seconds of GPU work between two points: CUDA events on CUDA, a synchronised perf_counter elsewhere."""

    def __init__(self, device: torch.device):
        self.device = device

    def start(self):
        if self.device.type == "cuda":
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return synchronized_clock(self.device)

    def seconds_since(self, start) -> float:
        if self.device.type == "cuda":
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3
        return synchronized_clock(self.device) - start


def compiled_graphs() -> int | None:
    """Graphs torch.compile has built in this process so far (None: not available): a rise while timing is a
    recompile inside a timed call."""
    try:
        from torch._dynamo.utils import counters
    except ImportError:
        return None
    return int(counters["stats"]["unique_graphs"])


_STATIC_CACHES: dict[tuple, StaticCache] = {}


def static_cache_with_room(target, length: int) -> dict:
    """``{cache keyword: a StaticCache of `length` slots}``, the same object for the same target, dtype and length
    (compiled calls keep their buffers' addresses), reset."""
    key = (id(target), target.dtype, length)
    if key not in _STATIC_CACHES:
        _STATIC_CACHES[key] = StaticCache(config=target.config, max_cache_len=length)
    _STATIC_CACHES[key].reset()
    return {cache_argument(target): _STATIC_CACHES[key]}


@contextlib.contextmanager
def counted_lookups(method: "Method"):
    """Counts the calls of transformers' prompt-lookup generator (one per target forward) during a prompt-lookup
    call: ``{"calls": n}``, or None for other methods."""
    from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

    if "prompt_lookup_num_tokens" not in method.kwargs or method.ours:
        yield None
        return
    original, counter = PromptLookupCandidateGenerator.get_candidates, {"calls": 0}

    def get_candidates(generator, *args, **kwargs):
        counter["calls"] += 1
        return original(generator, *args, **kwargs)

    PromptLookupCandidateGenerator.get_candidates = get_candidates
    try:
        yield counter
    finally:
        PromptLookupCandidateGenerator.get_candidates = original


def call(target, ids, new_tokens: int, method: Method, clock: Clock, oracle: ScriptedDrafts | None) -> dict:
    """One timed ``generate`` of `method`: new tokens, seconds, peak memory, and what the method measured."""
    device = ids.device
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device) if device.type == "cuda" else None
    counter = ForwardCounter(target) if method.count_forwards else None
    scripted = oracle.installed() if oracle is not None else contextlib.nullcontext()
    routing = hf_dflash.builtin_generation() if method.builtin else contextlib.nullcontext()
    try:
        # no inference_mode around generate: a user's call runs under generate's own no_grad, and so do these
        with scripted, routing, counted_lookups(method) as lookups:
            kwargs = dict(method.kwargs)
            if method.static_cache_with_room:
                kwargs.update(static_cache_with_room(target, ids.shape[1] + new_tokens + BLOCK_SIZE))
            start = clock.start()
            out = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                                  do_sample=False, **kwargs)
            seconds = clock.seconds_since(start)
    finally:
        if counter is not None:
            counter.remove()
    sample = {"tokens": out[0, ids.shape[1]:].tolist(), "seconds": seconds}
    if device.type == "cuda":
        sample["peak_bytes"] = torch.cuda.max_memory_allocated(device)
        sample["peak_extra_bytes"] = sample["peak_bytes"] - before
    if lookups is not None:
        sample["lookup_calls"] = lookups["calls"]
    if counter is not None:
        sample["target_forwards"] = counter.calls
        sample["prefill_seconds"] = counter.first_seconds
    if method.ours:
        stats = method.kwargs["assistant_model"].last_stats
        sample["stats"] = {"cycles": stats.num_verifications, "tau": stats.mean_acceptance_length,
                           "prefill_seconds": stats.prefill_seconds, "draft_seconds": stats.draft_seconds,
                           "verify_seconds": stats.verify_seconds, "total_seconds": stats.total_seconds,
                           "plain_steps": sum(1 for n in stats.drafts_per_cycle if n == 0),
                           "lookup_cycles": stats.lookup_cycles}
    if oracle is not None:
        sample["scripted_cycles"] = oracle.cycles
    if method.builtin and oracle is not None:
        sample["builtin"] = {"cycles": oracle.cycles, "draft_seconds": oracle.draft_seconds}
    return sample


def oracle_for(method: Method, reference: list[int], prompt_length: int, vocab: int) -> ScriptedDrafts | None:
    return None if method.tau is None else ScriptedDrafts(reference, prompt_length, rate_for_tau(method.tau), vocab)


def interleaved(target, ids, new_tokens: int, methods: list[Method], repeats: int, clock: Clock,
                reference: list[int], note, warmed: dict[str, dict] | None = None) -> dict[str, dict]:
    """Warm every method with one untimed call of this shape (`warmed`: {key: sample} of calls already made), then
    `repeats` rounds A B C ... (the order rotated each round); a method that raises is reported with its error and
    dropped. Returns {key: {"warm": sample, "runs": [samples]}}, and with each the graphs torch.compile built during
    this shape's timed rounds (0: no recompile was timed)."""
    vocab, prompt_length = target.config.vocab_size, ids.shape[1]
    results, memories = {key: {"warm": sample, "runs": []} for key, sample in (warmed or {}).items()}, PolicyMemories()

    def attempt(method: Method) -> dict | None:
        try:
            with memories.of(method):
                return call(target, ids, new_tokens, method, clock, oracle_for(method, reference, prompt_length, vocab))
        except Exception as error:  # a baseline this image cannot run is a result, not the end of the run
            results[method.key] = {"error": f"{type(error).__name__}: {error}"[:600]}
            note(f"  {method.key}: FAILED {results[method.key]['error'][:200]}")
            if ids.device.type == "cuda":
                torch.cuda.empty_cache()
            return None

    for method in methods:
        if method.key not in results and (warm := attempt(method)) is not None:
            results[method.key] = {"warm": warm, "runs": []}
    graphs = compiled_graphs()
    for round_ in range(repeats):
        live = [method for method in methods if "error" not in results.get(method.key, {"error": None})]
        shift = round_ % max(1, len(live))
        for method in live[shift:] + live[:shift]:
            if "error" not in results[method.key] and (sample := attempt(method)) is not None:
                results[method.key]["runs"].append(sample)
    after = compiled_graphs()
    for result in results.values():
        result["graphs_built_while_timed"] = None if graphs is None else after - graphs
    return results


# ----------------------------------------------------------------------------------------------------------------------
# rows
def median_of(runs: list[dict], pick) -> float | None:
    values = [pick(run) for run in runs]
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def cycle_breakdown(runs: list[dict], method: Method) -> dict:
    """Per cycle (medians over runs): drafter ms, verify ms, the rest; tau and cycles."""
    if method.ours:
        def per_cycle(field):
            return median_of(runs, lambda r: 1e3 * r["stats"][field] / max(1, r["stats"]["cycles"]))
        loop_rest = median_of(runs, lambda r: 1e3 * (r["stats"]["total_seconds"] - r["stats"]["prefill_seconds"]
                                                       - r["stats"]["draft_seconds"] - r["stats"]["verify_seconds"])
                              / max(1, r["stats"]["cycles"]))
        return {"tau": median_of(runs, lambda r: r["stats"]["tau"]), "cycles": median_of(runs, lambda r: r["stats"]
                ["cycles"]), "draft_ms": per_cycle("draft_seconds"), "verify_ms": per_cycle("verify_seconds"),
                "rest_ms": loop_rest, "prefill_ms": median_of(runs, lambda r: 1e3 * r["stats"]["prefill_seconds"]),
                "outside_loop_ms_per_call": median_of(runs, lambda r: 1e3 * (r["seconds"]
                                                                             - r["stats"]["total_seconds"])),
                "plain_steps": median_of(runs, lambda r: r["stats"]["plain_steps"]),
                "lookup_cycles": median_of(runs, lambda r: r["stats"]["lookup_cycles"])}
    row = {}
    if method.count_forwards:
        row["tau"] = median_of(runs, lambda r: (len(r["tokens"]) - 1) / max(1, r["target_forwards"] - 1))
        row["prefill_ms"] = median_of(runs, lambda r: r["prefill_seconds"] and 1e3 * r["prefill_seconds"])
    if method.builtin:
        def target_and_rest(r):  # without a forward counter (a compiled target) the prefill stays in
            return (r["seconds"] - (r.get("prefill_seconds") or 0.0) - r["builtin"]["draft_seconds"]) / max(
                1, r["builtin"]["cycles"])

        row.update(cycles=median_of(runs, lambda r: r["builtin"]["cycles"]),
                   draft_ms=median_of(runs, lambda r: 1e3 * r["builtin"]["draft_seconds"]
                                      / max(1, r["builtin"]["cycles"])),
                   target_and_rest_ms=median_of(runs, lambda r: 1e3 * target_and_rest(r)),
                   target_and_rest_includes_prefill=not method.count_forwards,
                   tau=median_of(runs, lambda r: (len(r["tokens"]) - 1) / max(1, r["builtin"]["cycles"])))
    if runs and "lookup_calls" in runs[0]:
        row["tau"] = median_of(runs, lambda r: len(r["tokens"]) / max(1, r["lookup_calls"]))
    if method.name.startswith("plain"):
        row["tau"] = 1.0
    return row


def rows_of(phase: str, dtype: torch.dtype, prompt_length: int, new_tokens: int, repeats: int,
            methods: list[Method], results: dict, reference: list[int], logits: list[torch.Tensor]) -> list[dict]:
    """One row per method with its conditions, median seconds, speedups over plain eager (and plain static), the
    per-cycle breakdown, peak memory and the output check."""
    name = str(dtype).removeprefix("torch.")
    medians = {key: median_of(r.get("runs", []), lambda s: s["seconds"]) for key, r in results.items()}
    plain, static = medians.get("plain"), medians.get("plain_static")
    peaks = {key: median_of(r.get("runs", []), lambda s: s.get("peak_bytes")) for key, r in results.items()}
    rows = []
    for method in methods:
        result = results.get(method.key)
        if result is None:
            continue
        row = {"phase": phase, "dtype": name, "prompt_tokens": prompt_length, "new_tokens": new_tokens,
               "method": method.name, "tau_scripted": method.tau,
               "acceptance_rate_per_draft": None if method.tau is None else rate_for_tau(method.tau),
               "generate_kwargs": {k: v for k, v in method.kwargs.items() if k != "assistant_model"},
               "static_cache_with_room": method.static_cache_with_room,
               "repeats": repeats}
        if "error" in result:
            rows.append({**row, "error": result["error"]})
            continue
        runs, seconds = result["runs"], medians[method.key]
        row.update(seconds=seconds, seconds_all=[r["seconds"] for r in runs], ms_per_token=1e3 * seconds / new_tokens,
                   speedup_vs_plain=plain / seconds if plain else None,
                   speedup_vs_plain_static=static / seconds if static else None,
                   first_call_seconds=result["warm"]["seconds"],
                   graphs_built_while_timed=result.get("graphs_built_while_timed"),
                   peak_bytes=peaks[method.key],
                   peak_extra_bytes=median_of(runs, lambda s: s.get("peak_extra_bytes")),
                   peak_over_plain=peaks[method.key] / peaks["plain"] if peaks.get("plain") and peaks[method.key]
                   else None,
                   **cycle_breakdown(runs, method))
        if method.tau is not None:
            row["scripted_cycles"] = median_of(runs, lambda r: r["scripted_cycles"])
        differences = [difference_at(logits, run["tokens"], reference) for run in [result["warm"], *runs]]
        first = next((d for d in differences if d is not None), None)
        row.update(identical=first is None, first_difference=first)
        rows.append(row)
    return rows


# ----------------------------------------------------------------------------------------------------------------------
# phases
class Run:
    """The run's report, written after every phase (a run cut short still leaves what it measured), its clock, and
    its log lines."""

    def __init__(self, args, device: torch.device, sizes: Sizes, shape: dict):
        self.args, self.device, self.sizes, self.shape = args, device, sizes, shape
        self.clock, self.began, self.load_before = Clock(device), time.perf_counter(), load_average()
        self.target_name = f"{'tiny' if shape is TINY else 'Qwen3-8B-shaped'} random Qwen3 (peaked from phase fp32 on)"
        self.report = {"finished": False, "ok": True, "failures": [], "warnings": [], "checks": [], "margins": {},
                       "rows": [], "skipped": [], "trees": TREES,
                       "conditions": {"device": str(device), "shape": shape, "drafter_layers": args.drafter_layers,
                                      "block_size": BLOCK_SIZE, "sizes": dataclasses.asdict(sizes),
                                      "timing": "CUDA events" if device.type == "cuda" else "synchronised perf_counter",
                                      "order": "every method warmed by one untimed call of the shape, then rounds "
                                               "A B C ... rotated each round; median",
                                      "oracle": "one-path scripted drafts (ScriptedDrafts): plain's continuation, "
                                                "the first N of each cycle right, N by the law of a per-draft rate "
                                                "rate_for_tau(tau) drawn along a golden-ratio sequence; drives ours "
                                                "and transformers' DFlash",
                                      "peaked_target": None, "compiled_static_plain": device.type == "cuda",
                                      "static_cache_of_assisted_baselines": STATIC_ASSISTED,
                                      "hub_kernels": "none: models built from a config, no from_pretrained"}}

    def elapsed(self) -> float:
        return time.perf_counter() - self.began

    def note(self, line: str) -> None:
        print(f"[{self.elapsed():6.1f}s] {line}", flush=True)

    def fail(self, why: str) -> None:
        self.report["ok"] = False
        self.report["failures"].append(why)
        self.note(f"FAILED: {why}")

    def save(self) -> None:
        self.report["wall_seconds"] = round(self.elapsed(), 1)
        self.report["machine"] = stamp(self.device, self.load_before)
        if self.args.json:
            Path(self.args.json).write_text(json.dumps(self.report, indent=2) + "\n", encoding="utf-8")

    def prompt(self, length: int) -> torch.Tensor:
        generator = torch.Generator(device=self.device).manual_seed(2 + length)
        return torch.randint(0, self.shape["vocab_size"], (1, length), device=self.device, generator=generator)

    def reference(self, target, ids, new_tokens: int) -> tuple[dict, list[torch.Tensor]]:
        """Plain greedy's call (its new tokens and seconds: plain's warm-up for this shape) and its logits at each
        step."""
        start = self.clock.start()
        out = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, do_sample=False,
                              output_logits=True, return_dict_in_generate=True)
        seconds = self.clock.seconds_since(start)
        sample = {"tokens": out.sequences[0, ids.shape[1]:].tolist(), "seconds": seconds}
        return sample, [step.float().cpu() for step in out.logits]

    def measure(self, phase, target, dtype, length, new_tokens, repeats, methods) -> list[dict]:
        ids = self.prompt(length)
        plain, logits = self.reference(target, ids, new_tokens)
        reference = plain["tokens"]
        margins = logit_margins(logits)
        self.report["margins"][f"{phase}/{length}"] = margins
        self.note(f"{phase} {length}-token prompt: plain's near-tie fraction {margins['near_tie_fraction']:.3f}, "
                  f"smallest gap {margins['min_gap_in_bf16_steps']:.1f} bf16 steps")
        if margins["near_tie_fraction"] > 0.01:
            self.report["warnings"].append(f"{phase}/{length}: {margins['near_tie_fraction']:.1%} of plain's steps are "
                                           "near-ties: scripted acceptance may collapse in bf16")
            self.note(f"WARNING: {self.report['warnings'][-1]}")
        results = interleaved(target, ids, new_tokens, methods, repeats, self.clock, reference, self.note,
                              warmed={"plain": plain})
        rows = [{"device": str(self.device), "target": self.target_name, **row}
                for row in rows_of(phase, dtype, length, new_tokens, repeats, methods, results, reference, logits)]
        for row in rows:
            self.check(row, dtype)
            self.note(f"  {row_line(row)}")
        self.report["rows"] += rows
        self.save()
        return rows

    def check(self, row: dict, dtype: torch.dtype) -> None:
        if "error" in row:
            return
        where = f"{row['phase']} {row['dtype']} {row['prompt_tokens']} {row['method']}@{row['tau_scripted']}"
        if row["tau_scripted"] is not None and not row["scripted_cycles"]:
            self.fail(f"{where}: the oracle scripted no drafts (the loop no longer calls what it wraps?): its tau is "
                      "not the scripted one")
        if row["identical"]:
            return
        if dtype == torch.float32:
            self.fail(f"{where}: fp32 output differs from plain at {row['first_difference']}")
        elif not row["first_difference"].get("near_tie"):
            self.fail(f"{where}: bf16 output differs from plain where plain's top-2 is not a near-tie: "
                      f"{row['first_difference']}")

    def over_budget(self, phase: str) -> bool:
        if self.elapsed() <= self.args.budget_seconds:
            return False
        self.report["skipped"].append(f"{phase}: the run had used {self.elapsed():.0f} s of its "
                                      f"--budget-seconds {self.args.budget_seconds:g}")
        self.note(f"skipped {phase}: over the time budget")
        return True


def stamp(device, load_before) -> dict:
    """run_stamp plus what decides GPU numerics."""
    result = run_stamp(device, load_before)
    result.update(cuda=torch.version.cuda, float32_matmul_precision=torch.get_float32_matmul_precision(),
                  matmul_allow_tf32=torch.backends.cuda.matmul.allow_tf32,
                  use_hub_kernels_env=os.environ.get("USE_HUB_KERNELS"))
    return result


def parse_extra(values: list[str]) -> dict[str, dict]:
    """``NAME=JSON`` options: more rows of ours with these generate kwargs (e.g. a captured loop's switch)."""
    extra = {}
    for value in values:
        name, _, kwargs = value.partition("=")
        try:
            parsed = json.loads(kwargs)
        except json.JSONDecodeError as error:
            raise ValueError(f"--extra-method {value!r}: {kwargs!r} is not JSON ({error}); write NAME='{{\"key\": "
                             "value}'.") from error
        if not name or not isinstance(parsed, dict):
            raise ValueError(f"--extra-method {value!r}: write NAME='{{\"key\": value}}' (a name, then a JSON object "
                             "of generate kwargs).")
        extra[name] = parsed
    return extra


HEADER = (f"{'method@tau':<22} {'tau':>5} {'ms/tok':>7} {'x eager':>7} {'x static':>8} {'draft':>6} {'verify':>6} "
          f"{'rest':>5} {'peak+MiB':>8} same")


def row_line(row: dict) -> str:
    """One row of the table (HEADER's columns): per-cycle milliseconds are ours' from ``drafter.last_stats``; for
    transformers' DFlash, verify is its target forward and the rest together."""
    label = row["method"] + (f"@{row['tau_scripted']:g}" if row["tau_scripted"] is not None else "")
    if "error" in row:
        return f"{label:<22} ERROR {row['error'][:150]}"

    def num(value, width, digits=2):
        return f"{value:>{width}.{digits}f}" if value is not None else f"{'-':>{width}}"

    peak = row.get("peak_extra_bytes")
    same = "yes" if row["identical"] else ("tie" if row["first_difference"].get("near_tie") else "NO")
    verify = row.get("verify_ms", row.get("target_and_rest_ms"))
    first = row["first_call_seconds"]
    compiled = f"  (first call {first:.1f} s)" if first > 3 * row["seconds"] + 1 else ""
    return (f"{label:<22} {num(row.get('tau'), 5)} {num(row['ms_per_token'], 7)} {num(row['speedup_vs_plain'], 7)} "
            f"{num(row['speedup_vs_plain_static'], 8)} {num(row.get('draft_ms'), 6)} {num(verify, 6)} "
            f"{num(row.get('rest_ms'), 5)} {num(peak and peak / 2**20, 8, 0)} {same}{compiled}")


def print_table(rows: list[dict]) -> None:
    """The compact human-readable table, grouped by phase, dtype and prompt."""
    print("\nx: speedup over plain eager / plain with a static cache; draft, verify, rest: ms per cycle; peak+: peak "
          "memory over the weights; same: output identical to plain (tie: differs first at a near-tie)")
    group = None
    for row in rows:
        here = (row["phase"], row["dtype"], row["prompt_tokens"], row["new_tokens"])
        if here != group:
            group = here
            print(f"\n== {row['phase']}: {row['dtype']}, {row['prompt_tokens']}-token prompt, {row['new_tokens']} new "
                  f"tokens, median of {row['repeats']}\n  {HEADER}")
        print("  " + row_line(row))


def run_check(run: Run, target, drafter) -> None:
    """Phase 1: the random (context-dependent) fp32 target: ours must equal plain token for token."""
    sizes, tau = run.sizes, max(run.sizes.taus)
    ids = run.prompt(sizes.prompt_length)
    plain, logits = run.reference(target, ids, sizes.check_tokens)
    reference = plain["tokens"]
    margins = logit_margins(logits)
    run.report["margins"]["check/random_fp32"] = margins
    run.note(f"check: random fp32 target, near-tie fraction of plain's steps {margins['near_tie_fraction']:.2f} "
             "(why the timed target is made peaked)")
    for method in ours_methods(drafter, [tau], builtin=False):
        oracle = oracle_for(method, reference, ids.shape[1], target.config.vocab_size)
        sample = call(target, ids, sizes.check_tokens, method, run.clock, oracle)
        difference = difference_at(logits, sample["tokens"], reference)
        run.report["checks"].append({"target": "random fp32", "method": method.key, "new_tokens": sizes.check_tokens,
                                     "identical": difference is None, "first_difference": difference,
                                     "tau": sample["stats"]["tau"]})
        run.note(f"  {method.key}: identical {difference is None}, tau {sample['stats']['tau']:.2f}")
        if difference is not None:
            run.fail(f"check {method.key}: fp32 output on the random target differs from plain at {difference}")
    run.save()


def chosen_sizes(args) -> Sizes:
    """The sizes of ``--tiny`` / ``--quick`` / a full run, with the options given on the command line; a ValueError
    names a bad value and the fix before any work."""
    base = SMOKE if args.tiny else QUICK if args.quick else FULL
    given = dict(prompt_length=args.prompt_length, new_tokens=args.max_new_tokens, repeats=args.repeats,
                 taus=args.taus and tuple(float(t) for t in args.taus.split(",") if t),
                 context_lengths=None if args.context_lengths is None else tuple(
                     int(n) for n in args.context_lengths.split(",") if n))
    sizes = dataclasses.replace(base, **{k: v for k, v in given.items() if v is not None})
    if min(sizes.prompt_length, sizes.new_tokens, sizes.repeats, *sizes.context_lengths) < 1:
        raise ValueError(f"--prompt-length {sizes.prompt_length}, --max-new-tokens {sizes.new_tokens}, --repeats "
                         f"{sizes.repeats}, --context-lengths {sizes.context_lengths}: each must be at least 1.")
    if not sizes.taus or not all(1.0 <= tau < BLOCK_SIZE for tau in sizes.taus):
        raise ValueError(f"--taus {args.taus!r}: give levels from 1 to below {BLOCK_SIZE} (the block), e.g. 4,6.5,7.5.")
    return sizes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="a tiny target and sizes (a smoke run of the script)")
    parser.add_argument("--quick", action="store_true", help="fewer tokens, rounds, levels and long prompts")
    parser.add_argument("--json", default=None, help="write the report here (after every phase)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: 1 with --tiny)")
    parser.add_argument("--drafter-layers", type=int, default=None, help="default 5 (1 with --tiny)")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="new tokens of the headline")
    parser.add_argument("--prompt-length", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=None, help="timed rounds per shape")
    parser.add_argument("--taus", default=None, help="scripted tau levels, comma list (default 4,6.5,7.5)")
    parser.add_argument("--context-lengths", default=None,
                        help="prompt lengths of the long-context phase, comma list; empty to skip")
    parser.add_argument("--no-static", action="store_true", help="leave out the static-cache (compiled) baselines")
    parser.add_argument("--extra-method", action="append", default=[], metavar="NAME=JSON",
                        help="one more row of ours at each tau level, with these generate kwargs")
    parser.add_argument("--budget-seconds", type=float, default=330.0,
                        help="optional phases (long prompts, static-cache DFlash) start only before this")
    args = parser.parse_args()
    extra = parse_extra(args.extra_method)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {args.device} but torch sees no CUDA device; use --device cpu (with --tiny).")
    if args.threads or args.tiny:
        torch.set_num_threads(args.threads or 1)
    torch.set_float32_matmul_precision("highest")  # fp32 checks compare exact argmaxes: no TF32
    sizes = chosen_sizes(args)
    args.drafter_layers = args.drafter_layers or (1 if args.tiny else 5)
    shape = TINY if args.tiny else QWEN3_8B
    run = Run(args, device, sizes, shape)
    top = (max(sizes.taus),)

    target = random_target(shape, device)
    drafter = drafter_for(target, args.drafter_layers, device, torch.float32)
    run.note(f"models built: {shape['num_hidden_layers']}-layer target, {args.drafter_layers}-layer drafter, {device}")
    run_check(run, target, drafter)

    run.report["conditions"]["peaked_target"] = make_peaked(target)
    run.measure("fp32", target, torch.float32, sizes.prompt_length, sizes.new_tokens, sizes.repeats,
                [PLAIN, *ours_methods(drafter, top, extra, builtin=False)])

    target, drafter = target.to(torch.bfloat16), drafter.to(torch.bfloat16)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    static = not args.no_static
    run.measure("bf16", target, torch.bfloat16, sizes.prompt_length, sizes.new_tokens, sizes.repeats,
                [PLAIN, *([PLAIN_STATIC] if static else []), PROMPT_LOOKUP, *ours_methods(drafter, sizes.taus, extra)])

    for length in sizes.context_lengths:
        if run.over_budget(f"long {length}"):
            break
        run.measure("long", target, torch.bfloat16, length, sizes.long_new_tokens, sizes.long_repeats,
                    [PLAIN, *ours_methods(drafter, top, builtin=False)])

    if static and not run.over_budget("static-cache DFlash and prompt lookup"):
        methods = [PLAIN, PLAIN_STATIC,
                   Method("pld_static", {"prompt_lookup_num_tokens": PROMPT_LOOKUP_TOKENS},
                          static_cache_with_room=True),
                   Method("builtin_static", {"assistant_model": drafter, "speculation_type": "dflash"}, top[0],
                          builtin=True, static_cache_with_room=True),
                   Method("ours_full", {"assistant_model": drafter, "dflash_policy": "full"}, top[0], ours=True)]
        run.measure("static", target, torch.bfloat16, sizes.prompt_length, sizes.new_tokens, sizes.repeats, methods)

    run.report["finished"] = True
    run.save()
    print_table(run.report["rows"])
    print(f"\nok: {run.report['ok']}" + "".join(f"\n  {why}" for why in run.report["failures"])
          + f"\nwall: {run.elapsed():.0f} s" + (f"; JSON: {args.json}" if args.json else ""))
    return 0 if run.report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
