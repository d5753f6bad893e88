# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""Lossless speculative generation with a DFlash drafter, behind the ordinary ``generate(assistant_model=...)``.

Part of the remote-code payload: imports only torch and transformers.

The steps of :func:`dflash_decoding` (batch 1 shown; in a batch every row keeps what it accepts, see ``_Rows``):
  1. prefill: the target reads the prompt and chooses the first new token alone;
  then, each cycle:
  2. draft: the drafter reads the target features of the newly committed tokens and proposes up to
     ``block_size - 1`` tokens in ONE forward over ``[anchor, MASK, ...]`` (:class:`DFlashCandidateGenerator`);
  3. verify: the target scores ``[anchor, drafts]`` in ONE forward;
  4. accept: greedy: the longest prefix of drafts equal to the target's own choices, plus the target's next token;
     sampling: speculative sampling (accept with min(1, p/q), resample from norm(max(0, p - q)));
  5. commit: append the accepted tokens, stopping where plain ``generate`` would; the target keeps their cache
     slots, the drafter reads their features in the next draft; finished rows retire.
Output equals what ``generate()`` would give without the drafter, because every committed token is the target's.

Routing: importing this module wraps ``GenerationMixin.generate`` (argument checks before any work) and
``GenerationMixin._assisted_decoding`` (sends DFlash drafters to :func:`dflash_decoding`), idempotently. Other
assistants (small LMs, prompt lookup, early exit) go to transformers untouched. Opt out with
:func:`disable_dflash_generation` or the :func:`builtin_generation` context manager.
"""

import contextlib
import contextvars
import copy
import dataclasses
import functools
import inspect
import math
import time
import weakref
from dataclasses import dataclass, field

import torch
from transformers import GenerationMixin
from transformers import cache_utils
from transformers.cache_utils import DynamicCache
from transformers.generation import logits_process as lp
from transformers.generation.candidate_generator import CandidateGenerator
from transformers.generation.utils import GenerateDecoderOnlyOutput
from transformers.utils import logging

from .tree_dflash import TREE_BUDGET_KWARG, TreeVerifier, prompt_lookup_match, requested_tree_budget


logger = logging.get_logger(__name__)

# Cache layers of hybrid targets (transformers 5.24): recurrent / convolution states that a verify forward advances
# through every draft. Older transformers have no such layers (isinstance against () is always False).
LINEAR_ATTENTION_LAYERS = getattr(cache_utils, "LinearAttentionCacheLayerMixin", ())
SLIDING_WINDOW_LAYERS = tuple(
    getattr(cache_utils, name) for name in ("DynamicSlidingWindowLayer", "StaticSlidingWindowLayer")
    if hasattr(cache_utils, name)
)

# Processors that treat every row of scores alike whatever the token history: applied to all block positions at once.
POSITION_INDEPENDENT_PROCESSORS = (
    lp.TemperatureLogitsWarper,
    lp.TopKLogitsWarper,
    lp.TopPLogitsWarper,
    lp.MinPLogitsWarper,
    lp.TypicalLogitsWarper,
    lp.EpsilonLogitsWarper,
    lp.EtaLogitsWarper,
    lp.SuppressTokensLogitsProcessor,
    lp.InfNanRemoveLogitsProcessor,
)


@dataclass
class DFlashStats:
    """Statistics of one ``generate()`` call with a DFlash drafter (``drafter.last_stats``).

    ``acceptance_lengths`` has one entry per verification: accepted drafts + 1 (the target's own token), so the
    mean is the paper's tau; ``drafts_per_cycle`` how many drafts each cycle verified (0: a plain target step, which
    the cost-aware policy takes when speculation does not pay), ``lookup_cycles`` how many of those cycles verified
    prompt-lookup drafts instead of the drafter's. Times are wall-clock seconds, the device
    synchronised around each timed step (so CUDA times are the work's, not its launch's).
    """

    block_size: int
    acceptance_lengths: list[int] = field(default_factory=list)
    drafts_per_cycle: list[int] = field(default_factory=list)
    lookup_cycles: int = 0
    row_acceptance_lengths: list[list[int]] = field(default_factory=list)
    new_tokens: int = 0
    prefill_seconds: float = 0.0
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    total_seconds: float = 0.0

    @property
    def mean_acceptance_length(self) -> float:
        return sum(self.acceptance_lengths) / len(self.acceptance_lengths) if self.acceptance_lengths else 0.0

    @property
    def num_verifications(self) -> int:
        return len(self.acceptance_lengths)

    def acceptance_by_position(self) -> list[float]:
        """Fraction of verifications whose draft at block position k (1 .. block_size-1) was accepted."""
        return acceptance_by_position(self.acceptance_lengths, self.block_size)

    def _add_verification(self, rows: list[int], accepted: torch.Tensor) -> None:
        """One verification: original batch row `rows[r]` accepted `accepted[r]` drafts."""
        for row, n in zip(rows, accepted.tolist()):
            self.acceptance_lengths.append(n + 1)
            self.row_acceptance_lengths[row].append(n + 1)


def acceptance_by_position(acceptance_lengths: list[int], block_size: int) -> list[float]:
    """Fraction of verifications whose draft at block position k (1 .. block_size-1) was accepted.

    Example:
        >>> acceptance_by_position([1, 4, 2, 1], block_size=4)
        [0.5, 0.25, 0.25]
    """
    n = max(1, len(acceptance_lengths))
    return [sum(a > k for a in acceptance_lengths) / n for k in range(1, block_size)]


# ----------------------------------------------------------------------------------------------------------------------
# checks (all raise before any forward)
def is_dflash_drafter(model) -> bool:
    """Duck-typed: remote-code and installed copies of the drafter class are different objects."""
    return bool(getattr(model, "_hf_dflash_drafter", False))


def check_drafter_matches_target(target, drafter) -> None:
    """Raise a ValueError naming both values and the fix when `drafter` cannot serve `target`."""
    text = target.config.get_text_config()
    cfg = drafter.config
    if getattr(target.config, "is_encoder_decoder", False):
        raise ValueError("DFlash drafters serve decoder-only targets; this target is an encoder-decoder model.")
    if cfg.hidden_size != text.hidden_size:
        raise ValueError(
            f"Drafter hidden_size={cfg.hidden_size} but target hidden_size={text.hidden_size}: the drafter was built "
            "for another target. Use a drafter made for this target (DFlashDraftModel.from_target(target))."
        )
    if cfg.vocab_size != text.vocab_size:
        raise ValueError(
            f"Drafter vocab_size={cfg.vocab_size} but target vocab_size={text.vocab_size}: drafter and target must "
            "share one vocabulary. Use a drafter made for this target's tokenizer."
        )
    depth = text.num_hidden_layers
    bad = [i for i in cfg.target_layer_ids if not 0 <= i < depth]
    if bad or not cfg.target_layer_ids:
        raise ValueError(
            f"Drafter target_layer_ids={cfg.target_layer_ids} but the target has {depth} layers (valid ids 0.."
            f"{depth - 1}). Use a drafter made for this target, or rebuild it with valid target_layer_ids."
        )
    if cfg.num_target_layers is not None and cfg.num_target_layers != depth:
        raise ValueError(
            f"Drafter was built for a target with num_target_layers={cfg.num_target_layers}, this target has "
            f"{depth} layers. Use a drafter made for this target (DFlashDraftModel.from_target(target))."
        )
    rows = target.get_input_embeddings().weight.shape[0]
    if cfg.mask_token_id is None or not 0 <= cfg.mask_token_id < rows:
        raise ValueError(
            f"Drafter mask_token_id={cfg.mask_token_id} is outside the target's embedding table (rows 0..{rows - 1}). "
            "Set config.mask_token_id to a row of the target's embedding table (an unused/reserved token)."
        )
    if cfg.block_size < 2:
        raise ValueError(f"Drafter block_size={cfg.block_size} drafts nothing; use a block_size >= 2.")


def check_generate_call(target, drafter, args: tuple, kwargs: dict) -> None:
    """Validate a ``generate(assistant_model=drafter, ...)`` call before any work is done."""
    check_drafter_matches_target(target, drafter)
    check_target_rewindable(target)
    base_config = kwargs.get("generation_config", args[1] if len(args) > 1 else None)
    generation_config, _ = target._prepare_generation_config(base_config, **{
        k: v for k, v in kwargs.items() if k != "generation_config"
    })
    if generation_config.num_beams is not None and generation_config.num_beams > 1:
        raise ValueError(
            f"num_beams={generation_config.num_beams} with a DFlash drafter: beam search ignores assistants. "
            "Use num_beams=1 (greedy or sampling) with the drafter, or drop assistant_model for beam search."
        )
    if generation_config.num_return_sequences is not None and generation_config.num_return_sequences > 1:
        raise ValueError(
            f"num_return_sequences={generation_config.num_return_sequences} with a DFlash drafter: only "
            "num_return_sequences=1 is supported. Call generate once per sequence, or drop assistant_model."
        )
    inputs = args[0] if args else kwargs.get("inputs", kwargs.get("input_ids", kwargs.get("inputs_embeds")))
    batch = inputs.shape[0] if isinstance(inputs, torch.Tensor) and inputs.dim() >= 2 else 1
    if batch > 1 and generation_config.return_dict_in_generate and (
        generation_config.output_scores
        or generation_config.output_logits
        or generation_config.output_hidden_states
        or generation_config.output_attentions
    ):
        raise ValueError(
            f"Batch size {batch} with a DFlash drafter returns sequences only: output_scores / output_logits / "
            "output_hidden_states / output_attentions need batch size 1. Generate one prompt at a time for those."
        )
    if batch > 1 and kwargs.get("prefix_allowed_tokens_fn", args[4] if len(args) > 4 else None) is not None:
        raise ValueError(
            f"prefix_allowed_tokens_fn keeps per-row state and is not supported with batch size {batch} and a "
            "DFlash drafter. Generate one prompt at a time, or drop assistant_model."
        )
    if kwargs.get("inputs_embeds") is not None:
        raise ValueError("inputs_embeds with a DFlash drafter is not supported: pass input_ids instead.")
    check_draft_length_settings(generation_config)
    mask = kwargs.get("attention_mask")
    if isinstance(mask, torch.Tensor) and mask.dim() == 2 and bool((mask[:, 1:] < mask[:, :-1]).any()):
        raise ValueError(
            "The attention_mask masks tokens after real ones (right padding). A DFlash drafter needs left padding "
            "only: tokenize with padding_side='left'."
        )


def check_target_rewindable(target) -> None:
    """A stateful target must keep its recurrent state in transformers' linear-attention cache layers, which the loop
    can save and restore; a state kept elsewhere could not be rewound after a rejected draft."""
    if not getattr(target, "_is_stateful", False):
        return
    try:
        layers = DynamicCache(config=target.config).layers
    except Exception:  # a cache transformers cannot build from this config
        layers = []
    if not any(isinstance(layer, LINEAR_ATTENTION_LAYERS) for layer in layers):
        raise ValueError(
            f"{type(target).__name__} keeps a recurrent state outside transformers' cache layers, so a DFlash drafter "
            "cannot rewind it after a rejected draft. Generate without assistant_model for this model (or upgrade "
            "transformers, where hybrid models keep their states in LinearAttention cache layers)."
        )


DFLASH_POLICIES = ("cost", "full")
DEFAULT_POLICY = "cost"  # when the caller sets neither dflash_policy nor transformers' draft-length settings
DEFAULT_LOOKUP_TOKENS = 10  # the cost-aware policy's prompt-lookup source, unless prompt_lookup_num_tokens says


def check_call_options(options: dict) -> None:
    """`dflash_policy` must be one we know."""
    policy = options.get("dflash_policy")
    if policy is not None and policy not in DFLASH_POLICIES:
        raise ValueError(f"dflash_policy={policy!r}: use 'cost' (the default: choose the draft length from measured "
                         "costs, plain steps when speculation does not pay) or 'full' (verify the whole block).")
    lookup = options.get("dflash_lookup")
    if lookup is not None and not isinstance(lookup, bool):
        raise ValueError(f"dflash_lookup={lookup!r}: True (the default: the cost-aware policy may verify prompt-lookup "
                         "drafts instead of the drafter's) or False (drafter drafts only).")


def _explicit_assistant_settings(args: tuple, kwargs: dict) -> bool:
    """Whether the caller set transformers' draft-length settings (then they rule, as for any assistant)."""
    names = ("num_assistant_tokens", "num_assistant_tokens_schedule")
    config = kwargs.get("generation_config", args[1] if len(args) > 1 else None)
    return any(kwargs.get(n) is not None or getattr(config, n, None) is not None for n in names)


