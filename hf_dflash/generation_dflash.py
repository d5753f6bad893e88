# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""Lossless speculative generation with a DFlash drafter, behind the ordinary ``generate(assistant_model=...)``.

Part of the remote-code payload (a flat set of sibling ``*_dflash.py`` modules importing only torch, transformers and
each other); this module is the top: it calls down to the others, none imports it except the modeling module, whose
import installs the routing.

The steps of :func:`dflash_decoding` (batch 1 shown; in a batch every row keeps what it accepts, see ``Rows``),
after the call is resolved once into its options (options_dflash.py: the parts below take those, never the generation
config):
  1. prefill: the target reads the prompt and chooses the first new token alone;
  then, each cycle:
  2. draft: the call's draft policy (policy_dflash.py) chooses how many drafts to verify and from which source; the
     drafter reads the target features of the newly committed tokens and proposes up to ``block_size - 1`` tokens in
     ONE forward over ``[anchor, MASK, ...]`` (candidates_dflash.py), or a prompt-lookup continuation is proposed
     (lookup_dflash.py), or none (a plain step; when the policy probes, the drafter's block is proposed and scored
     against the tokens committed next instead of verified);
  3. verify: the target scores ``[anchor, drafts]`` in ONE forward (with ``dflash_tree_budget``, steps 3-5 run over
     a tree of drafts instead: tree_dflash.py);
  4. accept: greedy: the longest prefix of drafts equal to the target's own choices, plus the target's next token;
     sampling: speculative sampling (accept with min(1, p/q), resample from norm(max(0, p - q))) (sampling_dflash.py);
  5. commit: append the accepted tokens, stopping where plain ``generate`` would; the target keeps their cache
     slots (the rest is cropped: a static cache's length is rewound; a hybrid target's recurrent states are rewound
     by the crop from transformers 5.25 on, restored and re-advanced before: cache_dflash.py), the drafter reads
     their features in the next draft; finished rows retire (rows_dflash.py).
Output equals what ``generate()`` would give without the drafter, because every committed token is the target's.

