# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""Lossless speculative generation with a DFlash drafter, behind the ordinary ``generate(assistant_model=...)``.

Part of the remote-code payload: imports only torch and transformers.

One cycle (batch 1):
  1. the drafter reads the target features of the newly committed tokens and proposes ``block_size - 1`` tokens
     in ONE forward over ``[anchor, MASK, ...]``;
  2. the target verifies ``[anchor, drafts]`` in ONE forward;
  3. greedy: the longest prefix of drafts equal to the target's own choices is kept, plus the target's next
     token; sampling: speculative sampling (accept with min(1, p/q), resample from norm(max(0, p - q))).
Output equals what ``generate()`` would give without the drafter, because every committed token is the target's.

Routing: importing this module wraps ``GenerationMixin.generate`` (argument checks before any work) and
``GenerationMixin._assisted_decoding`` (sends DFlash drafters to :func:`dflash_decoding`), idempotently. Other
assistants (small LMs, prompt lookup, early exit) go to transformers untouched. Opt out with
:func:`disable_dflash_generation` or the :func:`builtin_generation` context manager.
"""

import contextlib
import functools
import time
from dataclasses import dataclass, field

import torch
from transformers import GenerationMixin
from transformers.cache_utils import DynamicCache
from transformers.generation import logits_process as lp
from transformers.generation.candidate_generator import CandidateGenerator
from transformers.generation.utils import GenerateDecoderOnlyOutput
from transformers.utils import logging


logger = logging.get_logger(__name__)

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
    mean is the paper's tau. Times are host wall-clock seconds (no device synchronisation).
    """

    block_size: int
    acceptance_lengths: list[int] = field(default_factory=list)
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
        n = max(1, len(self.acceptance_lengths))
        return [sum(a > k for a in self.acceptance_lengths) / n for k in range(1, self.block_size)]


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
    if batch > 1:
        raise ValueError(
            f"Batch size {batch} with a DFlash drafter: speculative decoding here runs one sequence at a time "
            "(batch size 1). Call generate once per prompt, or drop assistant_model for batched generation."
        )
    if kwargs.get("inputs_embeds") is not None:
        raise ValueError("inputs_embeds with a DFlash drafter is not supported: pass input_ids instead.")


# ----------------------------------------------------------------------------------------------------------------------
# logits processing over a block
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


def processed_verify_scores(processors, input_ids, drafts, logits):
    """Processed target scores for a verify block: row i was computed after ``input_ids + drafts[:, :i]``.

    One call for the whole block when every processor allows it (position-independent warpers, repetition
    penalty); otherwise one call per position with the exact prefix, as plain ``generate`` would.
    """
    if len(processors) == 0:
        return logits
    rows, cur = logits.shape[1], input_ids.shape[1]
    full = torch.cat([input_ids, drafts], dim=1)
    if all(_ids_independent(p) or _set_dependent(p, cur) for p in processors):
        histories = full[:, : cur + rows - 1].expand(rows, -1).clone()
        tail = histories[:, cur:]
        # Row i must not see drafts i..: overwrite them with the anchor, which every row's history already holds.
        later = torch.arange(rows - 1, device=full.device)[None, :] >= torch.arange(rows, device=full.device)[:, None]
        tail[later] = input_ids[0, -1]
        return processors(histories, logits[0].clone()).unsqueeze(0)
    out = torch.empty_like(logits)
    for i in range(rows):
        out[:, i] = processors(full[:, : cur + i], logits[:, i].clone())
    return out


def select_tokens(scores: torch.Tensor, do_sample: bool) -> torch.Tensor:
    """[..., V] scores -> [...] token ids (argmax, or one sample from softmax)."""
    if not do_sample:
        return scores.argmax(dim=-1)
    probs = scores.softmax(dim=-1).reshape(-1, scores.shape[-1])
    return torch.multinomial(probs, num_samples=1).view(scores.shape[:-1])


