# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""DFlash / DFlare block-diffusion drafter.

Part of the remote-code payload: imports only torch, transformers and sibling modules (`from .x import y`), so a
saved drafter loads with ``AutoModel.from_pretrained(folder, trust_remote_code=True)`` where hf_dflash is absent.

The drafter owns no embeddings and no LM head: it reads the target's. One forward turns
``[anchor, MASK, ..., MASK]`` (the block) into ``block_size`` hidden states, attending to keys/values projected from
the target's hidden states at ``target_layer_ids`` ("KV injection") and to the block itself, bidirectionally.
"""

from collections.abc import Callable

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.modeling_outputs import BaseModelOutputWithPast
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.qwen3.modeling_qwen3 import (
    Qwen3MLP,
    Qwen3RMSNorm,
    Qwen3RotaryEmbedding,
    eager_attention_forward,
    rotate_half,
)
from transformers.utils import logging

from .cache_dflash import cache_argument
from .checkpoint_dflash import hub_id_of
from .checks_dflash import check_drafter_matches_target
from .configuration_dflash import (
    DFlashConfig,
    target_attribute,
    default_target_layer_ids,
    drafter_rope_parameters,
)
# Imported for its effect: loading the drafter (remote code included) routes generate(assistant_model=drafter) to the
# DFlash loop (tests/test_checkpoint.py runs a saved drafter where hf_dflash is not importable)
from .features_dflash import fuse_states, target_features  # noqa: F401
from .generation_dflash import enable_dflash_generation  # noqa: F401
from .hub_dflash import DFlashHubMixin
from .vocabulary_dflash import DraftVocabularyMixin, frozen_head


logger = logging.get_logger(__name__)
# Whether hf-dflash loads targets and drafters with transformers' hub kernels. transformers 5.25 turns them on for
# every `from_pretrained` (5.23 and 5.24 leave them off): on a GPU they swap RMSNorm/RoPE for kernels downloaded from
# the Hub, which changes the numerics a drafter's output is checked against, and offline the load fails (the kernels'
# publisher trust check needs the network). So they stay off unless the caller passes `use_kernels=True`.
HUB_KERNELS = False


def without_hub_kernels(kwargs: dict) -> dict:
    """``from_pretrained`` keyword arguments with ``use_kernels=HUB_KERNELS`` added, unless they set ``use_kernels``
    themselves (every transformers hf-dflash supports accepts it).

    Example:
        >>> without_hub_kernels({"dtype": "auto"}), without_hub_kernels({"use_kernels": True})
        ({'use_kernels': False, 'dtype': 'auto'}, {'use_kernels': True})
    """
    return {"use_kernels": HUB_KERNELS, **kwargs}


# The output's cache field: `cache` from transformers 5.24 on, where `past_key_values=` logs a deprecation.
_OUTPUT_CACHE_FIELD = cache_argument(BaseModelOutputWithPast)


class DFlashAttention(nn.Module):
    """Attention whose keys/values are [context tokens, block tokens] and whose queries are the block tokens."""

    def __init__(self, config: DFlashConfig, layer_idx: int):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.num_key_value_groups = config.num_attention_heads // config.num_key_value_heads
        self.scaling = self.head_dim**-0.5
        self.attention_dropout = config.attention_dropout
        self.is_causal = False  # the block sees itself both ways; context is all in the past
        q_out, kv_out = config.num_attention_heads * self.head_dim, config.num_key_value_heads * self.head_dim
        self.q_proj = nn.Linear(config.hidden_size, q_out, bias=config.attention_bias)
        self.k_proj = nn.Linear(config.hidden_size, kv_out, bias=config.attention_bias)
        self.v_proj = nn.Linear(config.hidden_size, kv_out, bias=config.attention_bias)
        self.o_proj = nn.Linear(q_out, config.hidden_size, bias=config.attention_bias)
        self.q_norm = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.k_norm = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        if config.split_context_kv:  # DFlare: context tokens get their own K/V projections
            self.k_proj_target = nn.Linear(config.hidden_size, kv_out, bias=config.attention_bias)
            self.v_proj_target = nn.Linear(config.hidden_size, kv_out, bias=config.attention_bias)

    def forward(
        self,
        hidden_states: torch.Tensor,
        context: torch.Tensor | None,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask=None,
        past_key_values=None,
        **kwargs,
    ) -> torch.Tensor:
        batch, q_len = hidden_states.shape[:2]
        query = self.q_norm(self.q_proj(hidden_states).view(batch, q_len, -1, self.head_dim)).transpose(1, 2)
        key, value = self.k_proj(hidden_states), self.v_proj(hidden_states)
        if context is not None and context.shape[1] > 0:
            k_proj = self.k_proj_target if self.config.split_context_kv else self.k_proj
            v_proj = self.v_proj_target if self.config.split_context_kv else self.v_proj
            key = torch.cat([k_proj(context), key], dim=1)
            value = torch.cat([v_proj(context), value], dim=1)
        kv_len = key.shape[1]
        key = self.k_norm(key.view(batch, kv_len, -1, self.head_dim)).transpose(1, 2)
        value = value.view(batch, kv_len, -1, self.head_dim).transpose(1, 2)

        # cos/sin cover [new context positions, block positions]; queries take the block's (last q_len) part.
        cos, sin = (t.unsqueeze(1) for t in position_embeddings)
        query = query * cos[..., -q_len:, :] + rotate_half(query) * sin[..., -q_len:, :]
        key = key * cos + rotate_half(key) * sin

        if past_key_values is not None:
            key, value = past_key_values.update(key, value, self.layer_idx)

        attention_interface: Callable = ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, eager_attention_forward
        )
        attn_output, _ = attention_interface(
            self,
            query,
            key,
            value,
            attention_mask,
            dropout=0.0 if not self.training else self.attention_dropout,
            scaling=self.scaling,
            **kwargs,
        )
        return self.o_proj(attn_output.reshape(batch, q_len, -1).contiguous())


class DFlashDecoderLayer(nn.Module):
    """Pre-norm Qwen3 layer whose attention also reads the injected context."""

    def __init__(self, config: DFlashConfig, layer_idx: int):
        super().__init__()
        self.self_attn = DFlashAttention(config, layer_idx)
        self.mlp = Qwen3MLP(config)
        self.input_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, hidden_states, context, position_embeddings, attention_mask=None, past_key_values=None, **kwargs):
        hidden_states = hidden_states + self.self_attn(
            self.input_layernorm(hidden_states), context, position_embeddings, attention_mask, past_key_values, **kwargs
        )
        return hidden_states + self.mlp(self.post_attention_layernorm(hidden_states))


class DFlashPreTrainedModel(PreTrainedModel):
    config_class = DFlashConfig
    config: DFlashConfig
    base_model_prefix = "model"
    main_input_name = "noise_embeds"
    _hf_dflash_drafter = True  # duck-typed marker read by the generation routing
    supports_gradient_checkpointing = True
    _no_split_modules = ["DFlashDecoderLayer"]
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flex_attn = True
    _supports_attention_backend = True
    # Checkpoints with a draft vocabulary saved before the draft head was have no lm_head.weight (from_pretrained
    # then drops the head: the target's rows are gathered at generate time)
    _keys_to_ignore_on_load_missing = [r"^lm_head\.weight$"]

    def _init_weights(self, module):
        super()._init_weights(module)
        if isinstance(module, DFlashDraftModel) and module.layer_fusion_weights is not None:
            init.copy_(module.layer_fusion_weights, initial_fusion_weights(*module.layer_fusion_weights.shape))


def initial_fusion_weights(num_layers: int, num_features: int) -> torch.Tensor:
    """DFlare init: drafter layer d starts focused (logit 2.0) on feature floor(d / L * T), zeros elsewhere."""
    weights = torch.zeros(num_layers, num_features)
    for d in range(num_layers):
        weights[d, (d * num_features) // num_layers] = 2.0
    return weights


class DFlashDraftModel(DFlashHubMixin, DraftVocabularyMixin, DFlashPreTrainedModel):
    """
    Block-diffusion drafter (DFlash; DFlare when `config.layer_fusion` / `config.split_context_kv` are set).

    Weights use the z-lab names (`fc`, `hidden_norm`, `norm`, `layers.{i}.*`) that vLLM and SGLang read.

    Example:
        >>> import hf_dflash, torch
        >>> from transformers import AutoModelForCausalLM
        >>> target = AutoModelForCausalLM.from_pretrained("HuggingFaceTB/SmolLM2-135M-Instruct")  # doctest: +SKIP
        >>> drafter = hf_dflash.DFlashDraftModel.from_target(target, num_hidden_layers=2, block_size=16)  # doctest: +SKIP
        >>> out = target.generate(input_ids, assistant_model=drafter, max_new_tokens=64)  # doctest: +SKIP
        >>> drafter.last_stats.mean_acceptance_length  # doctest: +SKIP
    """

    decoder_layer_cls = DFlashDecoderLayer  # a variant's layers (DFlash2: convolutions around attention and MLP)

    def __init__(self, config: DFlashConfig):
        super().__init__(config)
        if config.target_layer_ids is None:
            raise ValueError("DFlashConfig.target_layer_ids is required; use DFlashDraftModel.from_target(target).")
        num_features = len(config.target_layer_ids)
        if config.layer_fusion:
            self.fc = None
            self.layer_fusion_weights = nn.Parameter(initial_fusion_weights(config.num_hidden_layers, num_features))
        else:
            self.fc = nn.Linear(num_features * config.hidden_size, config.hidden_size, bias=False)
            self.layer_fusion_weights = None
        self.hidden_norm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.layers = nn.ModuleList([self.decoder_layer_cls(config, i) for i in range(config.num_hidden_layers)])
        self.norm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = Qwen3RotaryEmbedding(config=config)
        # A draft vocabulary in EAGLE-3's layout, the one vLLM reads: draft index i is target token i + d2t[i], scored
        # by the drafter's own `lm_head` (the target's rows for those tokens; see set_draft_vocabulary)
        self.lm_head = None
        if config.draft_vocab_size:
            self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long))
            self.lm_head = frozen_head(config.hidden_size, config.draft_vocab_size)
        self.gradient_checkpointing = False
        self.last_stats = None  # filled by every generate() call that uses this drafter
        self.post_init()

    # ----------------------------------------------------------------------------------------------------------------
    # forward
    def target_features(self, hidden_states) -> torch.Tensor:
        """This drafter's context from a target forward's `hidden_states` (see :func:`target_features`)."""
        return target_features(hidden_states, self.config.target_layer_ids)

    def fused_features(self, hidden_states, slots=None) -> torch.Tensor:
        """The context the decoding loop keeps per token from a target forward's `hidden_states` (at `slots`; None:
        all): :meth:`fuse` of :meth:`selected_states`. The forward reads it with ``context_fused=True``."""
        return self.fuse(self.selected_states(hidden_states, slots))

    def selected_states(self, hidden_states, slots=None) -> list[torch.Tensor]:
        """This drafter's layers of a target forward's `hidden_states` (at `slots`; None: all), one [b, n, H] each."""
        return [hidden_states[i + 1] if slots is None else hidden_states[i + 1][:, slots]
                for i in self.config.target_layer_ids]

    def fuse(self, states: list[torch.Tensor]) -> torch.Tensor:
        """The context of :meth:`selected_states` `states` (see :func:`~features_dflash.fuse_states`)."""
        return fuse_states(states, self.config.target_layer_ids, self.fc)

    def project_context(self, context_hidden_states: torch.Tensor | None, fused: bool = False):
        """Per drafter layer, the context it attends to: `hidden_norm(fc(features))` (DFlash, shared by all layers;
        `fused`: `fc` already applied, :meth:`fused_features`) or `hidden_norm(softmax(w_d) . features)` (DFlare
        layer fusion, one per layer)."""
        num_layers = len(self.layers)
        if context_hidden_states is None or context_hidden_states.shape[1] == 0:
            return [None] * num_layers
        if self.fc is not None:
            return [self.hidden_norm(context_hidden_states if fused else self.fc(context_hidden_states))] * num_layers
        batch, length, _ = context_hidden_states.shape
        features = context_hidden_states.view(batch, length, len(self.config.target_layer_ids), -1)
        mix = self.layer_fusion_weights.softmax(dim=-1).to(features.dtype)  # [L, T]
        mixed = torch.einsum("bstd,lt->lbsd", features, mix)
        return [self.hidden_norm(mixed[d]) for d in range(num_layers)]

    def forward(
        self,
        noise_embeds: torch.Tensor,
        context_hidden_states: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        attention_mask=None,
        past_key_values=None,
        use_cache: bool | None = None,
        cache=None,
        context_fused: bool = False,
        **kwargs,
    ) -> BaseModelOutputWithPast:
        r"""
        Args:
            noise_embeds (`torch.Tensor` of shape `[batch, q_len, hidden]`):
                Target embeddings of the block `[anchor, MASK, ...]` (or of many blocks at once in training).
            context_hidden_states (`torch.Tensor` of shape `[batch, n_ctx, T * hidden]`, *optional*):
                Target hidden states at `target_layer_ids` for the newly committed positions, concatenated.
            position_ids (`torch.LongTensor` of shape `[batch, n_ctx + q_len]`, *optional*):
                Absolute positions of the context tokens, then of the block tokens. Defaults to consecutive
                positions after what `past_key_values` holds.
            attention_mask (*optional*):
                None (block sees everything: inference), a 2D padding mask over `[cached + n_ctx + q_len]` keys, or
                a ready 4D boolean mask / flex-attention `BlockMask` (training: block-causal masks), or a dict of
                those by layer type (`"full_attention"`, `"sliding_attention"`). From None or a 2D mask, the
                `sliding_attention` layers get a window mask over the keys' positions (real keys counted in order).
            past_key_values (`Cache`, *optional*):
                Cache of context K/V; the block's K/V are appended too, and the caller crops them afterwards.
            cache (`Cache`, *optional*):
                The same, under the name transformers uses from 5.24 on (its built-in DFlash generator passes it).
            context_fused (`bool`, *optional*, defaults to `False`):
                Whether `context_hidden_states` come from :meth:`fused_features` (what the decoding loop passes).
        Returns:
            `BaseModelOutputWithPast` with `last_hidden_state` `[batch, q_len, hidden]` (before the target LM head).
        """
        past_key_values = cache if cache is not None else past_key_values
        batch, q_len = noise_embeds.shape[:2]
        n_ctx = 0 if context_hidden_states is None else context_hidden_states.shape[1]
        past_len = past_key_values.get_seq_length() if past_key_values is not None else 0
        if position_ids is None:
            position_ids = torch.arange(past_len, past_len + n_ctx + q_len, device=noise_embeds.device)[None]
        # the target's embeddings and features, in the target's dtype, are read in the drafter's (bf16 next to fp32)
        noise_embeds = noise_embeds.to(self.norm.weight.dtype)
        if context_hidden_states is not None:
            context_hidden_states = context_hidden_states.to(noise_embeds.dtype)
        contexts = self.project_context(context_hidden_states, fused=context_fused)
        position_embeddings = self.rotary_emb(noise_embeds, position_ids)
        masks = self.layer_masks(attention_mask, batch, q_len, past_len + n_ctx + q_len, noise_embeds.device)

        hidden_states = noise_embeds
        for layer, context, mask in zip(self.layers, contexts, masks):
            if self.gradient_checkpointing and self.training:
                hidden_states = self._gradient_checkpointing_func(
                    layer.__call__, hidden_states, context, position_embeddings, mask, None
                )
            else:
                hidden_states = layer(hidden_states, context, position_embeddings, mask, past_key_values, **kwargs)
        return BaseModelOutputWithPast(
            last_hidden_state=self.norm(hidden_states), **{_OUTPUT_CACHE_FIELD: past_key_values}
        )

    def layer_masks(self, attention_mask, batch: int, q_len: int, kv_len: int, device) -> list:
        """The attention mask of each layer: its layer type's entry of a dict, else the padding mask (None: no
        mask) for full-attention layers and the window mask for sliding-attention layers."""
        layer_types = self.config.layer_types or ["full_attention"] * len(self.layers)
        if isinstance(attention_mask, dict):
            return [attention_mask[kind] for kind in layer_types]
        full = expand_padding_mask(attention_mask, q_len)
        if "sliding_attention" not in layer_types:
            return [full] * len(self.layers)
        if attention_mask is not None and not (isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 2):
            raise ValueError("A drafter with sliding_attention layers takes a 2D padding mask or a dict of masks by "
                             f"layer type; got {type(attention_mask).__name__}.")
        window = sliding_window_mask(attention_mask, batch, q_len, kv_len, self.config.sliding_window, device)
        return [window if kind == "sliding_attention" else full for kind in layer_types]

    # ----------------------------------------------------------------------------------------------------------------
    # construction (loading and saving: DFlashHubMixin, hub_dflash.py)
    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, **kwargs) -> "DFlashDraftModel":
        """Load a drafter of any layout (see :meth:`DFlashHubMixin.from_pretrained`), without hub kernels unless
        ``use_kernels`` is given (see ``HUB_KERNELS``): on a GPU box without network ``device_map="cuda"`` loads too.

        Example:
            >>> repo = "z-lab/Qwen3-8B-DFlash-b16"
            >>> drafter = DFlashDraftModel.from_pretrained(repo, device_map="cuda")  # doctest: +SKIP
        """
        return super().from_pretrained(pretrained_model_name_or_path, *model_args, **without_hub_kernels(kwargs))

    @classmethod
    def from_target(
        cls,
        target: PreTrainedModel,
        num_hidden_layers: int = 1,
        block_size: int = 16,
        target_layer_ids: list[int] | None = None,
        mask_token_id: int | None = None,
        target_hub_id: str | None = None,
        **config_overrides,
    ) -> "DFlashDraftModel":
        """A freshly initialised drafter sized for `target`.

        Copies hidden size, heads, head dim, MLP width, RoPE, vocab and bos/eos/pad ids from the target. Layer ids
        default to the z-lab rule (one feature per drafter layer). Without `mask_token_id`, the last row of the
        target's embedding table is used (Qwen3 and many others pad their table, so it is an untrained row) and
        recorded in the config. The config names the target by `target_hub_id`, else by the Hub id it was loaded
        from (never by a local folder: see :func:`hub_id_of`).

        Example:
            >>> drafter = DFlashDraftModel.from_target(target, num_hidden_layers=2, block_size=8)  # doctest: +SKIP
            >>> drafter = DFlashDraftModel.from_target(local_target, target_hub_id="Qwen/Qwen3-8B")  # doctest: +SKIP
        """
        text = target.config.get_text_config()
        num_target_layers = text.num_hidden_layers
        if block_size < 2:
            raise ValueError(f"block_size={block_size} drafts nothing; use block_size >= 2 (16 is the default).")
        if target_layer_ids is None:
            target_layer_ids = default_target_layer_ids(num_target_layers, num_hidden_layers)
        embedding_rows = target.get_input_embeddings().weight.shape[0]
        if mask_token_id is None:
            mask_token_id = embedding_rows - 1
            logger.info(f"Using token id {mask_token_id} (last embedding row) as the DFlash mask token.")
        heads = target_attribute(text, "num_attention_heads")
        fields = dict(
            hidden_size=text.hidden_size,
            intermediate_size=target_attribute(text, "intermediate_size"),
            num_attention_heads=heads,
            num_key_value_heads=target_attribute(text, "num_key_value_heads") or heads,
            head_dim=target_attribute(text, "head_dim") or text.hidden_size // heads,
            hidden_act=getattr(text, "hidden_act", None) or getattr(text, "hidden_activation", None) or "silu",
            rms_norm_eps=getattr(text, "rms_norm_eps", None) or 1e-6,
            rope_parameters=drafter_rope_parameters(text),
            max_position_embeddings=text.max_position_embeddings,
            vocab_size=text.vocab_size,
            bos_token_id=text.bos_token_id,
            eos_token_id=text.eos_token_id,
            pad_token_id=text.pad_token_id,
            tie_word_embeddings=False,
            num_hidden_layers=num_hidden_layers,
            block_size=block_size,
            target_layer_ids=list(target_layer_ids),
            mask_token_id=int(mask_token_id),
            num_target_layers=num_target_layers,
            dtype=str(target.dtype).removeprefix("torch."),
            target_name_or_path=target_hub_id or hub_id_of(getattr(target, "name_or_path", None)),
        )
        fields.update(config_overrides)
        config = cls.config_class(**fields)
        drafter = cls(config).to(device=target.device, dtype=target.dtype)
        check_drafter_matches_target(target, drafter)
        return drafter


def sliding_window_mask(padding_mask, batch: int, q_len: int, kv_len: int, window: int, device) -> torch.Tensor:
    """Boolean [b, 1, q_len, kv_len]: real keys whose position is within `window` of the query's (q - k < window).

    Positions count the real keys in order (the queries are the last `q_len` keys), so left padding and masked
    slots do not take window places.

    Example:
        >>> sliding_window_mask(None, 1, q_len=2, kv_len=5, window=3, device="cpu").int()[0, 0]
        tensor([[0, 1, 1, 1, 1],
                [0, 0, 1, 1, 1]], dtype=torch.int32)
    """
    if window is None:
        raise ValueError("The drafter config has sliding_attention layers but no sliding_window: set sliding_window.")
    real = torch.ones(batch, kv_len, dtype=torch.bool, device=device) if padding_mask is None else padding_mask.bool()
    positions = real.long().cumsum(-1) - 1
    near = positions[:, None, :] > positions[:, -q_len:, None] - window
    return (near & real[:, None, :])[:, None]


def expand_padding_mask(attention_mask, q_len: int):
    """None stays None; a 2D key-padding mask [b, kv] becomes a boolean [b, 1, q_len, kv]; 4D masks pass through."""
    if attention_mask is None or not isinstance(attention_mask, torch.Tensor) or attention_mask.dim() != 2:
        return attention_mask
    if bool(attention_mask.all()):
        return None
    return attention_mask.bool()[:, None, None, :].expand(-1, 1, q_len, -1)


DFlashDraftModel.register_for_auto_class("AutoModel")
DFlashConfig.register_for_auto_class("AutoConfig")

# When hf_dflash is installed, a remote-code copy of this module hands back the installed class (see config module).
if not __name__.startswith("hf_dflash."):
    try:
        from hf_dflash.modeling_dflash import DFlashDraftModel  # noqa: F401, F811
    except ImportError:
        pass