Routing: importing this module wraps ``GenerationMixin.generate`` (argument checks before any work) and
``GenerationMixin._assisted_decoding`` (sends DFlash drafters to :func:`dflash_decoding`), idempotently. Other
assistants (small LMs, prompt lookup, early exit) go to transformers untouched. Opt out with
:func:`disable_dflash_generation` or the :func:`builtin_generation` context manager.
"""

import contextlib
import contextvars
import functools
import threading
import time
import weakref

import torch
from transformers import GenerationMixin
from transformers.generation.utils import GenerateDecoderOnlyOutput
from transformers.utils import logging

from .attention_dflash import grouped_query_attention
from .cache_dflash import (
    RecurrentStates, cache_argument, cache_capacity, cache_slots, compact_slots, empty_target_cache, free_slots,
    has_sliding_window,
)
from .candidates_dflash import DFlashCandidateGenerator
from .capture_dflash import (
    CapturedDraft, CapturedVerify, capture_requested, compile_settings, drafter_capturable, eager_reason,
    forward_kernels,
)
from .checks_dflash import check_drafter_matches_target, check_generate_call, is_dflash_drafter
from .diagnostics_dflash import check_acceptance
from .features_dflash import PromptFeatureWriter
from .options_dflash import DFLASH_GENERATE_KWARGS, DFlashCallOptions, call_options
from .policy_dflash import Draft, DraftPolicy, draft_policy
from .rows_dflash import OutputRecorder, Rows, record, right_padded
from .sampling_dflash import ProcessorRows, accept, processed_verify_scores, select_tokens
from .stats_dflash import DFlashStats
from .timing_dflash import synchronized_clock, verify_rows
from .tree_dflash import TreeVerifier


logger = logging.get_logger(__name__)

__all__ = ["DFlashCandidateGenerator", "DFlashStats", "builtin_generation", "check_drafter_matches_target",
           "dflash_decoding", "disable_dflash_generation", "enable_dflash_generation", "is_dflash_drafter"]


# ----------------------------------------------------------------------------------------------------------------------
# the decoding loop
@torch.no_grad()
def dflash_decoding(target, input_ids: torch.LongTensor, logits_processor, stopping_criteria, generation_config,
                    synced_gpus: bool = False, streamer=None, assistant_model=None, **model_kwargs):
    """Speculative decoding with a DFlash drafter; ``generate`` calls it in place of ``_assisted_decoding``. Works on
    a left-padded batch: every row keeps all the drafts the target accepts for it (see :class:`Rows`). The numbered
    steps are the module docstring's."""
    drafter, device = assistant_model, input_ids.device
    # the call resolved once, its generation config read here and nowhere below (the routing checked the call)
    options = call_options(generation_config, _call_options.get())
    start_time = time.perf_counter()
    stats = DFlashStats(drafter.config.block_size, row_acceptance_lengths=[[] for _ in input_ids])
    recorder = OutputRecorder(options)
    cache = empty_target_cache(target, model_kwargs, drafter.config.block_size, options.max_length, len(input_ids),
                               static=capture_requested(options, device))
    forward_kwargs = target_forward_kwargs(target, drafter, cache, options)
    generator = DFlashCandidateGenerator(drafter, target, logits_processor=logits_processor, options=options)

    # 1. prefill: the target reads the prompts and chooses the first new token alone
    rows = Rows.for_prompts(input_ids, model_kwargs.get("attention_mask"))
    running = prefill(target, drafter, rows, input_ids, forward_kwargs, logits_processor, stopping_criteria,
                      options, recorder, streamer)
    stats.prefill_seconds = time.perf_counter() - start_time
    recurrent, sliding = RecurrentStates(cache), has_sliding_window(cache)
    captured = captured_verify(target, drafter, options, cache, len(rows), bool(recurrent), stats)
    if captured is not None and drafter_capturable(drafter):
        generator.capture(CapturedDraft(drafter, cache_capacity(cache), captured.settings, stats))
    policy = draft_policy(options, target, drafter, captured=() if captured is None else captured.widths)
    tree = None if options.tree_budget is None else TreeVerifier(
        target, drafter, forward_kwargs, logits_processor, stopping_criteria, options, policy)

    while rows.retire(running, cache, generator.cache, ProcessorRows(logits_processor)):
        # 2. draft: the policy chooses the source and count, the generator proposes them (none: a plain step)
        tic = synchronized_clock(device)
        draft, lookup = next_draft(policy, generator, rows, cache, trees=tree is not None)
        candidates, draft_scores, drafter_ran, probe = proposed(generator, policy, rows, draft, lookup)
        drafts, drafted = candidates[:, 1:], synchronized_clock(device)
        # (a scored probe's head reads few rows: not what a drafted cycle costs)
        draft_seconds = drafted - tic if drafter_ran and not (generator.compiled or draft.scored_only) else None
        stats.draft_seconds += drafted - tic
        stats.lookup_cycles += int(draft.from_lookup)
        if tree is not None and drafts.shape[1] and not draft.from_lookup:  # steps 3-5 over a tree of drafts
            running = tree.cycle(rows, cache, draft_scores, stats, recorder, streamer, draft_seconds)
            continue

        # 3. verify the candidates in one target forward
        verify = verify_block(target, rows, candidates, cache, forward_kwargs, recurrent, captured, draft.rows)
        processed = processed_verify_scores(logits_processor, rows.histories, drafts, verify.raw)

        # 4. accept drafts as the target would have chosen them, then the target's own next token
        accepted, tokens = accept(drafts, draft_scores, processed, options.do_sample)
        accepted = committed_acceptance(accepted, len(rows) > 1 and (recurrent.layers or sliding))
        stats.add_verification(rows.ids, accepted, num_drafts=drafts.shape[1])
        stats.add_scored_probe(probe, tokens)
        if not draft.from_lookup:  # lookups are rated from every cycle's offer, verified or not
            policy.observe_acceptance(drafts.shape[1], accepted.tolist())

        # 5. commit, stopping exactly where plain generate would
        keep = int(accepted.max()) + 1
        if recurrent and keep < verify.width and not recurrent.crop_rewinds:
            # the recurrent states read rejected drafts and the cache cannot crop them: rewind and re-advance
            verify = readvance(target, verify, keep, cache, recurrent, forward_kwargs)
        running, committed = rows.commit(
            accepted, tokens, processed, drafter.selected_states(verify.outputs.hidden_states, slice(0, keep)),
            verify.positions[:, : verify.width], cache, verify.cached, stopping_criteria, drafter_read=drafter_ran,
        )
        record(recorder, streamer, verify.outputs, verify.raw, processed, committed, verify.cached)
        # the target's share of the cycle, commit included (a plain step pays it too): one span for stats and costs
        target_seconds = synchronized_clock(device) - drafted
        stats.verify_seconds += target_seconds
        if not verify.compiled:  # a compile's seconds are not the forward's cost
            policy.observe_costs(len(rows), device, verify.padded_width, target_seconds, draft_seconds)

    if streamer is not None:
        streamer.end()
    stats.new_tokens = sum(len(h) - input_ids.shape[1] for h in rows.finished)
    stats.total_seconds = time.perf_counter() - start_time
    stats.low_acceptance = check_acceptance(target, drafter, stats)  # one warning per pair when drafts are never taken
    drafter.last_stats = stats  # when the call ends: with a drafter shared by threads, the last call to finish wins
    return generate_output(right_padded(rows.finished, options.pad_token_id), recorder, cache, options)


