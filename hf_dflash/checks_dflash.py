# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""Every check of a ``generate(assistant_model=drafter, ...)`` call, and the ``dflash_*`` options it may carry.

All of them run before any forward and raise a ValueError that names the values and the fix. The call's DFlash
settings come out resolved as one :class:`DFlashCallOptions`, which the loop hands to the parts it builds.

Part of the remote-code payload: imports only torch, transformers and sibling modules.
"""

import os
import weakref
from dataclasses import dataclass

import torch
from transformers.utils import logging

from .cache_dflash import config_cache_layers, is_recurrent, is_sliding_window
from .checkpoint_dflash import hub_id_of, plain_head_rows, saved_weight_dtype
from .configuration_dflash import default_target_layer_ids
from .stats_dflash import AcceptanceEvidence, DFlashStats


logger = logging.get_logger(__name__)


# generate() keyword arguments of our own (transformers would refuse them as unused model kwargs): taken out of the
# call by the routing and resolved into DFlashCallOptions for that call.
TREE_BUDGET_KWARG = "dflash_tree_budget"
DFLASH_GENERATE_KWARGS = ("dflash_policy", TREE_BUDGET_KWARG, "dflash_lookup")
DFLASH_POLICIES = ("cost", "full")
DEFAULT_POLICY = "cost"  # when the caller sets neither dflash_policy nor transformers' draft-length settings
DEFAULT_LOOKUP_TOKENS = 10  # the cost-aware policy's prompt-lookup source, unless prompt_lookup_num_tokens says
DRAFT_LENGTH_SCHEDULES = ("constant", "heuristic", "heuristic_transient")
ADAPTIVE_SCHEDULES = ("heuristic", "heuristic_transient")
TREE_ATTENTION = ("sdpa", "eager")


@dataclass(frozen=True)
class DFlashCallOptions:
    """The DFlash settings of one generate() call, resolved once; the loop hands them to the parts it builds.

    `policy`: how each cycle's draft count is chosen (policy_dflash.py): "cost" (from measured costs; plain steps when
    drafting does not pay), "full" (the whole block, or a constant ``num_assistant_tokens``) or "heuristic"
    (transformers' ``num_assistant_tokens_schedule="heuristic"``, which then rules); `lookup_tokens`: the longest
    prompt-lookup draft the cost-aware policy may verify instead of the drafter's (None: none); `branch_tokens`: the
    longest n-gram branch a tree adds (``prompt_lookup_num_tokens``; None: none); `lookup_ngram`: the longest n-gram
    lookups match (``max_matching_ngram_size``); `tree_budget`: draft nodes of a verified tree (None: chains);
    `max_length`: the call's limit on the text's length in tokens, as generate prepared it (None: none known yet).

    Example:
        >>> from transformers import GenerationConfig
        >>> resolve_call_options(GenerationConfig(), {"dflash_policy": "full"})  # doctest: +NORMALIZE_WHITESPACE
        DFlashCallOptions(policy='full', lookup_tokens=None, branch_tokens=None, lookup_ngram=2, tree_budget=None,
                          max_length=None)
        >>> resolve_call_options(GenerationConfig(max_length=12)).room(10)  # drafts that fit after 10 tokens
        1
    """

    policy: str = DEFAULT_POLICY
    lookup_tokens: int | None = DEFAULT_LOOKUP_TOKENS
    branch_tokens: int | None = None
    lookup_ngram: int = 2
    tree_budget: int | None = None
    max_length: int | None = None

    def room(self, length: int) -> int | None:
        """Drafts that fit after a text of `length` tokens (the anchor included) under `max_length`; None: no limit.
        The target's token after the drafts needs one place too."""
        return None if self.max_length is None else self.max_length - length - 1


def check_positive_int(name: str, value, meaning: str) -> None:
    """`value` must be an int >= 1 (not a bool) or None; `meaning` says what it counts and what None means."""
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise ValueError(f"{name}={value!r}: {meaning} must be an int >= 1.")


def resolve_call_options(generation_config, options: dict | None = None) -> DFlashCallOptions:
    """The call's :class:`DFlashCallOptions` from its ``dflash_*`` arguments `options` (plus "assistant_settings":
    whether the caller set transformers' draft-length settings) and its generation config; raises on bad values."""
    options = options or {}
    policy = options.get("dflash_policy")
    if policy is not None and policy not in DFLASH_POLICIES:
        raise ValueError(f"dflash_policy={policy!r}: use 'cost' (the default: choose the draft length from measured "
                         "costs, plain steps when speculation does not pay) or 'full' (verify the whole block).")
    lookup = options.get("dflash_lookup")
    if lookup is not None and not isinstance(lookup, bool):
        raise ValueError(f"dflash_lookup={lookup!r}: True (the default: the cost-aware policy may verify prompt-lookup "
                         "drafts instead of the drafter's) or False (drafter drafts only).")
    check_draft_length_settings(generation_config)
    lookup_tokens = getattr(generation_config, "prompt_lookup_num_tokens", None)
    check_positive_int("prompt_lookup_num_tokens", lookup_tokens, "the length of the prompt-lookup drafts")
    budget = options.get(TREE_BUDGET_KWARG)
    budget = budget if budget is not None else getattr(generation_config, TREE_BUDGET_KWARG, None)
    check_positive_int(TREE_BUDGET_KWARG, budget, "the draft nodes verified per cycle (None: chains)")
    if generation_config.num_assistant_tokens_schedule in ADAPTIVE_SCHEDULES:
        policy = "heuristic"
    policy = policy or ("full" if options.get("assistant_settings") else DEFAULT_POLICY)
    lookup_source = policy == "cost" and lookup is not False
    resolved = DFlashCallOptions(
        policy=policy,
        lookup_tokens=(lookup_tokens or DEFAULT_LOOKUP_TOKENS) if lookup_source else None,
        branch_tokens=lookup_tokens if budget is not None else None,
        lookup_ngram=getattr(generation_config, "max_matching_ngram_size", None) or 2,
        tree_budget=budget,
        max_length=getattr(generation_config, "max_length", None),
    )
    if budget is None and lookup_tokens and not lookup_source:
        raise ValueError(
            f"prompt_lookup_num_tokens={lookup_tokens} with a DFlash drafter is the length of its prompt-lookup "
            f"drafts: they compete with the drafter's under the default dflash_policy='cost' (with dflash_lookup "
            f"on), or form one more branch of a tree ({TREE_BUDGET_KWARG}=16). This call has neither "
            "(dflash_policy='full', num_assistant_tokens settings or dflash_lookup=False): drop one, or drop "
            "assistant_model for prompt lookup decoding alone."
        )
    return resolved


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


# Drafters already warned about for being quantized: one warning per drafter, not one per call
_WARNED_QUANTIZED: weakref.WeakSet = weakref.WeakSet()


def warn_quantized_drafter(drafter) -> None:
    """A quantized drafter is served (the target verifies every draft, so output stays exact) but warned about once,
    with the reason: quantizing a drafter of a few layers saves little (it costs a few percent of the target) and
    changes the numbers its drafts come from, so fewer of them are accepted."""
    if drafter in _WARNED_QUANTIZED or not is_quantized(drafter):
        return
    _WARNED_QUANTIZED.add(drafter)
    logger.warning(
        f"The DFlash drafter {type(drafter).__name__} is quantized. Output stays exact (the target verifies every "
        "draft), but a drafter of a few layers loses accepted drafts to quantization (its quantized kernels and "
        "rounding are not what it was trained with) while saving little: it costs a few percent of the target. "
        "Load the drafter unquantized, in the dtype it was saved in; the target may stay quantized."
    )


def check_generate_call(target, drafter, args: tuple, kwargs: dict, options: dict | None = None) -> DFlashCallOptions:
    """Validate a ``generate(assistant_model=drafter, ...)`` call before any work is done; returns its resolved
    DFlash options (`options`: its ``dflash_*`` arguments, see :func:`resolve_call_options`)."""
    check_drafter_matches_target(target, drafter)
    warn_quantized_drafter(drafter)
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
    mask = kwargs.get("attention_mask")
    if isinstance(mask, torch.Tensor) and mask.dim() == 2 and bool((mask[:, 1:] < mask[:, :-1]).any()):
        raise ValueError(
            "The attention_mask masks tokens after real ones (right padding). A DFlash drafter needs left padding "
            "only: tokenize with padding_side='left'."
        )
    options = dict(options or {}, assistant_settings=explicit_assistant_settings(args, kwargs))
    resolved = resolve_call_options(generation_config, options)
    cache = kwargs.get("past_key_values", kwargs.get("cache"))
    check_tree_call(target, resolved.tree_budget, batch, cache)
    return resolved


def explicit_assistant_settings(args: tuple, kwargs: dict) -> bool:
    """Whether the caller set transformers' draft-length settings (then they rule, as for any assistant)."""
    names = ("num_assistant_tokens", "num_assistant_tokens_schedule")
    config = kwargs.get("generation_config", args[1] if len(args) > 1 else None)
    return any(kwargs.get(n) is not None or getattr(config, n, None) is not None for n in names)


def check_target_rewindable(target) -> None:
    """A stateful target must keep its recurrent state in transformers' linear-attention cache layers, which the loop
    can save and restore; a state kept elsewhere could not be rewound after a rejected draft."""
    if not getattr(target, "_is_stateful", False):
        return
    if not any(is_recurrent(layer) for layer in config_cache_layers(target)):
        raise ValueError(
            f"{type(target).__name__} keeps a recurrent state outside transformers' cache layers, so a DFlash drafter "
            "cannot rewind it after a rejected draft. Generate without assistant_model for this model (or upgrade "
            "transformers, where hybrid models keep their states in LinearAttention cache layers)."
        )


def check_draft_length_settings(config) -> None:
    """`num_assistant_tokens` must be a positive int and the schedule one transformers knows."""
    check_positive_int("num_assistant_tokens", config.num_assistant_tokens,
                       "the drafts verified per cycle (or None for the drafter's whole block)")
    schedule = config.num_assistant_tokens_schedule
    if schedule is not None and schedule not in DRAFT_LENGTH_SCHEDULES:
        raise ValueError(
            f"num_assistant_tokens_schedule={schedule!r} is not supported with a DFlash drafter; use one of "
            f"{DRAFT_LENGTH_SCHEDULES} (or None: constant)."
        )


def check_tree_call(target, budget, batch: int, cache=None) -> None:
    """Raise a ValueError naming the alternative when a tree of `budget` nodes cannot be verified for this call."""
    if budget is None:
        return
    check_positive_int(TREE_BUDGET_KWARG, budget, "the draft nodes verified per cycle (None: chains)")
    if batch > 1:
        raise ValueError(
            f"{TREE_BUDGET_KWARG} with batch size {batch}: tree verification runs one sequence at a time. Drop "
            f"{TREE_BUDGET_KWARG} to verify chains in a batch, or generate one prompt at a time with a tree."
        )
    name = type(target).__name__
    layers = getattr(cache, "layers", ()) if cache is not None else config_cache_layers(target)
    if getattr(target, "_is_stateful", False) or any(is_recurrent(layer) for layer in layers):
        raise ValueError(
            f"{TREE_BUDGET_KWARG} with {name}: a hybrid/recurrent target folds every verified token into its state, "
            f"so it cannot verify a tree of drafts. Drop {TREE_BUDGET_KWARG} (chain verification works for it)."
        )
    if any(is_sliding_window(layer) for layer in layers):
        raise ValueError(
            f"{TREE_BUDGET_KWARG} with {name}: sliding-window layers keep a window of consecutive positions, which the "
            f"branches of a tree are not. Drop {TREE_BUDGET_KWARG} (chain verification works for it)."
        )
    attention = getattr(target.config, "_attn_implementation", None)
    if attention not in TREE_ATTENTION:
        raise ValueError(
            f"{TREE_BUDGET_KWARG} with attn_implementation={attention!r}: the tree mask is a 4D attention mask, which "
            f"only {' / '.join(TREE_ATTENTION)} attention reads. Load the target with attn_implementation='sdpa', or "
            f"drop {TREE_BUDGET_KWARG}."
        )


# ----------------------------------------------------------------------------------------------------------------------
# zero acceptance is never silent: after every generate() call, the pair's evidence, and once it shows the
# drafts are almost never accepted, one warning with the causes that can be checked cheaply
def check_acceptance(target, drafter, stats: DFlashStats) -> str | None:
    """Add the call's first-draft acceptances (`stats`) to those of the (`drafter`, `target`) pair; once they show
    its drafts are almost never accepted (see :class:`AcceptanceEvidence`), log ONE warning naming the measured rate
    and the likely causes. Returns that finding (None: no finding), for this call's and every later call's
    ``drafter.last_stats.low_acceptance``."""
    evidence = pair_evidence(drafter, target)
    evidence.add(stats)
    if evidence.finding is None and evidence.almost_never_accepted():
        evidence.finding = low_acceptance_finding(evidence, low_acceptance_causes(target, drafter))
        logger.warning(evidence.finding)
    return evidence.finding


# {drafter: {target: AcceptanceEvidence}}, dropped with either model (not kept on the drafter: it would stop
# pickling, e.g. torch.save(drafter))
_EVIDENCE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def pair_evidence(drafter, target) -> AcceptanceEvidence:
    """The evidence gathered for `drafter` with `target` over this process's generate() calls."""
    by_target = _EVIDENCE.setdefault(drafter, weakref.WeakKeyDictionary())
    return by_target.setdefault(target, AcceptanceEvidence())


def low_acceptance_finding(evidence: AcceptanceEvidence, causes: list[str]) -> str:
    """The warning: the measured rate against what trained drafters reach, then the likely causes, numbered.

    Example:
        >>> low_acceptance_finding(AcceptanceEvidence(verified=60, calls=2), ["a cause"])[:90]
        'DFlash drafts are almost never accepted: 0 of 60 first drafts (0.0%) over 2 generate() cal'
    """
    listed = " ".join(f"({i}) {cause}." for i, cause in enumerate(causes, 1)) or (
        "None of the checks found a cause (target name, vocabulary, hidden size, target layer ids, draft head rows, "
        "dtype and quantization, mask token): the drafter is likely untrained or trained for other text.")
    return (f"DFlash drafts are almost never accepted: {evidence.accepted} of {evidence.verified} first drafts "
            f"({evidence.rate:.1%}) over {evidence.calls} generate() call(s), where a drafter trained for this target "
            f"accepts far more (the shipped SmolLM2 drafter: ~37%). Output is right but there is no speedup. Likely "
            f"causes, most specific first: {listed} Use a drafter trained for this target, or drop assistant_model.")


def low_acceptance_causes(target, drafter) -> list[str]:
    """What can be checked cheaply about why `drafter`'s drafts are not accepted by `target`, most specific first:
    the target it was trained for, its vocabulary and width, the target layers it reads, its draft head rows, its
    dtype and quantization, its mask token. Each entry names both values and the fix; [] when none applies."""
    return [cause for check in CAUSE_CHECKS for cause in check(target, drafter)]


def other_target_causes(target, drafter) -> list[str]:
    """A drafter trained for another target: its config names another one, or other special tokens, vocabulary or
    width (the last two generate() refuses before any forward)."""
    text, config, causes = target.config.get_text_config(), drafter.config, []
    recorded = getattr(config, "target_name_or_path", None)
    loaded = str(getattr(target, "name_or_path", "") or "")
    if recorded and loaded and not same_model_name(recorded, loaded):
        causes.append(f"the drafter was trained for target_name_or_path={recorded!r}, this target is {loaded!r}: use "
                      "the drafter made for this target")
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
        mine, theirs = getattr(config, name, None), getattr(text, name, None)
        if mine is not None and theirs is not None and mine != theirs:
            causes.append(f"the drafter's {name}={mine} but the target's is {theirs}: it was likely trained with "
                          "another tokenizer, whose token ids mean other text")
    for name in ("vocab_size", "hidden_size"):
        mine, theirs = getattr(config, name, None), getattr(text, name, None)
        if mine != theirs:
            causes.append(f"the drafter's {name}={mine} but the target's is {theirs}: it was made for another target")
    return causes


def same_model_name(recorded: str, loaded: str) -> bool:
    """Whether the Hub id a drafter recorded names the target loaded from `loaded` (a Hub id, a Hub cache snapshot
    or a local folder named like the model).

    Example:
        >>> same_model_name("HuggingFaceTB/SmolLM2-135M-Instruct", "/root/.cache/models/SmolLM2-135M-Instruct")
        True
        >>> same_model_name("Qwen/Qwen3-8B", "Qwen/Qwen3-4B")
        False
    """
    hub_id = hub_id_of(loaded)
    if hub_id is not None:
        return hub_id == recorded
    return os.path.basename(os.path.normpath(loaded)) == recorded.rpartition("/")[2]


def target_layer_causes(target, drafter) -> list[str]:
    """Target layer ids out of range, shifted by one from the z-lab rule (a converter that added or dropped the +1
    of ``hidden_states[k + 1]``), or the last layer (transformers gives it after the final norm, engines before)."""
    ids, depth = list(drafter.config.target_layer_ids or []), target.config.get_text_config().num_hidden_layers
    out = [i for i in ids if not 0 <= i < depth]
    if out:
        return [f"target_layer_ids={ids} include {out}, outside the target's {depth} layers (0..{depth - 1})"]
    causes, rule = [], default_target_layer_ids(depth, len(ids))
    for shift in (1, -1):
        if ids != rule and ids == [i + shift for i in rule]:
            causes.append(f"target_layer_ids={ids} look shifted by {shift:+d} from the usual {rule}: the layer k "
                          "features are hidden_states[k + 1]; check the converter or the training script did not "
                          "add or drop that +1")
    if depth - 1 in ids:
        causes.append(f"target_layer_ids={ids} read the target's last layer {depth - 1}, which transformers gives "
                      "after the final norm (engines before it): a drafter trained elsewhere reads other features")
    return causes


def draft_head_causes(target, drafter) -> list[str]:
    """A draft vocabulary whose head rows are not the target's LM head rows for its tokens (wrong d2t offsets, or the
    head of another target)."""
    ids, head = drafter.draft_token_ids(), getattr(drafter, "lm_head", None)
    if ids is None or head is None:
        return []
    rows = target.get_output_embeddings().weight
    theirs = plain_head_rows(rows, ids.to(rows.device)).to(device=head.weight.device, dtype=torch.float32)
    if theirs.shape == head.weight.shape and torch.allclose(head.weight.float(), theirs, rtol=1e-2, atol=1e-3):
        return []
    return [f"the drafter's draft_vocab_size={len(ids)} head rows are not the target's LM head rows for its tokens "
            "(i + d2t[i]): re-gather them, drafter.set_draft_vocabulary(drafter.draft_token_ids(), "
            "lm_head=target.get_output_embeddings())"]


def dtype_causes(target, drafter) -> list[str]:
    """A drafter running in a narrower dtype than it was saved in (a cast up to float32 loses nothing), or quantized."""
    causes, weight = [], next(drafter.parameters())
    saved = saved_weight_dtype(getattr(drafter, "name_or_path", None)) or str(getattr(drafter.config, "dtype", "")
                                                                             ).removeprefix("torch.")
    running = str(weight.dtype).removeprefix("torch.")
    if saved and saved != running and running not in ("float32", "float64"):
        causes.append(f"the drafter runs in {running} but was saved in {saved}: a drafter of a few layers may lose "
                      f"its drafts to the cast; measure its acceptance in {saved}")
    if is_quantized(drafter):
        causes.append("the drafter is quantized: its few layers lose what its drafts depend on; load it unquantized "
                      "(the target may stay quantized)")
    return causes


# Where the quantized layers that transformers integrates (and torch's own) are defined
QUANTIZED_MODULE_PACKAGES = ("torch.ao.nn.quantized", "torch.nn.quantized", "bitsandbytes", "torchao", "optimum.quanto")


def is_quantized(model) -> bool:
    """Whether `model` was quantized: by transformers (a quantizer, a quantization_config), or in place (integer or
    tensor-subclass weights, quantized layer classes).

    Example:
        >>> is_quantized(torch.nn.Linear(2, 2)), is_quantized(torch.nn.Linear(2, 2).to(torch.bfloat16))
        (False, False)
    """
    if getattr(model, "hf_quantizer", None) is not None or getattr(getattr(model, "config", None),
                                                                   "quantization_config", None) is not None:
        return True
    if any(not p.dtype.is_floating_point or type(p.data) is not torch.Tensor for p in model.parameters()):
        return True
    return any(type(m).__module__.startswith(QUANTIZED_MODULE_PACKAGES) for m in model.modules())


def mask_token_causes(target, drafter) -> list[str]:
    """A mask token the target's vocabulary does not have, or whose embedding row is all zeros (a token added to the
    tokenizer after training, or a row never initialised)."""
    mask, vocab = drafter.config.mask_token_id, target.config.get_text_config().vocab_size
    embeddings = target.get_input_embeddings().weight
    if mask is None or not 0 <= mask < embeddings.shape[0]:
        return [f"mask_token_id={mask} is outside the target's embedding table of {embeddings.shape[0]} rows"]
    if mask >= vocab:
        return [f"mask_token_id={mask} is outside the target's vocabulary (vocab_size={vocab}): set the mask token "
                "the drafter was trained with"]
    if not bool(embeddings[mask].any()):
        return [f"the target's embedding row for mask_token_id={mask} is all zeros, a token the tokenizer does not "
                "know or a row never trained: check it is the mask token the drafter was trained with"]
    return []


# most specific first
CAUSE_CHECKS = (other_target_causes, target_layer_causes, draft_head_causes, dtype_causes, mask_token_causes)