DRAFT_LENGTH_SCHEDULES = ("constant", "heuristic", "heuristic_transient")


def check_draft_length_settings(config) -> None:
    """`num_assistant_tokens` must be a positive int and the schedule one transformers knows."""
    count, schedule = config.num_assistant_tokens, config.num_assistant_tokens_schedule
    if count is not None and (not isinstance(count, int) or isinstance(count, bool) or count < 1):
        raise ValueError(
            f"num_assistant_tokens={count!r}: the drafts verified per cycle must be an int >= 1 (or None for the "
            "drafter's whole block)."
        )
    if schedule is not None and schedule not in DRAFT_LENGTH_SCHEDULES:
        raise ValueError(
            f"num_assistant_tokens_schedule={schedule!r} is not supported with a DFlash drafter; use one of "
            f"{DRAFT_LENGTH_SCHEDULES} (or None: constant)."
        )


# ----------------------------------------------------------------------------------------------------------------------
# logits processing over a block (rows of a batch may hold histories of different lengths)
def _behaves_as(processor, classes) -> bool:
    # A subclass that overrides __call__ may read the history differently: only the known __call__ qualifies.
    return any(isinstance(processor, cls) and type(processor).__call__ is cls.__call__ for cls in classes)


def _ids_independent(processor) -> bool:
    return _behaves_as(processor, POSITION_INDEPENDENT_PROCESSORS)


def _set_dependent(processor, history_length: int | None = None) -> bool:
    """Depends only on WHICH tokens are in the history, so rows may be padded with a token already present.

    With an int ``prompt_ignore_length`` the padding token (the last committed one, at ``history_length - 1``) must
    lie in the part of the history the processor reads.
    """
    if not _behaves_as(processor, (lp.RepetitionPenaltyLogitsProcessor,)):
        return False
    ignore = processor.prompt_ignore_length
    if isinstance(ignore, torch.Tensor):
        return False
    return ignore is None or history_length is None or ignore < history_length


def _vectorizable(processors, histories) -> bool:
    shortest = min(len(h) for h in histories)
    return all(_ids_independent(p) or _set_dependent(p, shortest) for p in processors)


def _padded_histories(histories: list[torch.Tensor]) -> torch.Tensor:
    """Right-pad each row's history with its own last token (already in its set) to one length: [b, L]."""
    length = max(len(h) for h in histories)
    return torch.stack([torch.cat([h, h[-1:].expand(length - len(h))]) for h in histories])


def processed_verify_scores(processors, histories: list[torch.Tensor], drafts, logits):
    """Processed target scores for a verify block: row r position i was computed after histories[r] + drafts[r, :i].

    One processor call for the whole batch and block when every processor allows it (position-independent
    warpers, repetition penalty); otherwise one call per row and position with the exact history, as plain
    ``generate`` makes them.
    """
    if len(processors) == 0:
        return logits
    batch, rows, vocab = logits.shape
    k = drafts.shape[1]
    if _vectorizable(processors, histories):
        base = _padded_histories(histories)
        # Position i must not see drafts i..: replace them with the row's anchor, which its history already holds.
        unseen = torch.arange(k, device=drafts.device)[None, :] >= torch.arange(rows, device=drafts.device)[:, None]
        tail = torch.where(unseen[None], base[:, -1:, None], drafts[:, None, :])
        ids = torch.cat([base[:, None].expand(-1, rows, -1), tail], dim=2).reshape(batch * rows, -1)
        return processors(ids, logits.reshape(batch * rows, vocab).clone()).view(batch, rows, vocab)
    out = torch.empty_like(logits)
    for r, history in enumerate(histories):
        full = torch.cat([history, drafts[r]])[None]
        with processors_for_rows(processors, [r]):
            for i in range(rows):
                out[r : r + 1, i] = processors(full[:, : len(history) + i], logits[r : r + 1, i].clone())
    return out


class _ProcessorRows:
    """The per-row values some processors hold (see :func:`processors_for_rows`), retired with their rows: this
    call's processors are its own, so they keep the selection."""

    def __init__(self, processors):
        self.processors = processors

    def batch_select_indices(self, rows: torch.Tensor) -> None:
        for p in self.processors:
            if isinstance(getattr(p, "prompt_ignore_length", None), torch.Tensor):
                p.prompt_ignore_length = p.prompt_ignore_length[rows.to(p.prompt_ignore_length.device)]