def next_draft(policy: DraftPolicy, generator, rows, cache, trees: bool) -> tuple[Draft, list[int]]:
    """Step 2's choice: (the policy's :class:`Draft`, the lookup continuation on offer). The offer (batch size 1, when
    the call has a lookup source) is scored by the policy whether verified or not; a tree takes the drafter's whole
    block whenever the drafter's drafts are verified (the policy then sizes the tree:
    :meth:`DraftPolicy.tree_budget`). The anchor and the drafts fit before a static target `cache`'s end
    (:func:`static_room`)."""
    histories = rows.histories
    found = generator.lookup_offer(histories)
    offer, size = found if found is not None else ([], 0)
    if len(histories) == 1:  # the offers of earlier cycles are scored against the text committed since
        policy.observe_offers(histories[0], offer, size)
    draft = policy.choose(len(histories), histories[0].device, len(offer), size,
                          context=max(len(h) for h in histories))
    if trees and draft.count and not draft.from_lookup and not draft.scored_only:
        draft = Draft(policy.most)
    room = static_room(cache, generator.cache, rows, generator.block_size)  # None: the cache grows
    if room is not None and draft.count >= room:  # verify what fits (a chain always does: see static_room)
        draft = draft._replace(count=room - 1)
    return draft, offer


def proposed(generator, policy: DraftPolicy, rows, draft: Draft, lookup: list[int]):
    """Step 2's proposal: (the candidates to verify, [b, 1 + drafts], the scores the drafts were chosen from, whether
    the drafter ran, a scored probe's first draft or None). The drafter reads the features the target committed since
    it last ran; a probe's drafts (``draft.scored_only``) go to the policy to be scored against the tokens committed
    next, and the target steps plainly."""
    context, positions = rows.unread() if draft.count and not draft.from_lookup else (None, None)
    if draft.scored_only:  # (fewer drafts near max_length: the room left; none at its end)
        drafts = generator.scored_drafts(rows.histories, context, positions, rows.anchor_positions, draft.count,
                                         rows.slot_mask)
        if drafts:
            policy.observe_drafter_offer(rows.histories[0], drafts)
        return rows.anchors(), None, bool(drafts), drafts[0] if drafts else None
    candidates, draft_scores = generator.get_candidates(
        rows.anchors(), context, draft=draft, lookup=lookup, histories=rows.histories,
        context_positions=positions, anchor_positions=rows.anchor_positions, slot_mask=rows.slot_mask,
    )
    return candidates, draft_scores, candidates.shape[1] > 1 and not draft.from_lookup, None


