# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""Configuration of DFlash2 drafters (z-lab + Inco AI, 2026-08): a DFlash config plus the convolution and candidate
selector fields, in the published layout that vLLM reads (``vllm/model_executor/models/qwen3_dflash2.py``).

Part of the remote-code payload: imports only transformers and sibling modules (`from .x import y`).

On disk: ``architectures: ["DFlash2DraftModel"]``, ``model_type: "qwen3"``, and ``dflash_config`` with
``block_size``, ``mask_token_id``, ``target_layer_ids`` (as DFlash) plus ``conv_group_size``, ``conv_kernel_size``,
``selector_rank``, ``selector_top_k``, ``output_multiplier``, ``final_logit_softcapping`` (and optionally
``input_embedding_scale``). Whether the drafter owns ``embed_tokens`` / ``lm_head`` is not in the config: vLLM and
:meth:`DFlash2DraftModel.from_pretrained` read it from the weight names.
"""

from .configuration_dflash import (
    DFLASH2_ARCHITECTURE,
    DFLASH2_FIELDS,
    DFLASH2_REQUIRED,
    DFlashConfig,
    check_variant_layout,
)

# Load-time facts about a checkpoint's weights, never written to config.json (the published layout has no such keys)
OWNED_WEIGHTS = {"has_own_embed_tokens": "embed_tokens.weight", "has_own_lm_head": "lm_head.weight"}


class DFlash2Config(DFlashConfig):
    r"""
    Configuration of a [`DFlash2DraftModel`]: a [`DFlashConfig`] plus the DFlash2 fields (all read from and written to
    ``dflash_config``; see ``modeling_dflash2.py`` for what each computes).

    Args:
        conv_group_size (`int`): channels per group of the dynamic depthwise convolutions (divides hidden_size).
        conv_kernel_size (`int`): taps of those convolutions (tap 0 is the position itself).
        selector_rank (`int`): rank of the candidate selector's codebooks.
        selector_top_k (`int`): candidates per block position the selector walks between.
        output_multiplier (`float`, defaults to 1.0): scale of the candidates' logits (> 0).
        final_logit_softcapping (`float`, *optional*): soft cap c of the scaled logits, ``c * tanh(x / c)``;
            None or 0: no cap.
        input_embedding_scale (`float`, defaults to 1.0): scale of the block's input embeddings.
        has_own_embed_tokens / has_own_lm_head (`bool`): the checkpoint ships its own embeddings / LM head (else
            the target's are shared); set by `from_pretrained` from the weight names, not saved.

    Example:
        >>> from hf_dflash.configuration_dflash2 import DFlash2Config
        >>> config = DFlash2Config(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        ...                        intermediate_size=128, num_hidden_layers=1, vocab_size=100,
        ...                        dflash_config={"mask_token_id": 99, "target_layer_ids": [1, 2], "block_size": 8,
        ...                                       "conv_group_size": 16, "conv_kernel_size": 4, "selector_rank": 8,
        ...                                       "selector_top_k": 4})
        >>> nested = config.to_dict()["dflash_config"]
        >>> nested["selector_top_k"], nested["conv_kernel_size"], config.to_dict()["architectures"]
        (4, 4, ['DFlash2DraftModel'])
    """

    def __init__(
        self,
        conv_group_size: int | None = None,
        conv_kernel_size: int | None = None,
        selector_rank: int | None = None,
        selector_top_k: int | None = None,
        output_multiplier: float = 1.0,
        final_logit_softcapping: float | None = None,
        input_embedding_scale: float = 1.0,
        has_own_embed_tokens: bool = False,
        has_own_lm_head: bool = False,
        dflash_config: dict | None = None,
        **kwargs,
    ):
        nested = dict(dflash_config or {})
        given = dict(conv_group_size=conv_group_size, conv_kernel_size=conv_kernel_size, selector_rank=selector_rank,
                     selector_top_k=selector_top_k, output_multiplier=output_multiplier,
                     final_logit_softcapping=final_logit_softcapping, input_embedding_scale=input_embedding_scale)
        # The nested value wins, as DFlashConfig does for its own nested fields
        fields = {name: nested.pop(name, value) for name, value in given.items()}
        kwargs["architectures"] = [DFLASH2_ARCHITECTURE]
        # A bare DFlash2Config() (transformers builds one to diff a config against its defaults) has no fields yet
        bare = all(fields[name] is None for name in DFLASH2_REQUIRED)
        if not bare:
            check_variant_layout({**kwargs, "dflash_config": fields, "layer_fusion": kwargs.get("layer_fusion"),
                                  "split_context_kv": kwargs.get("split_context_kv")})
        super().__init__(dflash_config=nested, **kwargs)
        for name in DFLASH2_REQUIRED:
            setattr(self, name, None if bare else int(fields[name]))
        self.output_multiplier = float(fields["output_multiplier"] if fields["output_multiplier"] is not None else 1.0)
        cap = fields["final_logit_softcapping"]
        self.final_logit_softcapping = float(cap) if cap else None
        scale = fields["input_embedding_scale"]
        self.input_embedding_scale = float(scale if scale is not None else 1.0)
        self.has_own_embed_tokens, self.has_own_lm_head = bool(has_own_embed_tokens), bool(has_own_lm_head)
        if not bare:
            check_dflash2_values(self)

    def to_dict(self) -> dict:
        output = super().to_dict()
        for flag in OWNED_WEIGHTS:
            output.pop(flag, None)
        nested = output["dflash_config"]
        for name in DFLASH2_FIELDS:
            value = output.pop(name, None)
            if name != "input_embedding_scale" or value != 1.0:  # optional in the published layout: only when set
                nested[name] = value
        output["architectures"] = [DFLASH2_ARCHITECTURE]
        return output


def check_dflash2_values(config) -> None:
    """Raise a ValueError naming the field when a DFlash2 value cannot work (vLLM refuses the same ones)."""
    hidden = config.hidden_size
    if config.conv_group_size < 1 or hidden % config.conv_group_size:
        raise ValueError(f"dflash_config.conv_group_size={config.conv_group_size} must divide hidden_size={hidden} "
                         "(channels per convolution group).")
    if config.conv_kernel_size < 1:
        raise ValueError(f"dflash_config.conv_kernel_size={config.conv_kernel_size}: the convolution needs >= 1 tap.")
    if not 1 <= config.selector_top_k <= config.vocab_size or config.selector_rank < 1:
        raise ValueError(f"dflash_config.selector_top_k={config.selector_top_k} must lie in [1, vocab_size="
                         f"{config.vocab_size}] and selector_rank={config.selector_rank} must be >= 1.")
    if config.output_multiplier <= 0:
        raise ValueError(f"dflash_config.output_multiplier={config.output_multiplier} must be > 0: candidates are "
                         "the top logits before it is applied (vLLM refuses the same).")
    if config.layer_fusion or config.split_context_kv:
        raise ValueError("layer_fusion / split_context_kv are DFlare switches, which DFlash2 drafters do not have: "
                         "drop them.")


# When hf_dflash is installed, a remote-code copy of this module hands back the installed class (see
# configuration_dflash.py).
if not __name__.startswith("hf_dflash."):
    try:
        from hf_dflash.configuration_dflash2 import DFlash2Config  # noqa: F401, F811
    except ImportError:
        pass