@contextlib.contextmanager
def processors_for_rows(processors, rows: list[int]):
    """Processors that hold one value per batch row (transformers gives repetition_penalty the left-padding length
    of each row of a masked batch as `prompt_ignore_length`) see only `rows` inside: the rows still generating, or the
    one row a per-row call scores."""
    saved = [(p, p.prompt_ignore_length) for p in processors
             if isinstance(getattr(p, "prompt_ignore_length", None), torch.Tensor)]
    for p, values in saved:
        p.prompt_ignore_length = values[torch.tensor(rows, device=values.device)]
    try:
        yield
    finally:
        for p, values in saved:
            p.prompt_ignore_length = values


def select_tokens(scores: torch.Tensor, do_sample: bool) -> torch.Tensor:
    """[..., V] scores -> [...] token ids (argmax, or one sample from softmax).

    Example:
        >>> select_tokens(torch.tensor([[[0.0, 2.0, 1.0], [3.0, 0.0, 0.0]]]), do_sample=False).tolist()
        [[1, 0]]
    """
    if not do_sample:
        return scores.argmax(dim=-1)
    probs = scores.softmax(dim=-1).reshape(-1, scores.shape[-1])
    return torch.multinomial(probs, num_samples=1).view(scores.shape[:-1])


def leading_true(matches: torch.Tensor) -> torch.Tensor:
    """[b, k] booleans -> [b] length of each row's all-True prefix.

    Example:
        >>> leading_true(torch.tensor([[True, True, False, True], [False, True, True, True]])).tolist()
        [2, 0]
    """
    return matches.long().cumprod(dim=1).sum(dim=1)


def greedy_accept(drafts, target_scores):
    """Greedy verification: drafts [b, k], target_scores [b, k + 1, V] -> (accepted [b], tokens [b, k + 1]).

    Row r commits tokens[r, : accepted[r] + 1]: the drafts equal to the target's own choices, then the target's
    next token.

    Example (vocabulary of 4; the target's choices are 2, 1, 3):
        >>> scores = torch.eye(4)[[2, 1, 3]][None]
        >>> accepted, tokens = greedy_accept(torch.tensor([[2, 0]]), scores)
        >>> accepted.tolist(), tokens.tolist()
        ([1], [[2, 1, 3]])
    """
    choice = target_scores.argmax(dim=-1)
    return leading_true(drafts == choice[:, : drafts.shape[1]]), choice


def speculative_accept(drafts, draft_probs, target_probs):
    """Speculative sampling: drafts [b, k] were sampled from draft_probs [b, k, V]; target_probs is [b, k + 1, V].

    Draft i is accepted with probability min(1, p/q); the first rejected position is resampled from
    norm(max(0, p - q)); after k acceptances the bonus token is drawn from p. Returns (accepted [b],
    tokens [b, k + 1]) like :func:`greedy_accept`; every committed token follows the target's distribution.
    """
    batch, k = drafts.shape
    p = target_probs[:, :k].gather(2, drafts[..., None])[..., 0]
    q = draft_probs.gather(2, drafts[..., None])[..., 0]
    accepted = leading_true(torch.rand(batch, k, device=drafts.device) * q < p)  # u < p/q, without dividing by q
    # With q = 0 after the last draft, the residual formula yields the bonus distribution p there.
    q = torch.cat([draft_probs, draft_probs.new_zeros(batch, 1, draft_probs.shape[-1])], dim=1)
    at = accepted[:, None, None].expand(-1, 1, target_probs.shape[-1])
    p_next, q_next = target_probs.gather(1, at)[:, 0], q.gather(1, at)[:, 0]
    residual = (p_next - q_next).clamp_min(0)
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p_next)  # rounding may empty it
    tokens = torch.cat([drafts, drafts[:, :1]], dim=1)
    tokens.scatter_(1, accepted[:, None], torch.multinomial(residual / residual.sum(-1, keepdim=True), 1))
    return accepted, tokens


def gemm_friendly_rows(rows: int, device: torch.device, batch: int = 1) -> int:
    """CPU fp32 GEMMs with 9..15 rows cost more than with 16 (a faster kernel starts at 16): round up there.

    Example:
        >>> cpu = torch.device("cpu")
        >>> gemm_friendly_rows(8, cpu), gemm_friendly_rows(9, cpu), gemm_friendly_rows(9, cpu, batch=2)
        (8, 16, 9)
    """
    return 16 if device.type == "cpu" and batch == 1 and 9 <= rows < 16 else rows


# ----------------------------------------------------------------------------------------------------------------------
# the cost-aware draft length
class CostTable:
    """Measured seconds of the target's verify forward by width, and of one drafter forward (moving averages).

    Example:
        >>> table = CostTable()
        >>> table.observe_verify(1, 0.010); table.observe_verify(16, 0.030)
        >>> round(table.verify_seconds(6), 4), table.verify_seconds(32) > 0.030
        (0.0167, True)
    """

    def __init__(self):
        self.verify: dict[int, float] = {}
        self.draft: float | None = None

    @staticmethod
    def _average(old: float | None, new: float) -> float:
        return new if old is None else 0.8 * old + 0.2 * new

    def observe_verify(self, width: int, seconds: float) -> None:
        self.verify[width] = self._average(self.verify.get(width), seconds)

    def observe_draft(self, seconds: float) -> None:
        self.draft = self._average(self.draft, seconds)

    def verify_seconds(self, width: int) -> float | None:
        """Measured, else linear between the nearest measured widths (extrapolated past the ends); None if none."""
        if width in self.verify:
            return self.verify[width]
        points = sorted(self.verify.items())
        if len(points) < 2:
            return points[0][1] if points else None
        # the segment whose right end is the first measured width above `width` (the last segment past the end)
        right = next((i for i, (x, _) in enumerate(points) if x > width), len(points) - 1)
        (x0, y0), (x1, y1) = points[max(0, right - 1)], points[max(1, right)]
        return max(1e-9, y0 + (width - x0) * (y1 - y0) / (x1 - x0))


# (target, device, dtype, batch) -> CostTable, for the process: measured once, refined by every generate() call
_COST_TABLES: dict[tuple, CostTable] = {}
# drafter -> what the cost-aware policy learned of its acceptance, for the process (gone with the drafter)
_POLICY_MEMORY: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