def static_room(cache, drafter_cache, rows, block_size: int) -> int | None:
    """The most tokens a verify block may write into a static target cache (None: the cache grows). A batch's
    padding slots (left padding, drafts a row rejected while a neighbour accepted more) are squeezed out of both
    caches first when less than a block is left (:func:`~cache_dflash.compact_slots`; the cache holds a block more
    than ``max_length - 1`` for the drafts the drafter has not read yet). A batch of one holds no padding slot, and
    its cache (``max_length - 1`` slots) always has room for the anchor and every draft that fits under
    ``max_length``."""
    if cache_capacity(cache) is None:
        return None
    free = free_slots(cache, cache_slots(cache) or 0)
    if free < block_size and rows.slot_mask is not None and not bool(rows.slot_mask.all()):
        rows.slot_mask = compact_slots([cache, drafter_cache], rows.slot_mask, unread=rows.unread()[0].shape[1])
        free = free_slots(cache, cache_slots(cache))
    if free < 1:  # empty_target_cache sized the cache so that this cannot happen
        raise RuntimeError(f"The static cache is full ({cache_slots(cache)} slots); pass a larger max_cache_len.")
    return free


def target_forward_kwargs(target, drafter, cache, options: DFlashCallOptions) -> dict:
    """Keyword arguments of every target forward: the cache, and the hidden states the drafter reads (all of them
    when the caller asked for hidden states)."""
    layers = True if options.output_hidden_states else [i + 1 for i in drafter.config.target_layer_ids]
    kwargs = {cache_argument(target): cache, "use_cache": True, "output_hidden_states": layers}
    if options.output_attentions:
        kwargs["output_attentions"] = True
    return kwargs


def prefill(target, drafter, rows, input_ids, forward_kwargs, logits_processor, stopping_criteria,
            options: DFlashCallOptions, recorder, streamer) -> list[int]:
    """Step 1: the target reads the prompts and chooses each row's first new token; returns the rows that go on. The
    drafter's context is written layer by layer into one tensor, through a DFlash drafter's ``fc`` (one state per
    token: :class:`~features_dflash.PromptFeatureWriter`) unless
    the caller asked for the hidden states themselves, or for captured forwards: transformers installs the hooks that
    record hidden states at the first forward asking for them, under a lock a compiled forward cannot trace."""
    hooks = not (options.output_hidden_states or capture_requested(options, target.device))
    writer = PromptFeatureWriter.for_target(target, drafter.config.target_layer_ids, drafter.fc) if hooks else None
    with writer or contextlib.nullcontext():
        outputs = target(
            input_ids=input_ids, attention_mask=rows.slot_mask, position_ids=rows.feature_positions, logits_to_keep=1,
            **(forward_kwargs if writer is None else {**forward_kwargs, "output_hidden_states": False}),
        )
    raw = outputs.logits[:, -1:].float()
    processed = logits_processor(input_ids, raw[:, 0].clone())[:, None] if len(logits_processor) else raw
    tokens = select_tokens(processed, options.do_sample)
    recorder.add(outputs, raw, processed, 1, prefill=True, kv_length=0)
    if streamer is not None:
        streamer.put(tokens[0].cpu())
    features = drafter.fused_features(outputs.hidden_states) if writer is None else writer.features
    return rows.start(tokens, features, processed, stopping_criteria, drafter.fuse)


class Verification:
    """Step 3's target forward over `candidates` [b, 1 + k]: its `outputs`, the raw fp32 logits of the candidates,
    the inputs it ran on (`ids`, `positions`, `mask`), the slots the cache held before it (`cached`), the rows it
    verified (`padded_width`: padded to a GEMM-friendly count on CPU) and the rows whose slots are kept (`width`)."""

    def __init__(self, outputs, candidates, ids, positions, mask, cached, compiled: bool = False):
        self.outputs, self.ids, self.positions, self.mask, self.cached = outputs, ids, positions, mask, cached
        self.raw = outputs.logits[:, : candidates.shape[1]].float()
        self.width = self.padded_width = ids.shape[1]
        self.compiled = compiled  # a captured forward compiled a graph for it: its seconds are not its cost


