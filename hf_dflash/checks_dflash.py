# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""The checks of a ``generate(assistant_model=drafter, ...)`` call, made before any forward: the drafter against the
target, the call's settings (beam search, batches and the outputs they return, padding side, trees), the ``dflash_*``
arguments (:func:`~options_dflash.resolve_call_options` resolves them into the call's options).

Each raises a ValueError that names the values and the fix. A quantized drafter is served, with a warning
(diagnostics_dflash.py, where the low-acceptance warnings after a call are).

Part of the remote-code payload: imports only torch, transformers and sibling modules.
"""

import torch

from .cache_dflash import config_cache_layers, is_recurrent, is_sliding_window
from .diagnostics_dflash import warn_quantized_drafter
from .options_dflash import DFlashCallOptions, TREE_BUDGET_KWARG, check_positive_int, resolve_call_options
from .policy_dflash import POLICIES


TREE_ATTENTION = ("sdpa", "eager")


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


def check_generate_call(target, drafter, args: tuple, kwargs: dict, options: dict | None = None) -> DFlashCallOptions:
    """Validate a ``generate(assistant_model=drafter, ...)`` call before any work is done; returns its resolved
    options (`options`: its ``dflash_*`` arguments, see :func:`~options_dflash.resolve_call_options`)."""
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
    check_policy_name((options or {}).get("dflash_policy"))
    options = dict(options or {}, assistant_settings=explicit_assistant_settings(args, kwargs))
    resolved = resolve_call_options(generation_config, options)
    cache = kwargs.get("past_key_values", kwargs.get("cache"))
    check_tree_call(target, resolved.tree_budget, batch, cache)
    return resolved


def check_policy_name(policy) -> None:
    """`dflash_policy` names one of the draft policies (``policy_dflash.POLICIES``), or is None (the default)."""
    if policy is not None and (not isinstance(policy, str) or policy not in POLICIES):
        raise ValueError(
            f"dflash_policy={policy!r}: use one of {', '.join(map(repr, POLICIES))}. The default 'cost' chooses the "
            "draft length from measured costs (plain steps when speculation does not pay); 'full' verifies the whole "
            "block; 'heuristic' is transformers' num_assistant_tokens_schedule='heuristic'."
        )


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