class CostAwarePolicy:
    """Chooses each cycle's draft source and count k (0 = a plain target step) to maximise expected committed tokens
    per second.

    Two sources compete: the drafter's chain (seconds(k) = t(draft) + t(verify of k + 1 rows)) and, at batch size 1,
    the prompt-lookup continuation of the text so far (transformers' prompt lookup: no drafter forward, so
    seconds(k) = t(verify of k + 1 rows)); a plain step costs t(verify of 1 row). expected tokens(k) = 1 +
    sum_{j<=k} prod_{i<=j} a_i, with a_i the acceptance rate at depth i given every earlier draft was accepted,
    counted per source as generation goes (the lookup's per matched n-gram size), decaying, from a 1/2 prior. The
    first cycle with a drafter verifies a full block (it measures the drafter and a wide verify, and the acceptance
    at every depth); t(1) is measured by the first plain step chosen. When plain steps win, a drafter cycle is still
    tried now and then (after 4 plain steps, then 8, 16, ... up to 64) so a drafter that improves, or a costlier
    target, is noticed; the lookup's counts fade every cycle a continuation is offered, so it is retried too.
    Statistics and the probing schedule carry over to the drafter's next calls. Output never depends on the choice.
    """

    REMEMBERED = ("reached", "accepted", "plain_streak", "probe_after", "cycles", "lookup_reached",
                  "lookup_accepted", "tree_expected", "tree_accepted")

    def __init__(self, target, most: int, memory: dict | None = None):
        self.target, self.most = target, most
        self.reached = [0.0] * most
        self.accepted = [0.0] * most
        self.lookup_reached: dict[int, list[float]] = {}  # matched n-gram size -> counts by depth
        self.lookup_accepted: dict[int, list[float]] = {}
        self.plain_streak, self.probe_after = 0, 4
        self.cycles = 0
        self.tree_expected, self.tree_accepted = 0.0, 0.0  # trees: drafts the drafter expected vs those accepted
        # what earlier calls with this drafter learned (acceptance by depth, probing): a new call goes on from it
        self.memory = memory if memory is not None else {}
        if self.memory.get("most") == most:
            self.__dict__.update(copy.deepcopy(self.memory["state"]))

    def _remember(self) -> None:
        self.memory.update(most=self.most, state={name: getattr(self, name) for name in self.REMEMBERED})

    def table(self, batch: int, device) -> CostTable:
        key = (id(self.target), str(device), str(self.target.dtype), batch)
        return _COST_TABLES.setdefault(key, CostTable())

    def acceptance_rates(self) -> list[float]:
        return _rates(self.accepted, self.reached)

    def lookup_rates(self, size: int, length: int) -> list[float]:
        """Acceptance rates by depth of lookup continuations found by an n-gram of `size`, for `length` depths, from
        a sceptical 1/4 prior (most text does not repeat; a drafter that has been right must not lose its cycles to
        an untried lookup)."""
        rates = _rates(self.lookup_accepted.get(size, []), self.lookup_reached.get(size, []), prior=0.25)[:length]
        return rates + [0.25] * (length - len(rates))

    def observe_acceptance(self, num_drafts: int, accepted: list[int], lookup_size: int = 0) -> None:
        """Count one verification of `num_drafts` drafts per row (`accepted`: accepted drafts per row); from the
        drafter, or from a prompt lookup whose n-gram of `lookup_size` tokens matched."""
        if lookup_size:
            reached = self.lookup_reached.setdefault(lookup_size, [])
            hits = self.lookup_accepted.setdefault(lookup_size, [])
            grow = max(0, num_drafts - len(reached))
            reached.extend([0.0] * grow)
            hits.extend([0.0] * grow)
        else:
            reached, hits = self.reached, self.accepted
        _decay(reached, 0.97)
        _decay(hits, 0.97)
        for n in accepted:
            for depth in range(min(n + 1, num_drafts)):
                reached[depth] += 1.0
                hits[depth] += float(depth < n)
        self._remember()

    def choose(self, batch: int, device, lookup_length: int = 0, lookup_size: int = 0) -> tuple[int, bool]:
        """(draft count k, whether the drafts come from the prompt lookup) for the next cycle; `lookup_length`
        tokens of lookup continuation are on offer (0: none), found by an n-gram of `lookup_size` tokens."""
        table = self.table(batch, device)
        width = functools.partial(gemm_friendly_rows, device=torch.device(device), batch=batch)
        self.cycles += 1
        self._fade_lookup(lookup_size)
        self._remember()
        if self.cycles == 1 or table.draft is None or max(table.verify, default=0) < width(self.most + 1):
            return self.most, False  # a call starts with a full block: its costs (once) and this drafter's acceptance
        # A plain step costs at most what the narrowest measured verify did: until one is measured, that bound
        # favours drafting, so a good drafter is never interrupted just to measure plain decoding.
        plain = table.verify.get(1, min(table.verify.values()))
        drafting = best_draft_count(self.acceptance_rates(), lambda k: table.draft + table.verify_seconds(width(k + 1)))
        choice, speed = (drafting[0], False), drafting[1]
        if lookup_length:
            k, lookup_speed = best_draft_count(self.lookup_rates(lookup_size, lookup_length),
                                               lambda k: table.verify_seconds(width(k + 1)))
            if lookup_speed > speed:
                choice, speed = (k, True), lookup_speed
        if speed > 1.0 / plain:
            self.plain_streak, self.probe_after = 0, 4
            return choice
        self.plain_streak += 1
        if self.plain_streak < self.probe_after:
            return 0, False
        self.plain_streak, self.probe_after = 0, min(64, 2 * self.probe_after)
        return drafting[0], False

    def tree_budget(self, log_probs: list[float], batch: int, device) -> int:
        """Drafts to verify from a best-first tree whose nodes have the drafter's joint path log-probabilities
        `log_probs` (node 0: the anchor): the b maximising (1 + c * sum of the first b path probabilities) /
        t(verify of b + 1 rows), c the measured ratio of accepted to expected drafts (the drafter's calibration).
        The drafter has run already, so its cost does not count here; the whole tree until verify costs are known."""
        table = self.table(batch, device)
        nodes = len(log_probs) - 1
        if len(table.verify) < 2:
            return nodes
        width = functools.partial(gemm_friendly_rows, device=torch.device(device), batch=batch)
        scale = (self.tree_accepted + 1.0) / (self.tree_expected + 1.0)
        best, best_speed, mass = nodes, 0.0, 0.0
        for b in range(1, nodes + 1):
            mass += math.exp(log_probs[b])
            speed = (1.0 + scale * mass) / table.verify_seconds(width(b + 1))
            if speed > best_speed:
                best, best_speed = b, speed
        return best

    def observe_tree(self, expected: float, accepted: int) -> None:
        """One tree verification: the drafter expected `expected` accepted drafts (its path probabilities summed), the
        target accepted `accepted`. Also counted as a chain of that acceptance (the draft-or-not choice)."""
        self.tree_expected = 0.97 * self.tree_expected + expected
        self.tree_accepted = 0.97 * self.tree_accepted + accepted
        self.observe_acceptance(self.most, [accepted])

    def _fade_lookup(self, size: int) -> None:
        # Offered but (maybe) not taken: the counts shrink towards the prior, so a lookup source that looked poor is
        # tried again after a while (copy-heavy passages come and go).
        if size in self.lookup_reached:
            _decay(self.lookup_reached[size], 0.98)
            _decay(self.lookup_accepted[size], 0.98)


def _decay(counts: list[float], factor: float) -> None:
    """Age observation counts in place: old cycles weigh less, so estimates follow a drifting text."""
    counts[:] = [factor * c for c in counts]


def _rates(accepted: list[float], reached: list[float], prior: float = 0.5) -> list[float]:
    return [(a + 2.0 * prior) / (r + 2.0) for a, r in zip(accepted, reached)]


def best_draft_count(rates: list[float], seconds) -> tuple[int, float]:
    """(k, expected tokens per second) of the best draft count k >= 1 for acceptance `rates` by depth and the
    `seconds(k)` a cycle of k drafts costs.

    Example:
        >>> k, speed = best_draft_count([0.9, 0.9, 0.1], lambda k: 1.0 + 0.1 * k)
        >>> k, round(speed, 3)
        (2, 2.258)
    """
    best, expected, reach = (0, 0.0), 1.0, 1.0
    for k, rate in enumerate(rates, 1):
        reach *= rate
        expected += reach
        speed = expected / seconds(k)
        if speed > best[1]:
            best = (k, speed)
    return best