def verify_block(target, rows, candidates, cache, forward_kwargs, recurrent, captured=None,
                 padded: int = 0) -> Verification:
    """Step 3: one target forward over each row's ``[anchor, drafts]``, padded to `padded` rows (the policy's
    :attr:`Draft.rows`) and to the next width of a `captured` forward (:class:`~capture_dflash.CapturedVerify`; None:
    eager) or to a GEMM-friendly row count on CPU (not for recurrent targets, where padding would cost a re-advance,
    nor past a static cache's end); recurrent states are saved first."""
    width, cached = candidates.shape[1], cache_slots(cache)
    free = free_slots(cache, cached or 0)
    widths = () if captured is None else captured.widths
    if not recurrent:
        width = max(width, padded) if free is None or padded <= free else width
        width = verify_rows(width, candidates.device, len(rows), most=free, captured=widths)
    ids, positions, mask = rows.verify_inputs(candidates, width)
    if recurrent and not recurrent.crop_rewinds:
        recurrent.save()
    graphs = 0 if captured is None else captured.graphs
    forward = functools.partial(captured, cache_capacity(cache)) if width in widths else target
    outputs = forward(input_ids=ids, attention_mask=mask, position_ids=positions, logits_to_keep=0, **forward_kwargs)
    compiled = captured is not None and captured.graphs > graphs
    return Verification(outputs, candidates, ids, positions, mask, cached, compiled)


def captured_verify(target, drafter, options: DFlashCallOptions, cache, batch: int, recurrent: bool, stats):
    """The call's :class:`~capture_dflash.CapturedVerify` (counting its compiles in `stats`), or None where its verify
    runs eager: not asked for, or asked for where it cannot run (logged, with why)."""
    if not capture_requested(options, target.device):
        return None
    reason = eager_reason(batch, options.tree_budget is not None, recurrent, cache, target)
    if reason is not None:
        logger.warning(f"hf_dflash: captured forwards were asked for, but this call's verify runs eagerly: "
                       f"{reason}.")
        return None
    widest = max(drafter.config.block_size, (options.lookup_tokens or 0) + 1)  # the anchor and a block or a lookup
    return CapturedVerify(target, widest, compile_settings(options, target.device), stats)


def committed_acceptance(accepted: torch.Tensor, shortest: bool) -> torch.Tensor:
    """The drafts each row commits of those it `accepted`: all of them, or (`shortest`: a batch of a target with
    recurrent or sliding-window layers) the batch's shortest acceptance, for every row. A recurrent or convolution
    state cannot skip a rejected slot, and a masked slot would take a place in a sliding window that plain decoding
    gives a real token; each row's first shortest-acceptance + 1 tokens are target tokens, so this stays exact."""
    return accepted.clamp(max=int(accepted.min())) if shortest else accepted


def readvance(target, verify: Verification, keep: int, cache, recurrent, forward_kwargs) -> Verification:
    """A hybrid target's verify forward folded rejected drafts into its recurrent states: restore them, crop the
    block, and run the target over the `keep` committed tokens only. Returns the verification of those."""
    cache.crop(-verify.width)
    recurrent.restore()
    mask = None if verify.mask is None else verify.mask[:, : verify.mask.shape[1] - verify.width + keep]
    verify.outputs = target(input_ids=verify.ids[:, :keep], attention_mask=mask,
                            position_ids=verify.positions[:, :keep], logits_to_keep=1, **forward_kwargs)
    verify.width = keep
    return verify


def generate_output(sequences, recorder, cache, options: DFlashCallOptions):
    """What plain ``generate`` returns: the sequences, or a GenerateDecoderOnlyOutput with what was asked for."""
    if not options.return_dict_in_generate:
        return sequences
    return GenerateDecoderOnlyOutput(
        sequences=sequences,
        scores=recorder.scores,
        logits=recorder.logits,
        attentions=recorder.attentions,
        hidden_states=recorder.hidden_states,
        **{cache_argument(GenerateDecoderOnlyOutput): cache},
    )


# ----------------------------------------------------------------------------------------------------------------------
# routing
# The resolved DFlashCallOptions of the generate() call in progress: set by the routing around transformers' generate,
# read once by dflash_decoding, which hands them to the parts it builds.
_call_options: contextvars.ContextVar[DFlashCallOptions | None] = contextvars.ContextVar(
    "hf_dflash_call_options", default=None
)