def speculative_accept(drafts, draft_probs, target_probs):
    """Speculative sampling for one block (batch 1).

    drafts [1, k] were sampled from draft_probs [1, k, V]; target_probs is [1, k + 1, V]. Returns the number of
    accepted drafts n and the committed tokens [1, n + 1] (accepted drafts + a token from the residual or bonus).
    """
    k = drafts.shape[1]
    idx = torch.arange(k, device=drafts.device)
    p = target_probs[0, idx, drafts[0]]
    q = draft_probs[0, idx, drafts[0]]
    accepted = torch.rand(k, device=drafts.device) * q < p  # u < p/q, without dividing by q
    n = int((~accepted).cumsum(0).eq(0).sum())
    if n < k:
        residual = (target_probs[0, n] - draft_probs[0, n]).clamp_min(0)
        residual = residual if float(residual.sum()) > 0 else target_probs[0, n]
    else:
        residual = target_probs[0, k]
    token = torch.multinomial(residual / residual.sum(), num_samples=1)
    return n, torch.cat([drafts[:, :n], token[None]], dim=1)


def gemm_friendly_rows(rows: int, device: torch.device) -> int:
    """CPU fp32 GEMMs with 9..15 rows cost more than with 16 (a faster kernel starts at 16): round up there."""
    return 16 if device.type == "cpu" and 9 <= rows < 16 else rows


# ----------------------------------------------------------------------------------------------------------------------
# drafting
class DFlashCandidateGenerator(CandidateGenerator):
    """Proposes a block of candidate tokens with one drafter forward.

    Holds the drafter's cache of context K/V (target features of every committed token the target has processed).
    ``get_candidates(input_ids, context_hidden_states=new_features)`` returns ``(input_ids + drafts, draft_scores)``;
    draft_scores are the processed drafter logits the drafts were chosen from (q = softmax(draft_scores)).
    """

    def __init__(self, drafter, target, generation_config, logits_processor=None, padding: int = 0):
        self.drafter = drafter
        self.padding = padding  # leading (left) padding tokens of input_ids: not part of the target's sequence
        self.input_embeddings = target.get_input_embeddings()
        self.lm_head = target.get_output_embeddings()
        self.block_size = drafter.config.block_size
        self.do_sample = bool(generation_config.do_sample)
        self.logits_processor = logits_processor if logits_processor is not None else lp.LogitsProcessorList()
        self.cache = DynamicCache(config=drafter.config)
        self.context_length = 0
        device = drafter.device
        mask_ids = torch.full((1, self.block_size - 1), drafter.config.mask_token_id, device=device)
        self.mask_embeds = self.input_embeddings(mask_ids.to(self.input_embeddings.weight.device)).to(device)

    def get_candidates(self, input_ids, context_hidden_states=None, num_drafts=None, **kwargs):
        num_drafts = self.block_size - 1 if num_drafts is None else num_drafts
        anchor_pos = input_ids.shape[1] - 1 - self.padding
        device = self.drafter.device
        if self.context_length + context_hidden_states.shape[1] != anchor_pos:
            raise RuntimeError(
                f"DFlash context out of step: {self.context_length} cached + {context_hidden_states.shape[1]} new "
                f"features for an anchor at position {anchor_pos}."
            )
        anchor = self.input_embeddings(input_ids[:, -1:].to(self.input_embeddings.weight.device)).to(device)
        positions = torch.arange(self.context_length, anchor_pos + self.block_size, device=device)[None]
        hidden = self.drafter(
            noise_embeds=torch.cat([anchor, self.mask_embeds], dim=1),
            context_hidden_states=context_hidden_states.to(device),
            position_ids=positions,
            past_key_values=self.cache,
        ).last_hidden_state
        self.cache.crop(-self.block_size)  # keep the context K/V only
        self.context_length = anchor_pos
        rows = gemm_friendly_rows(num_drafts + 1, device)
        hidden = hidden[:, :rows].to(self.lm_head.weight.device)
        logits = self.lm_head(hidden)[:, 1 : num_drafts + 1].float().to(input_ids.device)
        drafts, scores = self._choose(input_ids, logits)
        return torch.cat([input_ids, drafts], dim=1), scores

    def _choose(self, input_ids, logits):
        """Pick draft tokens; vectorised unless a processor depends on the drafts chosen before it.

        Processors that read only which tokens occur (repetition penalty) see the committed history in every row:
        drafts are only a proposal (the target re-scores each position with its exact history), so this can change
        the acceptance rate, never the output.
        """
        processors = self.logits_processor
        if len(processors) == 0 or logits.shape[1] == 0:
            return select_tokens(logits, self.do_sample), logits
        if all(_ids_independent(p) or _set_dependent(p) for p in processors):
            scores = processors(input_ids.expand(logits.shape[1], -1), logits[0].clone()).unsqueeze(0)
            return select_tokens(scores, self.do_sample), scores
        scores, ids = torch.empty_like(logits), input_ids
        for i in range(logits.shape[1]):
            scores[:, i] = processors(ids, logits[:, i].clone())
            ids = torch.cat([ids, select_tokens(scores[:, i], self.do_sample)[:, None]], dim=1)
        return ids[:, input_ids.shape[1] :], scores

    def update_candidate_strategy(self, input_ids, scores, num_matches):
        pass  # block size is fixed by training