# ----------------------------------------------------------------------------------------------------------------------
# drafting
class DFlashCandidateGenerator(CandidateGenerator):
    """Proposes a block of candidate tokens per sequence with one drafter forward.

    Holds the drafter's cache of context K/V (target features of every token the target has verified, in the same
    slots as the target's own cache, so one padding mask serves both) and the draft length
    ``self.num_assistant_tokens``: how many of the drafter's B-1 drafts the target verifies per cycle, kept as
    transformers' ``AssistedCandidateGenerator`` keeps it. The drafter always fills its whole block in one forward;
    verifying fewer drafts makes the target's verify forward (and the drafter's LM head) cheaper, which pays where
    verify cost grows with its length (CPUs) and the drafter is weak. ``num_assistant_tokens`` caps the count
    (default: all B-1); with ``num_assistant_tokens_schedule="heuristic"`` (or "heuristic_transient": the same, as a
    generator lives for one ``generate`` call) :meth:`update_candidate_strategy` applies transformers' rule: +2
    after a cycle where every row accepted every draft, -1 otherwise, within [1, B-1]. Only the speed changes: every
    count is lossless.

    The default, when the caller sets neither ``num_assistant_tokens`` nor its schedule (``dflash_policy="cost"``):
    each cycle :class:`CostAwarePolicy` picks the draft count that maximises expected committed tokens per second
    from the measured costs of verify forwards by width and of the drafter, and from the acceptance rate by depth
    observed so far; 0 drafts means a plain target step (no drafter forward; its features still reach the drafter
    later). ``dflash_policy="full"`` verifies the whole block every cycle.

    Example:
        >>> generator = DFlashCandidateGenerator(drafter, target, GenerationConfig())  # doctest: +SKIP
        >>> candidates, scores = generator.get_candidates(input_ids, context_hidden_states=features)  # doctest: +SKIP
        >>> generator.update_candidate_strategy(candidates, target_scores, num_matches)  # doctest: +SKIP
    """

    def __init__(self, drafter, target, generation_config, logits_processor=None):
        self.drafter = drafter
        self.input_embeddings = target.get_input_embeddings()
        self.lm_head = target.get_output_embeddings()
        self.block_size = drafter.config.block_size
        self.do_sample = bool(generation_config.do_sample)
        self.logits_processor = logits_processor if logits_processor is not None else lp.LogitsProcessorList()
        self.max_length = generation_config.max_length
        most = self.block_size - 1
        self.num_assistant_tokens = min(most, generation_config.num_assistant_tokens or most)
        self.adaptive = generation_config.num_assistant_tokens_schedule in ("heuristic", "heuristic_transient")
        policy = call_option("dflash_policy") or ("full" if call_option("assistant_settings") else DEFAULT_POLICY)
        memory = _POLICY_MEMORY.setdefault(drafter, {}) if policy == "cost" else None
        self.policy = CostAwarePolicy(target, most, memory) if policy == "cost" and not self.adaptive else None
        # The prompt-lookup source of the cost-aware policy (batch size 1): up to this many tokens that followed the
        # last earlier occurrence of the text's final n-gram (None: off)
        lookup = call_option("dflash_lookup", True)
        self.lookup_tokens = (generation_config.prompt_lookup_num_tokens or DEFAULT_LOOKUP_TOKENS) if lookup else None
        self.lookup_ngram = generation_config.max_matching_ngram_size or 2
        self.lookup_size, self.drafter_ran = 0, False  # where the last candidates came from
        self.full_blocks = False  # a tree needs the whole block's scores whenever the drafter runs
        # Full layers only (no config): sliding-window drafter layers apply their window by mask, over all context
        self.cache = DynamicCache()
        self.cache_keyword = cache_argument(drafter)
        mask_ids = torch.full((1, most), drafter.config.mask_token_id)
        self.mask_embeds = self._embed(mask_ids)
        # A draft vocabulary: the LM head's rows for those tokens, gathered once (on a CPU the head is mostly the
        # cost of reading its weights)
        self.draft_ids = drafter.draft_token_ids()
        if self.draft_ids is not None:
            self.draft_ids = self.draft_ids.to(self.lm_head.weight.device)
            self.draft_head = self.lm_head.weight[self.draft_ids]

    def _embed(self, ids):
        weight = self.input_embeddings.weight
        return self.input_embeddings(ids.to(weight.device)).to(self.drafter.device)

    def get_candidates(
        self,
        input_ids,
        context_hidden_states=None,
        *,
        histories=None,
        context_positions=None,
        anchor_positions=None,
        slot_mask=None,
        **kwargs,
    ):
        """CandidateGenerator API: ``(input_ids + drafts, draft_scores)`` with at most ``self.num_assistant_tokens``
        drafts and none past ``max_length`` (if set); ``(input_ids, None)`` when no draft fits, as transformers'
        generators answer.

        One unpadded sequence: `input_ids` [1, L] ends with the anchor (the token the target has not read yet), and
        `context_hidden_states` [1, n, T*H] are the target features of the positions after those already cached
        here, up to the anchor excluded.

        A batch (as :func:`dflash_decoding` calls it): `input_ids` [b, 1] holds each row's anchor, so the candidates
        are the verify block ``[anchor, drafts]``; `histories` each row's committed tokens (rows may differ in
        length), `context_positions` [b, n] and `anchor_positions` [b] the positions of the context and of the
        anchors, `slot_mask` [b, cache + n] which cache slots hold real tokens (None: all do).
        """
        if histories is None:
            histories = list(input_ids)
            cached, length = self.cache.get_seq_length(), input_ids.shape[1]
            context_positions = torch.arange(cached, length - 1, device=input_ids.device)[None]
            anchor_positions = torch.tensor([length - 1], device=input_ids.device)
        num_drafts, lookup, size = self.num_assistant_tokens, [], 0
        self.lookup_size, self.drafter_ran = 0, False
        room = None if self.max_length is None else self.max_length - min(len(h) for h in histories) - 1
        if self.policy is not None:
            if self.lookup_tokens and len(histories) == 1:
                lookup, size = prompt_lookup_match(histories[0], self.lookup_tokens, self.lookup_ngram,
                                                   min(2, self.lookup_ngram))  # a lone token's match rarely holds
                lookup = lookup if room is None else lookup[: max(room, 0)]
            chosen, from_lookup = self.policy.choose(len(histories), input_ids.device, len(lookup), size)
            if chosen == 0 or from_lookup or not self.full_blocks:
                # the policy caps a chain; a tree (full_blocks) keeps the drafter's whole block whenever it runs
                num_drafts = min(num_drafts, chosen)
            if from_lookup:
                self.lookup_size = size
                drafts = input_ids.new_tensor(lookup[:chosen])[None]
                return torch.cat([input_ids, drafts], dim=1), self._point_mass_scores(drafts)
        if room is not None:
            num_drafts = min(num_drafts, room)
        if num_drafts <= 0:
            return input_ids, None
        drafts, scores = self.propose(
            histories, context_hidden_states, context_positions, anchor_positions, slot_mask, num_drafts
        )
        self.drafter_ran = True
        return torch.cat([input_ids, drafts], dim=1), scores

    def _point_mass_scores(self, drafts):
        # Lookup drafts are proposed with certainty: q is a point mass on each (speculative sampling stays exact).
        scores = torch.full((*drafts.shape, self.lm_head.weight.shape[0]), float("-inf"), device=drafts.device)
        return scores.scatter_(2, drafts[..., None], 0.0)

    def update_candidate_strategy(self, input_ids, scores, num_matches):
        """Adapt ``self.num_assistant_tokens`` after a verification (heuristic schedules only).

        `scores` [b, k + 1, V] are the target's scores for the k drafts and the position after them; `num_matches`
        the accepted drafts (an int, or one per row: the count grows only when every row accepted all k).
        """
        num_drafts = scores.shape[1] - 1
        if self.policy is not None:
            self.policy.observe_acceptance(num_drafts, torch.as_tensor(num_matches).reshape(-1).tolist(),
                                           self.lookup_size)
        if not self.adaptive or num_drafts == 0:
            return
        if bool((torch.as_tensor(num_matches) == num_drafts).all()):
            self.num_assistant_tokens = min(self.block_size - 1, self.num_assistant_tokens + 2)
        else:
            self.num_assistant_tokens = max(1, self.num_assistant_tokens - 1)

    def observe_tree_cycle(self, device, cycle, draft_seconds: float) -> None:
        """A tree cycle's `cycle` = (verify width, accepted drafts, verify seconds, drafts the drafter expected): its
        costs and acceptance for the cost-aware policy."""
        if self.policy is not None:
            width, accepted, seconds, expected = cycle
            self.observe_costs(1, device, width, seconds, draft_seconds)
            self.policy.observe_tree(expected, accepted)

    def observe_costs(self, batch: int, device, width: int, target_seconds: float,
                      draft_seconds: float | None = None) -> None:
        """A cycle's measured costs: the target's seconds for a verify of `width` rows (with any re-advance) and the
        drafter's (None: it did not run). They feed the cost-aware policy's table for this target and batch."""
        if self.policy is not None:
            table = self.policy.table(batch, device)
            table.observe_verify(width, target_seconds)
            if draft_seconds is not None:
                table.observe_draft(draft_seconds)

    def propose(self, histories, context, context_positions, anchor_positions, slot_mask=None, num_drafts=None):
        """One drafter forward: `num_drafts` draft tokens for each row (what :meth:`get_candidates` calls).

        Args:
            histories: committed tokens per row (the last one is the anchor, not yet seen by the target).
            context: [b, n, T*H] target features of the slots the target verified since the last call.
            context_positions: [b, n] their positions; anchor_positions: [b] the anchors' positions.
            slot_mask: [b, cache + n] which cache slots hold real tokens (None: all do).
        Returns:
            drafts [b, num_drafts] and the processed drafter scores they were chosen from (q = softmax(scores)).
        """
        num_drafts = self.block_size - 1 if num_drafts is None else num_drafts
        device, batch = self.drafter.device, len(histories)
        anchors = torch.stack([h[-1:] for h in histories])
        block = torch.cat([self._embed(anchors), self.mask_embeds.expand(batch, -1, -1)], dim=1)
        offsets = torch.arange(self.block_size, device=device)
        positions = torch.cat([context_positions.to(device), anchor_positions.to(device)[:, None] + offsets], dim=1)
        if slot_mask is not None:
            slot_mask = torch.cat([slot_mask, slot_mask.new_ones(batch, self.block_size)], dim=1).to(device)
        hidden = self.drafter(
            noise_embeds=block,
            context_hidden_states=context.to(device),
            position_ids=positions,
            attention_mask=slot_mask,
            **{self.cache_keyword: self.cache},
        ).last_hidden_state
        self.cache.crop(-self.block_size)  # keep the context K/V only
        rows = gemm_friendly_rows(num_drafts + 1, device, batch)
        hidden = hidden[:, :rows].to(self.lm_head.weight.device)
        logits = self.draft_logits(hidden)[:, 1 : num_drafts + 1].float().to(anchors.device)
        return self._choose(histories, logits)

    def draft_logits(self, hidden):
        """The target LM head's logits for drafter `hidden` states; with a draft vocabulary, only its tokens get
        finite logits (-inf elsewhere: never proposed, and q = 0 there for speculative sampling)."""
        if self.draft_ids is None:
            return self.lm_head(hidden)
        partial = hidden @ self.draft_head.T
        if getattr(self.lm_head, "bias", None) is not None:
            partial = partial + self.lm_head.bias[self.draft_ids]
        logits = partial.new_full((*partial.shape[:-1], self.lm_head.weight.shape[0]), float("-inf"))
        return logits.index_copy_(-1, self.draft_ids, partial)

    def _choose(self, histories, logits):
        """Pick draft tokens; vectorised unless a processor depends on the drafts chosen before it.

        Processors that read only which tokens occur (repetition penalty) see the committed history in every
        position: drafts are only a proposal (the target re-scores each position with its exact history), so this
        can change the acceptance rate, never the output.
        """
        processors = self.logits_processor
        batch, k, vocab = logits.shape
        if len(processors) == 0 or k == 0:
            return select_tokens(logits, self.do_sample), logits
        if _vectorizable(processors, histories):
            ids = _padded_histories(histories)[:, None].expand(-1, k, -1).reshape(batch * k, -1)
            scores = processors(ids, logits.reshape(batch * k, vocab).clone()).view(batch, k, vocab)
            return select_tokens(scores, self.do_sample), scores
        scores, drafts = torch.empty_like(logits), []
        for r, history in enumerate(histories):
            ids = history[None]
            with processors_for_rows(processors, [r]):
                for i in range(k):
                    scores[r : r + 1, i] = processors(ids, logits[r : r + 1, i].clone())
                    ids = torch.cat([ids, select_tokens(scores[r : r + 1, i], self.do_sample)[:, None]], dim=1)
            drafts.append(ids[0, len(history) :])
        return torch.stack(drafts), scores


