# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""Why a drafter's drafts are not accepted: the warnings that name the likely causes.

Before a call, a quantized drafter is warned about once (:func:`warn_quantized_drafter`); after every generate()
call, the pair's evidence grows, and once it shows the drafts are almost never accepted, ONE warning lists the causes
that can be checked cheaply (:func:`check_acceptance`). Output is exact either way: these only warn.

Part of the remote-code payload: imports only torch, transformers and sibling modules.
"""

import os
import weakref

import torch
from transformers.utils import logging

from .checkpoint_dflash import hub_id_of, plain_head_rows, saved_weight_dtype
from .configuration_dflash import default_target_layer_ids
from .stats_dflash import AcceptanceEvidence, DFlashStats


logger = logging.get_logger(__name__)


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