# ----------------------------------------------------------------------------------------------------------------------
# the decoding loop
def _features(hidden_states, layer_ids) -> torch.Tensor:
    return torch.cat([hidden_states[i + 1] for i in layer_ids], dim=-1)


class _OutputRecorder:
    """Per-token scores / logits / hidden states / attentions, in the layout plain ``generate`` returns."""

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


def _first_stop(stopping_criteria, input_ids, start: int, scores) -> int | None:
    """Index (relative to `start`) of the first new token after which generation must stop, else None.

    `scores` [1, n, V] holds the processed scores each new token was chosen from (row i for token start + i).
    """
    for i in range(start, input_ids.shape[1]):
        if bool(stopping_criteria(input_ids[:, : i + 1], scores[:, i - start]).any()):
            return i - start
    return None


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
    """Speculative decoding with a DFlash drafter; called by ``generate`` in place of ``_assisted_decoding``."""
    drafter, config = assistant_model, generation_config
    start_time = time.perf_counter()
    stats = DFlashStats(block_size=drafter.config.block_size)
    drafter.last_stats = stats
    layer_ids = list(drafter.config.target_layer_ids)
    want_hidden = True if config.output_hidden_states else [i + 1 for i in layer_ids]
    recorder = _OutputRecorder(config)
    do_sample = bool(config.do_sample)

    # Leading padding of a single prompt changes nothing for the target: the target and the drafter never see it
    # (positions start at 0 after it, as with generate's own position ids), while logits processors, stopping
    # criteria and max_length see the whole sequence, as they do in plain generate.
    padding = _leading_padding(model_kwargs.get("attention_mask"))
    cache = model_kwargs.get("past_key_values")
    if cache is None:
        cache = DynamicCache(config=target.config)
    if cache.get_seq_length() > 0:
        raise ValueError("A pre-filled past_key_values is not supported with a DFlash drafter; pass the full prompt.")
    if hasattr(cache, "activate_past_recording"):
        cache.activate_past_recording()  # lets sliding-window layers be cropped back
    generator = DFlashCandidateGenerator(drafter, target, config, logits_processor, padding=padding)
    forward_kwargs = dict(past_key_values=cache, use_cache=True, output_hidden_states=want_hidden)
    if config.output_attentions:
        forward_kwargs["output_attentions"] = True

    # 1. prefill: the first new token comes from the target alone
    prompt_len = input_ids.shape[1]
    positions = torch.arange(prompt_len - padding, device=input_ids.device)[None]
    outputs = target(input_ids=input_ids[:, padding:], position_ids=positions, logits_to_keep=1, **forward_kwargs)
    raw = outputs.logits[:, -1:].float()
    processed = logits_processor(input_ids, raw[:, 0].clone())[:, None] if len(logits_processor) else raw
    token = select_tokens(processed, do_sample)
    recorder.add(outputs, raw, processed, 1, prefill=True, kv_length=0)
    features = _features(outputs.hidden_states, layer_ids)
    input_ids = torch.cat([input_ids, token], dim=1)
    stats.prefill_seconds = time.perf_counter() - start_time
    if streamer is not None:
        streamer.put(token.cpu())
    finished = _first_stop(stopping_criteria, input_ids, input_ids.shape[1] - 1, processed) is not None

    while not finished:
        # 2. draft (nothing to draft when only one token is left before max_length: a plain decoding step)
        cur = input_ids.shape[1]
        num_drafts = min(drafter.config.block_size - 1, config.max_length - cur - 1)
        tic = time.perf_counter()
        if num_drafts > 0:
            candidates, draft_scores = generator.get_candidates(input_ids, features, num_drafts)
            drafts = candidates[:, cur:]
        else:
            drafts = input_ids.new_empty((1, 0))
            draft_scores = None
        stats.draft_seconds += time.perf_counter() - tic

        # 3. verify [anchor, drafts] in one target forward (padded to a GEMM-friendly row count on CPU)
        tic = time.perf_counter()
        rows = gemm_friendly_rows(num_drafts + 1, input_ids.device)
        verify_ids = torch.cat([input_ids[:, -1:], drafts], dim=1)
        if rows > verify_ids.shape[1]:
            verify_ids = torch.cat([verify_ids, verify_ids[:, -1:].expand(-1, rows - verify_ids.shape[1])], dim=1)
        anchor_pos = cur - 1 - padding
        positions = torch.arange(anchor_pos, anchor_pos + rows, device=input_ids.device)[None]
        outputs = target(input_ids=verify_ids, position_ids=positions, logits_to_keep=0, **forward_kwargs)
        raw = outputs.logits[:, : num_drafts + 1].float()
        processed = processed_verify_scores(logits_processor, input_ids, drafts, raw)
        if do_sample and num_drafts > 0:
            n, new_tokens = speculative_accept(drafts, draft_scores.softmax(-1), processed.softmax(-1))
        elif do_sample:
            n, new_tokens = 0, select_tokens(processed, True)
        else:
            choice = processed.argmax(dim=-1)
            n = int((drafts != choice[:, :num_drafts]).cumsum(dim=1).eq(0).sum())
            new_tokens = choice[:, : n + 1]
        stats.verify_seconds += time.perf_counter() - tic
        stats.acceptance_lengths.append(n + 1)

        # 4. commit, stopping exactly where plain generate would (EOS, max length, stop strings inside the block)
        input_ids = torch.cat([input_ids, new_tokens], dim=1)
        stop = _first_stop(stopping_criteria, input_ids, cur, processed)
        if stop is not None:
            input_ids, new_tokens, finished = input_ids[:, : cur + stop + 1], new_tokens[:, : stop + 1], True
        recorder.add(outputs, raw, processed, new_tokens.shape[1], prefill=False, kv_length=anchor_pos)
        if streamer is not None:
            streamer.put(new_tokens[0].cpu())
        cache.crop(-(rows - n - 1))  # keep anchor + accepted drafts
        features = _features(outputs.hidden_states, layer_ids)[:, : n + 1]

    if streamer is not None:
        streamer.end()
    sequences = input_ids
    stats.new_tokens = input_ids.shape[1] - prompt_len
    stats.total_seconds = time.perf_counter() - start_time
    if not config.return_dict_in_generate:
        return sequences
    return GenerateDecoderOnlyOutput(
        sequences=sequences,
        scores=recorder.scores,
        logits=recorder.logits,
        attentions=recorder.attentions,
        hidden_states=recorder.hidden_states,
        past_key_values=cache,
    )


def _leading_padding(attention_mask) -> int:
    if attention_mask is None or bool(attention_mask.all()):
        return 0
    row = attention_mask[0]
    padding = int(row.cumsum(0).eq(0).sum())
    if not bool(row[padding:].all()):
        raise ValueError("A DFlash drafter needs an attention_mask that only masks leading (left) padding.")
    return padding


# ----------------------------------------------------------------------------------------------------------------------
# routing
def _routes(original):
    """Wrap a GenerationMixin method so DFlash drafters get our checks / loop; everything else passes through."""
    name = original.__name__

    @functools.wraps(original)
    def wrapper(self, *args, **kwargs):
        drafter = kwargs.get("assistant_model")
        if drafter is None or not is_dflash_drafter(drafter):
            return original(self, *args, **kwargs)
        if name == "generate":
            check_generate_call(self, drafter, args, kwargs)
            return original(self, *args, **kwargs)
        return dflash_decoding(self, *args, **kwargs)

    wrapper._hf_dflash_original = original
    return wrapper


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