# ----------------------------------------------------------------------------------------------------------------------
# the decoding loop
def target_features(hidden_states, layer_ids) -> torch.Tensor:
    """The drafter's context: the target's hidden states after layers `layer_ids` (output of layer k is
    ``hidden_states[k + 1]``), concatenated on the feature axis: [b, n, T*H]. Training and inference both call this,
    so the drafter is trained on exactly what it reads at inference."""
    return torch.cat([hidden_states[i + 1] for i in layer_ids], dim=-1)


class _OutputRecorder:
    """Per-token scores / logits / hidden states / attentions, in the layout plain ``generate`` returns (batch 1)."""

    def __init__(self, config):
        self.on = bool(config.return_dict_in_generate)
        self.scores = () if self.on and config.output_scores else None
        self.logits = () if self.on and config.output_logits else None
        self.attentions = () if self.on and config.output_attentions else None
        self.hidden_states = () if self.on and config.output_hidden_states else None

    def add(self, outputs, raw, processed, count: int, prefill: bool, kv_length: int):
        """Record `count` committed tokens whose logits are rows 0..count-1 of raw/processed."""
        for i in range(count):
            if self.scores is not None:
                self.scores += (processed[:, i],)
            if self.logits is not None:
                self.logits += (raw[:, i],)
            if self.hidden_states is not None:
                self.hidden_states += (tuple(h if prefill else h[:, i : i + 1] for h in outputs.hidden_states),)
            if self.attentions is not None and outputs.attentions is not None:
                self.attentions += (
                    tuple(a if prefill else a[..., i : i + 1, : kv_length + i + 1] for a in outputs.attentions),
                )


def _first_stop(stopping_criteria, history, start: int, scores) -> int | None:
    """Index (relative to `start`) of the first new token of `history` [L] after which generation must stop.

    `scores` [n, V] holds the processed scores each new token was chosen from (row i for token start + i).
    """
    for i in range(start, len(history)):
        if bool(stopping_criteria(history[None, : i + 1], scores[None, i - start]).any()):
            return i - start
    return None


@dataclass
class _Rows:
    """Per-row state of the rows still generating (axis 0 of every tensor); finished rows leave it.

    The target's and the drafter's caches hold one slot per verified position of every row; the batch's longest
    acceptance sets how many slots a cycle adds, and ``slot_mask`` marks the slots that hold no real token (left
    padding, and drafts a row rejected while a neighbour accepted more) so no row waits for a neighbour.

    Example (two prompts, the second left-padded):
        >>> rows = _Rows.for_prompts(torch.tensor([[5, 6, 7], [0, 8, 9]]), torch.tensor([[1, 1, 1], [0, 1, 1]]))
        >>> rows.feature_positions.tolist(), rows.slot_mask.tolist()
        ([[0, 1, 2], [0, 0, 1]], [[True, True, True], [False, True, True]])
        >>> rows.anchor_positions = torch.tensor([3, 2])
        >>> ids, positions, mask = rows.verify_inputs(torch.tensor([[7, 11], [9, 12]]), width=2)
        >>> positions.tolist(), mask.tolist()
        ([[3, 4], [2, 3]], [[True, True, True, True, True], [False, True, True, True, True]])
    """

    histories: list[torch.Tensor]  # committed tokens per row (its prompt, padding included, first); last: the anchor
    ids: list[int]  # the original batch row of each row
    finished: list[torch.Tensor | None]  # by original batch row: the history a finished row ends with
    slot_mask: torch.Tensor | None  # [b, slots]: which cache slots hold real tokens; None while all do
    feature_positions: torch.Tensor  # [b, n]: positions of the slots verified since the drafter last read features
    features: torch.Tensor | None = None  # [b, n, T*H]: their target features, the drafter's next context
    anchor_positions: torch.Tensor | None = None  # [b]: position of each row's anchor (its last committed token)

    @classmethod
    def for_prompts(cls, input_ids, attention_mask=None) -> "_Rows":
        """The rows of a left-padded batch before the prefill: positions count real tokens only."""
        batch, prompt_len = input_ids.shape
        slot_mask = None if attention_mask is None or bool(attention_mask.all()) else attention_mask.bool()
        if slot_mask is None:
            positions = torch.arange(prompt_len, device=input_ids.device)[None].expand(batch, -1)
        else:
            positions = (slot_mask.long().cumsum(-1) - 1).clamp_min(0)
        return cls(list(input_ids), list(range(batch)), [None] * batch, slot_mask, positions)

    def __len__(self) -> int:
        return len(self.ids)

    def anchors(self) -> torch.Tensor:
        """[b, 1]: each row's last committed token, which the target has not read yet."""
        return torch.stack([h[-1:] for h in self.histories])

    def start(self, tokens, features, scores, stopping_criteria) -> list[int]:
        """After the prefill: append each row's first token (`tokens` [b, 1]); the prompt features are the drafter's
        first context. Returns the rows that go on."""
        self.features, self.anchor_positions = features, self.feature_positions[:, -1] + 1
        return [r for r in range(len(self)) if self._extend(r, tokens[r], scores[r], stopping_criteria)[1]]

    def retire(self, running: list[int], *caches) -> bool:
        """Keep only the rows `running` (indices), here and in `caches`; the others are finished. False: none left."""
        if len(running) == len(self):
            return True
        for r in set(range(len(self))) - set(running):
            self.finished[self.ids[r]] = self.histories[r]
        if not running:
            return False
        keep = torch.tensor(running, device=self.anchor_positions.device)
        for cache in caches:
            select_cache_rows(cache, keep)
        self.histories, self.ids = [self.histories[r] for r in running], [self.ids[r] for r in running]
        self.features, self.feature_positions = self.features[keep], self.feature_positions[keep]
        self.anchor_positions = self.anchor_positions[keep]
        self.slot_mask = self.slot_mask[keep] if self.slot_mask is not None else None
        return True

    def verify_inputs(self, candidates, width: int):
        """Target inputs for `candidates` [b, 1 + k] (anchor, drafts) padded with their last token to `width` slots:
        ids and positions [b, width], and the attention mask over cache and block (None while every slot is real)."""
        ids = torch.cat([candidates, candidates[:, -1:].expand(-1, width - candidates.shape[1])], dim=1)
        positions = self.anchor_positions[:, None] + torch.arange(width, device=self.anchor_positions.device)
        if self.slot_mask is None:
            return ids, positions, None
        return ids, positions, torch.cat([self.slot_mask, self.slot_mask.new_ones(len(self), width)], dim=1)

    def commit(self, accepted, tokens, scores, features, positions, cache, cached: int, stopping_criteria,
               drafter_read: bool = True):
        """Commit a verification: row r accepted `accepted[r]` drafts and then `tokens[r, accepted[r]]`.

        The target `cache` (`cached` slots before the verify forward) keeps the slots of the longest acceptance;
        shorter rows mark their rejected slots as padding. The kept slots' `features` / `positions` [b, width, ...]
        become the drafter's next context (after the unread ones, when the drafter did not run this cycle). Each row's history grows by its tokens, cut exactly where plain generate
        would stop (EOS, max length, stop strings inside the block; `scores` [b, k + 1, V] feed the criteria).

        Returns (the rows that go on, the tokens each row committed).
        """
        keep = int(accepted.max()) + 1
        cache.crop(-(positions.shape[1] - keep))
        real = torch.arange(keep, device=self.anchor_positions.device)[None] <= accepted[:, None]
        if self.slot_mask is not None or not bool(real.all()):
            before = self.slot_mask if self.slot_mask is not None else real.new_ones(len(self), cached)
            self.slot_mask = torch.cat([before, real], dim=1)
        if drafter_read:
            self.features, self.feature_positions = features[:, :keep], positions[:, :keep]
        else:  # a plain step: the drafter has not read the previous features either; it reads both next time
            self.features = torch.cat([self.features, features[:, :keep]], dim=1)
            self.feature_positions = torch.cat([self.feature_positions, positions[:, :keep]], dim=1)
        self.anchor_positions = self.anchor_positions + accepted + 1
        running, committed = [], []
        for r, n in enumerate(accepted.tolist()):
            new, goes_on = self._extend(r, tokens[r, : n + 1], scores[r], stopping_criteria)
            committed.append(new)
            if goes_on:
                running.append(r)
        return running, committed

    def _extend(self, r: int, tokens, scores, stopping_criteria):
        """Append `tokens` to row r's history up to the first one plain generate stops after: (appended, goes on)."""
        start = len(self.histories[r])
        history = torch.cat([self.histories[r], tokens])
        stop = _first_stop(stopping_criteria, history, start, scores)
        self.histories[r] = history if stop is None else history[: start + stop + 1]
        return self.histories[r][start:], stop is None


