# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""Grouped-query attention for the DFlash loop's forwards on CPU, switched on per call, never through ``os.environ``.

transformers' SDPA attention (``transformers.integrations.sdpa_attention``) attends with grouped key/value heads
(``enable_gqa``) only when its rule ``use_gqa_in_sdpa`` says so: on CPU and CUDA only for unmasked forwards, unless
``TRANSFORMERS_SDPA_FORCE_GQA=1`` is in the environment. A masked forward (any verify of more than one row) otherwise
copies every cached key and value once per query head first.

Importing this module wraps that rule once: it also answers yes while :func:`grouped_query_attention` is active in
the caller's own context (a :class:`contextvars.ContextVar`: per thread, per asyncio task), and is transformers' own
rule everywhere else, bit for bit. Wrapping the rule, rather than registering an attention function of our own,
keeps the rest of transformers' SDPA path (masks, causal slicing, position bias) exactly as transformers has it.
A transformers without the rule keeps its attention as it is: verifies then copy the heads, with the same logits.

Part of the remote-code payload: imports only torch and transformers.
"""

import contextlib
import contextvars
import functools
import os

import torch
from transformers.integrations import sdpa_attention

__all__ = ["FORCE_GQA", "grouped_heads_switched_on", "grouped_query_attention"]

FORCE_GQA = "TRANSFORMERS_SDPA_FORCE_GQA"  # transformers' own switch, read from the environment at each forward


def _grouped_or_transformers_rule(rule, switch: contextvars.ContextVar):
    """transformers' rule `rule`, answering yes while `switch` is on in the caller's context."""

    @functools.wraps(rule)
    def use_gqa_in_sdpa(attention_mask, key, value) -> bool:
        # torch.compile cannot trace a ContextVar (fullgraph raises): a compiled forward keeps transformers' rule
        if not torch.compiler.is_compiling() and switch.get():
            return True
        return rule(attention_mask, key, value)

    use_gqa_in_sdpa._hf_dflash_switch = switch
    use_gqa_in_sdpa._hf_dflash_original = rule
    return use_gqa_in_sdpa


def _installed_switch() -> contextvars.ContextVar | None:
    """The switch read by transformers' (wrapped) rule: installed by the first copy of this module to load, shared by
    later ones (a remote-code copy beside the installed package); None where transformers has no such rule."""
    rule = getattr(sdpa_attention, "use_gqa_in_sdpa", None)
    if rule is None:
        return None
    switch = getattr(rule, "_hf_dflash_switch", None)
    if switch is None:
        switch = contextvars.ContextVar("hf_dflash_grouped_heads", default=False)
        sdpa_attention.use_gqa_in_sdpa = _grouped_or_transformers_rule(rule, switch)
    return switch


_SWITCH = _installed_switch()


def grouped_heads_switched_on() -> bool:
    """Whether SDPA forwards in the current context attend with grouped key/value heads under a mask.

    Example:
        >>> grouped_heads_switched_on()
        False
        >>> with grouped_query_attention("cuda"):  # GPUs keep transformers' rule
        ...     grouped_heads_switched_on()
        False
    """
    return _SWITCH is not None and _SWITCH.get()


@contextlib.contextmanager
def grouped_query_attention(device):
    """On CPU, SDPA attends with the cached key/value heads as they are, mask or not, for the forwards of this thread
    (or asyncio task) inside the block; other threads, and the environment, are untouched.

    transformers' SDPA path uses grouped-query attention only for unmasked forwards: a verify of k > 1 rows (masked)
    first copies every cached key and value once per query head. After a 4K-token prompt that copy made a 2-row verify
    of SmolLM2-135M cost 2.0 t(1) instead of 1.45 (16 rows: 2.9 instead of 2.3; one CPU thread, torch 2.13), with
    bitwise identical logits. GPUs keep transformers' rule (a masked grouped-query call may take a slower kernel
    there), and a ``TRANSFORMERS_SDPA_FORCE_GQA`` the user set decides alone.

    Example:
        >>> import os
        >>> environment = dict(os.environ)
        >>> with grouped_query_attention("cpu"):
        ...     grouped = grouped_heads_switched_on() or FORCE_GQA in os.environ  # a value you set decides alone
        ...     untouched = dict(os.environ) == environment
        >>> grouped, untouched, grouped_heads_switched_on()
        (True, True, False)
    """
    if _SWITCH is None or torch.device(device).type != "cpu" or FORCE_GQA in os.environ:
        yield
        return
    token = _SWITCH.set(True)
    try:
        yield
    finally:
        _SWITCH.reset(token)
