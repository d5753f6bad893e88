# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""Configuration of DFlash / DFlare block-diffusion drafters.

Part of the remote-code payload: imports only torch and transformers, and only siblings as `from .x import y`.

The on-disk layout is the z-lab one that vLLM and SGLang read: a Qwen3 config (``model_type: "qwen3"``) plus
``block_size``, ``num_target_layers`` and ``dflash_config: {mask_token_id, target_layer_ids}``. Newer published
drafters keep ``block_size`` inside ``dflash_config`` and use ``rope_parameters``; both layouts load.
"""

from transformers import Qwen3Config

DFLASH_ARCHITECTURE = "DFlashDraftModel"
DFLARE_ARCHITECTURE = "QwenDFlareDraftModel"
DFLASH2_ARCHITECTURE = "DFlash2DraftModel"
SUPPORTED_ARCHITECTURES = (DFLASH_ARCHITECTURE, DFLARE_ARCHITECTURE, DFLASH2_ARCHITECTURE)
# The dflash_config keys of a DFlash2 drafter (configuration_dflash2.py): required, then optional
DFLASH2_REQUIRED = ("conv_group_size", "conv_kernel_size", "selector_rank", "selector_top_k")
DFLASH2_FIELDS = DFLASH2_REQUIRED + ("output_multiplier", "final_logit_softcapping", "input_embedding_scale")


def default_target_layer_ids(num_target_layers: int, num_features: int) -> list[int]:
    """The z-lab rule for which target layers feed the drafter.

    One feature -> the middle layer; otherwise evenly spaced from layer 1 to layer ``n - 3``.

    Example:
        >>> default_target_layer_ids(36, 5)
        [1, 9, 17, 25, 33]
    """
    if num_features == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    ids = [int(round(start + i * (end - start) / (num_features - 1))) for i in range(num_features)]
    return [min(max(i, 0), num_target_layers - 1) for i in ids]  # very shallow targets: stay inside the model


class DFlashConfig(Qwen3Config):
    r"""
    Configuration of a [`DFlashDraftModel`]: the Qwen3 layer hyper-parameters plus the DFlash fields.

    Args:
        block_size (`int`, defaults to 16):
            Tokens per drafted block (anchor + ``block_size - 1`` drafts).
        target_layer_ids (`list[int]`):
            0-based ids of the target decoder layers whose outputs are concatenated as context features.
        mask_token_id (`int`):
            Row of the target's embedding table used as the MASK input of the block.
        num_target_layers (`int`):
            Depth of the target the drafter was built for (checked against the target at generate time).
        layer_fusion (`bool`, defaults to False):
            DFlare: per-layer softmax mixing of the target features instead of one `fc` projection.
        split_context_kv (`bool`, defaults to False):
            DFlare: separate `k_proj_target` / `v_proj_target` for the context tokens.
        layer_types (`list[str]`, *optional*) and sliding_window (`int`, *optional*):
            ``"sliding_attention"`` layers attend only to keys within ``sliding_window`` positions of each query
            (context and block alike), in inference and in training. Saved with vLLM's keys too:
            ``dflash_config.swa_window_size`` and ``dflash_config.causal: false`` (the block sees itself both ways).
        draft_vocab_size (`int`, *optional*):
            Drafts are chosen among this many target tokens only (EAGLE-3 style ``d2t`` buffer in the weights:
            draft index i is target token ``i + d2t[i]``, scored by the drafter's own ``lm_head.weight``, the
            target's rows for those tokens), which cuts the drafter's LM head; None (the z-lab layout): the whole
            vocabulary.
        target_name_or_path (`str`, *optional*):
            Hub id of the target the drafter was trained for (read by the acceptance checks and the model card).
            None (published z-lab and AngelSlim configs have no such key): not recorded, and left out of
            config.json rather than written as null.

    Example:
        >>> from hf_dflash import DFlashConfig
        >>> config = DFlashConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        ...                       intermediate_size=128, num_hidden_layers=1, vocab_size=100,
        ...                       target_layer_ids=[1, 2], mask_token_id=99, num_target_layers=4)
        >>> config.to_dict()["dflash_config"]
        {'mask_token_id': 99, 'target_layer_ids': [1, 2], 'block_size': 16, 'num_target_layers': 4}
    """

    # The interchange format is a Qwen3 config; engines parse it as such.
    model_type = "qwen3"

    def __init__(
        self,
        block_size: int = 16,
        target_layer_ids: list[int] | None = None,
        mask_token_id: int | None = None,
        num_target_layers: int | None = None,
        layer_fusion: bool | None = None,
        split_context_kv: bool | None = None,
        draft_vocab_size: int | None = None,
        target_name_or_path: str | None = None,
        dflash_config: dict | None = None,
        **kwargs,
    ):
        nested = dict(dflash_config or {})
        # Newer layouts nest these fields; the nested value wins over a stale top-level one.
        block_size = nested.pop("block_size", block_size)
        num_target_layers = nested.pop("num_target_layers", num_target_layers)
        target_layer_ids = nested.pop("target_layer_ids", target_layer_ids)
        mask_token_id = nested.pop("mask_token_id", mask_token_id)
        # vLLM's keys for windowed drafter layers (kept in the nested dict for the round trip): the window, and
        # use_swa = every layer windowed
        if kwargs.get("sliding_window") is None and nested.get("swa_window_size") is not None:
            kwargs["sliding_window"] = nested["swa_window_size"]
        if nested.get("use_swa") and kwargs.get("layer_types") is None and kwargs.get("num_hidden_layers"):
            kwargs["layer_types"] = ["sliding_attention"] * kwargs["num_hidden_layers"]
        architectures = kwargs.get("architectures") or [DFLASH_ARCHITECTURE]
        if DFLASH2_ARCHITECTURE not in architectures:  # DFlash2Config checks its own fields
            check_variant_layout({**kwargs, "architectures": architectures, "dflash_config": nested})
        is_dflare = DFLARE_ARCHITECTURE in architectures
        self.block_size = int(block_size)
        self.target_layer_ids = list(target_layer_ids) if target_layer_ids is not None else None
        self.mask_token_id = mask_token_id
        self.num_target_layers = num_target_layers
        self.layer_fusion = is_dflare if layer_fusion is None else bool(layer_fusion)
        self.split_context_kv = is_dflare if split_context_kv is None else bool(split_context_kv)
        self.draft_vocab_size = int(draft_vocab_size) if draft_vocab_size else None
        self.target_name_or_path = target_name_or_path
        self.extra_dflash_config = nested  # unknown nested keys survive a round trip
        kwargs.setdefault("architectures", architectures)
        window = kwargs.get("sliding_window")
        super().__init__(**kwargs)
        if window is not None and "sliding_attention" in (self.layer_types or ()):
            # Newer drafters (Qwen3.5/3.6, gemma-4) mark their windowed layers in `layer_types` alone; Qwen3Config
            # would drop the window unless `use_sliding_window` is set.
            self.sliding_window = window

    @property
    def is_dflare(self) -> bool:
        return self.layer_fusion or self.split_context_kv

    def to_dict(self) -> dict:
        output = super().to_dict()
        extra = output.pop("extra_dflash_config", None) or {}
        nested = {
            **extra,
            "mask_token_id": output.pop("mask_token_id"),
            "target_layer_ids": output.pop("target_layer_ids"),
            # both places: old readers look at the top level, newer ones (and newer checkpoints) in dflash_config
            "block_size": output["block_size"],
        }
        if output.get("num_target_layers") is not None:
            nested["num_target_layers"] = output["num_target_layers"]
        if "sliding_attention" in (output.get("layer_types") or ()):
            # vLLM reads the window from here (its transformers drops a Qwen3 sliding_window without
            # use_sliding_window) and runs windowed layers causally unless told otherwise; ours see the block both
            # ways in every layer (vllm/model_executor/models/qwen3_dflash.py, _resolve_layer_attention)
            nested.update(swa_window_size=output.get("sliding_window"), causal=False)
        output["dflash_config"] = nested
        # Readers built on transformers 4.x (older vLLM/SGLang) look for a top-level rope_theta.
        rope = output.get("rope_parameters") or {}
        if "rope_theta" in rope:
            output.setdefault("rope_theta", rope["rope_theta"])
        output["architectures"] = [DFLARE_ARCHITECTURE if self.is_dflare else DFLASH_ARCHITECTURE]
        # Plain DFlash checkpoints stay byte-compatible with the z-lab layout: variant switches only when set.
        for key in ("layer_fusion", "split_context_kv"):
            if output.get(key) == (DFLARE_ARCHITECTURE in output["architectures"]):
                output.pop(key)
        for key in ("draft_vocab_size", "target_name_or_path"):  # unset: absent, as in the published layouts
            if output.get(key) is None:
                output.pop(key, None)
        return output


def validate_architecture(config_dict: dict) -> list[str]:
    """The architectures `config_dict` names; a ValueError for configs that are not DFlash/DFlare/DFlash2 drafters, or
    that mix their layouts."""
    architectures = config_dict.get("architectures") or []
    unknown = [a for a in architectures if a not in SUPPORTED_ARCHITECTURES]
    if unknown:
        raise ValueError(
            f"This checkpoint declares architectures={architectures}, but hf-dflash loads only "
            f"{list(SUPPORTED_ARCHITECTURES)}. Use the code published with that checkpoint, or convert it to the "
            "DFlash layout (dflash_config with mask_token_id and target_layer_ids, z-lab state-dict names)."
        )
    nested = config_dict.get("dflash_config") or {}
    if "target_layer_ids" not in nested and "target_layer_ids" not in config_dict:
        raise ValueError(
            "This config has no dflash_config.target_layer_ids, so it is not a DFlash drafter. "
            "Create one with DFlashDraftModel.from_target(target) or load a DFlash checkpoint."
        )
    check_variant_layout(config_dict)
    return architectures


def check_variant_layout(config_dict: dict) -> None:
    """Raise a ValueError naming the field and the fix when a config mixes the DFlash/DFlare and DFlash2 layouts.

    DFlash2 (``architectures: ["DFlash2DraftModel"]``) keeps its fields inside ``dflash_config``; a DFlash or DFlare
    config has none of them, and a DFlash2 config has no DFlare switch and no draft vocabulary.

    Example:
        >>> check_variant_layout({"architectures": ["DFlashDraftModel"], "dflash_config": {"selector_top_k": 8}})
        Traceback (most recent call last):
        ...
        ValueError: dflash_config.selector_top_k is a DFlash2 field, but architectures=['DFlashDraftModel']: ...
    """
    architectures = list(config_dict.get("architectures") or [DFLASH_ARCHITECTURE])
    nested = config_dict.get("dflash_config") or {}
    is_dflash2 = DFLASH2_ARCHITECTURE in architectures
    if is_dflash2 and len(set(architectures)) > 1:
        raise ValueError(f"architectures={architectures} names DFlash2 and another drafter layout: keep one, "
                         f"['{DFLASH2_ARCHITECTURE}'] for a checkpoint with conv and candidate_selector weights.")
    stray = [k for k in DFLASH2_FIELDS if config_dict.get(k) is not None]
    if stray:
        raise ValueError(f"{stray[0]} is a DFlash2 field at the top level of config.json; DFlash2 (vLLM, z-lab) reads "
                         f"it from dflash_config: move it to dflash_config.{stray[0]}.")
    if not is_dflash2:
        found = [k for k in DFLASH2_FIELDS if k in nested]
        if found:
            raise ValueError(
                f"dflash_config.{found[0]} is a DFlash2 field, but architectures={architectures}: set architectures "
                f"to ['{DFLASH2_ARCHITECTURE}'] (a DFlash2 checkpoint, with conv and candidate_selector weights), or "
                f"remove dflash_config.{found[0]} (a DFlash/DFlare checkpoint)."
            )
        return
    missing = [k for k in DFLASH2_REQUIRED if nested.get(k) is None]
    if missing:
        raise ValueError(f"architectures=['{DFLASH2_ARCHITECTURE}'] needs dflash_config.{missing[0]} (DFlash2 fields "
                         f"{list(DFLASH2_REQUIRED)}); add it, or load the checkpoint as DFlash with architectures="
                         f"['{DFLASH_ARCHITECTURE}'] if it has no conv or candidate_selector weights.")
    for switch in ("layer_fusion", "split_context_kv"):
        if config_dict.get(switch):
            raise ValueError(f"{switch}=true is a DFlare switch, which DFlash2 drafters do not have: remove {switch} "
                             f"from config.json, or use architectures=['{DFLARE_ARCHITECTURE}'] without DFlash2 fields.")
    if config_dict.get("draft_vocab_size"):
        raise ValueError("draft_vocab_size with a DFlash2 drafter: its candidate selector scores the whole vocabulary "
                         "(codebooks of vocab_size rows). Remove draft_vocab_size (and the d2t weight).")


# When hf_dflash is installed, a remote-code copy of this module hands back the installed class, so that
# AutoModel.from_pretrained(..., trust_remote_code=True) and the installed package agree on one class.
if not __name__.startswith("hf_dflash."):
    try:
        from hf_dflash.configuration_dflash import DFlashConfig  # noqa: F401, F811
    except ImportError:
        pass


# RoPE types the drafter's rotary embedding (and the readers of the z-lab layout) take from a target as they are.
PORTABLE_ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "llama3", "longrope")


def drafter_rope_parameters(text_config) -> dict:
    """The target's RoPE for the drafter: per-layer-type parameters (Gemma 3/4, gpt-oss style
    ``{"full_attention": {...}, "sliding_attention": {...}}``) give the full-attention entry, since drafter layers
    read the whole context; a RoPE type of one architecture only (e.g. Gemma 4's "proportional") keeps its theta
    with the default rotation."""
    rope = dict(getattr(text_config, "rope_parameters", None) or {"rope_type": "default", "rope_theta": 10000.0})
    if "rope_type" not in rope and rope and all(isinstance(v, dict) for v in rope.values()):
        rope = dict(rope.get("full_attention") or next(iter(rope.values())))
    if rope.get("rope_type", "default") not in PORTABLE_ROPE_TYPES:
        rope = {"rope_type": "default", "rope_theta": rope.get("rope_theta", 10000.0)}
    return rope


def target_attribute(text_config, name: str):
    """A config attribute that some architectures define per layer (Gemma 4: `head_dim` of sliding vs full layers):
    the global value, else the first layer's."""
    try:
        return getattr(text_config, name, None)
    except Exception:  # transformers' AmbiguousGlobalPerLayerAttributeError
        return getattr(text_config.per_layer_config[0], name, None)