def _holds_keys(layer) -> bool:
    """Whether a cache layer keeps attention K/V slots (hybrid layers keep them beside their linear states)."""
    return not isinstance(layer, LINEAR_ATTENTION_LAYERS) or hasattr(layer, "keys")


def select_cache_rows(cache, rows: torch.Tensor) -> None:
    """Keep only batch `rows` of every layer of `cache`, linear-attention (recurrent / conv) states included."""
    for layer in getattr(cache, "layers", None) or [cache]:
        if isinstance(layer, LINEAR_ATTENTION_LAYERS):
            LINEAR_ATTENTION_LAYERS.reorder_cache(layer, rows)  # index_select of its states over the batch
        if _holds_keys(layer):
            layer.batch_select_indices(rows)


def cache_slots(cache) -> int | None:
    """Slots the target's cache holds (None for a cache of recurrent layers only, which has no slots: the loop needs
    the count only to lay out padding masks, and such a target is run with none in the middle)."""
    if any(_holds_keys(layer) for layer in getattr(cache, "layers", [cache])):
        return cache.get_seq_length()
    return None


def has_sliding_window(cache) -> bool:
    """Whether some layer of the target's cache keeps only a window of recent tokens (Mistral, Gemma, gpt-oss...)."""
    return any(isinstance(layer, SLIDING_WINDOW_LAYERS) for layer in getattr(cache, "layers", ()))


class RecurrentStates:
    """The recurrent states of a hybrid target's cache (Qwen3.5 / Qwen3-Next Gated DeltaNet, Mamba layers of
    Falcon-H1 or GraniteMoeHybrid...), saved before each verify forward.

    K/V and convolution states can be cropped back to the accepted prefix; a recurrent state cannot: the verify
    forward folded every draft into it. After a partial acceptance the loop restores the saved states, crops the
    rest of the cache to before the verify block, and re-advances the target through the committed tokens only
    (one extra target forward over accepted + 1 tokens; none when every draft was accepted).

    Example:
        >>> bool(RecurrentStates(DynamicCache()))  # a plain attention cache holds no recurrent state
        False
    """

    def __init__(self, cache):
        self.layers = [layer for layer in getattr(cache, "layers", ()) if isinstance(layer, LINEAR_ATTENTION_LAYERS)]
        self.saved: list[dict] = []

    def __bool__(self) -> bool:
        return any(any(layer.is_recurrent_states_initialized.values()) for layer in self.layers)

    def save(self) -> None:
        self.saved = [{i: state.clone() for i, state in layer.recurrent_states.items() if state is not None}
                      for layer in self.layers]

    def restore(self) -> None:
        for layer, saved in zip(self.layers, self.saved):
            for i, state in saved.items():
                layer.recurrent_states[i].copy_(state)  # in place: the cache keeps its tensors' addresses


def _accept(drafts, draft_scores, scores, do_sample: bool):
    """Step 4 for drafts [b, k] and target `scores` [b, k + 1, V]: (accepted drafts [b], tokens [b, k + 1])."""
    if do_sample and drafts.shape[1] > 0:
        return speculative_accept(drafts, draft_scores.softmax(-1), scores.softmax(-1))
    if do_sample:
        return drafts.new_zeros(drafts.shape[0]), select_tokens(scores, True)
    return greedy_accept(drafts, scores)


def _empty_target_cache(target, model_kwargs):
    """The caller's cache (which must be empty) or a new DynamicCache; sliding-window layers can be cropped back."""
    cache = model_kwargs.get("past_key_values", model_kwargs.get("cache"))  # `cache` from transformers 5.24 on
    if cache is None:
        cache = DynamicCache(config=target.config)
    if cache_slots(cache) or RecurrentStates(cache):
        raise ValueError("A pre-filled past_key_values is not supported with a DFlash drafter; pass the full prompt.")
    if hasattr(cache, "activate_past_recording"):
        cache.activate_past_recording()
    return cache