def _routes(original):
    """Wrap a GenerationMixin method so DFlash drafters get our checks / loop; everything else passes through."""
    name = original.__name__

    @functools.wraps(original)
    def wrapper(self, *args, **kwargs):
        drafter = kwargs.get("assistant_model")
        if drafter is None or not is_dflash_drafter(drafter):
            stray = [k for k in DFLASH_GENERATE_KWARGS if k in kwargs]
            if stray and name == "generate":
                raise ValueError(f"{stray} apply to DFlash drafters only: pass assistant_model=<a DFlash drafter>, or "
                                 "drop them.")
            return original(self, *args, **kwargs)
        if name == "generate":
            options = {k: kwargs.pop(k) for k in DFLASH_GENERATE_KWARGS if k in kwargs}
            token = _call_options.set(check_generate_call(self, drafter, args, kwargs, options))
            try:
                with _rewindable_target(self):
                    return original(self, *args, **kwargs)
            finally:
                _call_options.reset(token)
        with grouped_query_attention(self.device), forward_kernels(self, drafter, _call_options.get()):
            return dflash_decoding(self, *args, **kwargs)

    wrapper._hf_dflash_original = original
    return wrapper


# target -> [DFlash calls in flight that lifted its stateful refusal, the instance's own `_is_stateful` before them]
_LIFTED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_LIFTED_LOCK = threading.Lock()
_NOT_SET = object()


@contextlib.contextmanager
def _rewindable_target(target):
    """transformers (5.23-5.24) refuses assisted generation for stateful (recurrent) targets because its loop cannot
    bring their state back to the accepted prefix; ours does (:class:`RecurrentStates`), so the refusal is lifted while
    DFlash calls run. Calls overlapping on one target (threads) share the lift, counted under a lock: the first lifts
    it, the last restores it. While lifted, the target's other assisted calls (a small-LM assistant) are not refused
    either."""
    with _LIFTED_LOCK:
        lifted = _LIFTED.get(target)
        if lifted is None and getattr(target, "_is_stateful", False):
            lifted = _LIFTED[target] = [0, vars(target).get("_is_stateful", _NOT_SET)]
            target._is_stateful = False
        if lifted is not None:
            lifted[0] += 1
    try:
        yield
    finally:
        if lifted is not None:
            with _LIFTED_LOCK:
                lifted[0] -= 1
                if not lifted[0]:
                    del _LIFTED[target]
                    if lifted[1] is _NOT_SET:
                        del target._is_stateful
                    else:
                        target._is_stateful = lifted[1]


_ROUTED_METHODS = ("generate", "_assisted_decoding")


def enable_dflash_generation() -> None:
    """Route ``generate(assistant_model=dflash_drafter)`` to the DFlash loop. Idempotent; on by default."""
    for name in _ROUTED_METHODS:
        current = GenerationMixin.__dict__[name]
        if not hasattr(current, "_hf_dflash_original"):
            setattr(GenerationMixin, name, _routes(current))


def disable_dflash_generation() -> None:
    """Opt out: DFlash drafters then go to transformers' own code (e.g. ``speculation_type="dflash"``)."""
    for name in _ROUTED_METHODS:
        current = GenerationMixin.__dict__[name]
        if hasattr(current, "_hf_dflash_original"):
            setattr(GenerationMixin, name, current._hf_dflash_original)


@contextlib.contextmanager
def builtin_generation():
    """Context manager: run transformers' built-in paths inside, restore routing after.

    Example:
        >>> with builtin_generation():  # doctest: +SKIP
        ...     target.generate(ids, assistant_model=drafter, speculation_type="dflash")
    """
    was_enabled = hasattr(GenerationMixin.__dict__["generate"], "_hf_dflash_original")
    disable_dflash_generation()
    try:
        yield
    finally:
        if was_enabled:
            enable_dflash_generation()


def _install_on_import() -> None:
    if __name__.startswith("hf_dflash."):
        enable_dflash_generation()
        return
    try:  # a remote-code copy defers to the installed package, which routes generation itself
        import hf_dflash  # noqa: F401
    except ImportError:
        enable_dflash_generation()


_install_on_import()