def _synchronized_clock(device: torch.device) -> float:
    """perf_counter after the device's queued work is done, so a difference of two covers the work, not its launch."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


@torch.no_grad()
def dflash_decoding(
    target,
    input_ids: torch.LongTensor,
    logits_processor,
    stopping_criteria,
    generation_config,
    synced_gpus: bool = False,
    streamer=None,
    assistant_model=None,
    **model_kwargs,
):
    """Speculative decoding with a DFlash drafter; ``generate`` calls it in place of ``_assisted_decoding``.

    Works on a left-padded batch: every row keeps all the drafts the target accepts for it (see :class:`_Rows`).
    The numbered steps are the module docstring's.
    """
    drafter, config = assistant_model, generation_config
    start_time = time.perf_counter()
    batch, prompt_len = input_ids.shape
    stats = DFlashStats(block_size=drafter.config.block_size, row_acceptance_lengths=[[] for _ in range(batch)])
    drafter.last_stats = stats
    layer_ids = list(drafter.config.target_layer_ids)
    recorder, do_sample = _OutputRecorder(config), bool(config.do_sample)
    cache = _empty_target_cache(target, model_kwargs)
    generator = DFlashCandidateGenerator(drafter, target, config, logits_processor)
    want_hidden = True if config.output_hidden_states else [i + 1 for i in layer_ids]
    forward_kwargs = {cache_argument(target): cache, "use_cache": True, "output_hidden_states": want_hidden}
    if config.output_attentions:
        forward_kwargs["output_attentions"] = True
    budget = requested_tree_budget(config, call_option(TREE_BUDGET_KWARG))
    tree = None if budget is None else TreeVerifier(  # steps 3-5 over a tree of drafts (tree_dflash.py)
        budget, target, cache, forward_kwargs, logits_processor, stopping_criteria, config, batch=batch,
        features=lambda hidden: target_features(hidden, layer_ids), vectorizable=_vectorizable,
        pad_rows=lambda n: gemm_friendly_rows(n, input_ids.device),
    )
    if tree is not None and generator.policy is not None:
        # the policy chooses plain steps, lookup chains or a tree, and each tree's budget from its node probabilities
        generator.full_blocks = True
        tree.choose_budget = functools.partial(generator.policy.tree_budget, batch=batch, device=input_ids.device)
    elif tree is None and config.prompt_lookup_num_tokens and (generator.policy is None or not generator.lookup_tokens):
        raise ValueError(
            f"prompt_lookup_num_tokens={config.prompt_lookup_num_tokens} with a DFlash drafter is the length of its "
            f"prompt-lookup drafts: they compete with the drafter's under the default dflash_policy='cost' (with "
            f"dflash_lookup on), or form one more branch of a tree ({TREE_BUDGET_KWARG}=16). This call has neither "
            "(dflash_policy='full', num_assistant_tokens settings or dflash_lookup=False): drop one, or drop "
            "assistant_model for prompt lookup decoding alone."
        )

    # 1. prefill: the target reads the prompts and chooses the first new token alone
    rows = _Rows.for_prompts(input_ids, model_kwargs.get("attention_mask"))
    outputs = target(
        input_ids=input_ids, attention_mask=rows.slot_mask, position_ids=rows.feature_positions, logits_to_keep=1,
        **forward_kwargs,
    )
    raw = outputs.logits[:, -1:].float()
    processed = logits_processor(input_ids, raw[:, 0].clone())[:, None] if len(logits_processor) else raw
    tokens = select_tokens(processed, do_sample)
    recorder.add(outputs, raw, processed, 1, prefill=True, kv_length=0)
    if streamer is not None:
        streamer.put(tokens[0].cpu())
    stats.prefill_seconds = time.perf_counter() - start_time
    running = rows.start(tokens, target_features(outputs.hidden_states, layer_ids), processed, stopping_criteria)
    recurrent, sliding = RecurrentStates(cache), has_sliding_window(cache)

    while rows.retire(running, cache, generator.cache, _ProcessorRows(logits_processor)):
        # 2. draft: candidates [anchor, drafts] per row from one drafter forward (just the anchor at max_length - 1)
        tic = _synchronized_clock(input_ids.device)
        candidates, draft_scores = generator.get_candidates(
            rows.anchors(), rows.features, histories=rows.histories, context_positions=rows.feature_positions,
            anchor_positions=rows.anchor_positions, slot_mask=rows.slot_mask,
        )
        drafts, drafter_ran = candidates[:, 1:], generator.drafter_ran
        drafted = _synchronized_clock(input_ids.device)
        stats.draft_seconds += drafted - tic
        stats.lookup_cycles += int(generator.lookup_size > 0)
        if tree is not None and drafter_ran:
            running = tree.cycle(rows, cache, draft_scores, stats, recorder, streamer)
            generator.observe_tree_cycle(input_ids.device, tree.last_cycle, drafted - tic)
            continue

        # 3. verify the candidates in one target forward (padded to a GEMM-friendly row count on CPU; not for
        # recurrent targets, where padding would cost a re-advance)
        batch = len(rows)
        width = candidates.shape[1] if recurrent else gemm_friendly_rows(candidates.shape[1], input_ids.device, batch)
        verify_ids, positions, mask = rows.verify_inputs(candidates, width)
        cached = cache_slots(cache)
        if recurrent:
            recurrent.save()
        outputs = target(
            input_ids=verify_ids, attention_mask=mask, position_ids=positions, logits_to_keep=0, **forward_kwargs
        )
        raw = outputs.logits[:, : candidates.shape[1]].float()
        processed = processed_verify_scores(logits_processor, rows.histories, drafts, raw)

        # 4. accept drafts as the target would have chosen them, then the target's own next token
        accepted, tokens = _accept(drafts, draft_scores, processed, do_sample)
        if len(rows) > 1 and (recurrent.layers or sliding):
            # Every row commits the batch's shortest acceptance: a recurrent or convolution state cannot skip a
            # rejected slot, and a masked slot would take a place in a sliding window that plain decoding gives a real
            # token. Each row's first shortest-acceptance + 1 tokens are target tokens (accepted drafts), so this
            # stays exact.
            accepted = accepted.clamp(max=int(accepted.min()))
        verified = _synchronized_clock(input_ids.device)
        stats.verify_seconds += verified - drafted
        stats._add_verification(rows.ids, accepted)
        stats.drafts_per_cycle.append(drafts.shape[1])
        generator.update_candidate_strategy(candidates, processed, accepted)

        # 5. commit, stopping exactly where plain generate would
        features = target_features(outputs.hidden_states, layer_ids)
        keep, verify_width = int(accepted.max()) + 1, width
        if recurrent and keep < width:  # the recurrent states read rejected drafts: rewind and re-advance
            cache.crop(-width)
            recurrent.restore()
            outputs = target(
                input_ids=verify_ids[:, :keep], attention_mask=None if mask is None else mask[:, : mask.shape[1] - width + keep],
                position_ids=positions[:, :keep], logits_to_keep=1, **forward_kwargs,
            )
            features = target_features(outputs.hidden_states, layer_ids)
            width = keep
        target_seconds = _synchronized_clock(input_ids.device) - drafted  # verify, accept and any re-advance
        generator.observe_costs(batch, input_ids.device, verify_width, target_seconds,
                                drafted - tic if drafter_ran else None)
        running, committed = rows.commit(
            accepted, tokens, processed, features, positions[:, :width], cache, cached, stopping_criteria,
            drafter_read=drafter_ran,
        )
        if len(committed) == 1:
            recorder.add(outputs, raw, processed, len(committed[0]), prefill=False, kv_length=cached)
            if streamer is not None:
                streamer.put(committed[0].cpu())

    if streamer is not None:
        streamer.end()
    sequences = _right_padded(rows.finished, config)
    stats.new_tokens = sum(len(h) - prompt_len for h in rows.finished)
    stats.total_seconds = time.perf_counter() - start_time
    if not config.return_dict_in_generate:
        return sequences
    return GenerateDecoderOnlyOutput(
        sequences=sequences,
        scores=recorder.scores,
        logits=recorder.logits,
        attentions=recorder.attentions,
        hidden_states=recorder.hidden_states,
        **{cache_argument(GenerateDecoderOnlyOutput): cache},
    )


def cache_argument(model_or_output) -> str:
    """The cache's keyword for a model's forward or a generate output: `cache` from transformers 5.24 on (where
    `past_key_values` is deprecated, removed in 5.40), `past_key_values` before."""
    if isinstance(model_or_output, type) and dataclasses.is_dataclass(model_or_output):
        names = {f.name for f in dataclasses.fields(model_or_output)}
    else:
        names = set(inspect.signature(model_or_output.forward).parameters)
    return "cache" if "cache" in names else "past_key_values"


def _right_padded(histories: list[torch.Tensor], config) -> torch.Tensor:
    """Finished rows padded with pad_token_id to the longest row, as plain batched generate returns them."""
    longest = max(len(h) for h in histories)
    if all(len(h) == longest for h in histories):
        return torch.stack(histories)
    pad = config._pad_token_tensor
    if pad is None:
        raise ValueError("Batched generation with rows of different lengths needs a pad_token_id.")
    pad = pad.reshape(-1)[:1].to(histories[0])
    return torch.stack([torch.cat([h, pad.expand(longest - len(h))]) for h in histories])


# ----------------------------------------------------------------------------------------------------------------------
# routing
# generate() keyword arguments of our own (transformers would refuse them as unused model kwargs): taken out of the
# call by the routing and read by dflash_decoding for that call.
DFLASH_GENERATE_KWARGS = ("dflash_policy", "dflash_tree_budget", "dflash_lookup")
_call_options: contextvars.ContextVar[dict] = contextvars.ContextVar("hf_dflash_call_options", default={})


def call_option(name: str, default=None):
    """The value of one of :data:`DFLASH_GENERATE_KWARGS` for the generate() call in progress."""
    return _call_options.get().get(name, default)


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
            options["assistant_settings"] = _explicit_assistant_settings(args, kwargs)
            check_generate_call(self, drafter, args, kwargs)
            check_call_options(options)
            token = _call_options.set(options)
            try:
                with _rewindable_target(self):
                    return original(self, *args, **kwargs)
            finally:
                _call_options.reset(token)
        return dflash_decoding(self, *args, **kwargs)

    wrapper._hf_dflash_original = original
    return wrapper


@contextlib.contextmanager
def _rewindable_target(target):
    """transformers refuses assisted generation for stateful (recurrent) targets because its loop cannot bring their
    state back to the accepted prefix; ours does (:class:`RecurrentStates`), so the refusal is lifted for the call."""
    if not getattr(target, "_is_stateful", False):
        yield
        return
    target._is_stateful = False
    try:
        yield
    finally:
        del target._is_stateful


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
