# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""DFlash2 block-diffusion drafter (z-lab + Inco AI, 2026-08): DFlash plus dynamic convolutions along the block and a
candidate selector that chooses the drafted path.

Part of the remote-code payload: imports only torch, transformers and sibling modules (`from .x import y`).

What it computes, as vLLM 0.32 serves it (``vllm/model_executor/models/qwen3_dflash2.py`` on top of ``qwen3_dflash.py``,
``vllm/v1/worker/gpu/spec_decode/dflash2/speculator.py``, ``model_executor/layers/logits_processor.py``); B is the
block (anchor + B - 1 masks), H the hidden size, V the vocabulary, G = H / conv_group_size groups, T =
conv_kernel_size taps, K = selector_top_k, R = selector_rank:

- **Grouped dynamic depthwise convolution** (`attention_conv`, `mlp_conv`, one of each per layer): for block row p
  (position p within its block, 0 = anchor) and channel c of group g(c) = c // conv_group_size,
  ``conv_s(x)[p, c] = sum_{t < T, t <= p} (base_kernel[s, t, c] + delta_s[p, t, g(c)]) * x[p - t, c]``, causal
  within the block (rows of other blocks never mix in). The per-row, per-group kernel delta is predicted from the
  layer's normed input u: ``kernel_projection(u[p])`` reshaped ``[2, T, G]`` gives delta_0 and delta_1. Side 0
  convolves the input of the sublayer, side 1 its output, both with kernels predicted from that same u::

      u = input_layernorm(h);           h = h + conv_1(self_attn(conv_0(u)))      # attention_conv, deltas from u
      v = post_attention_layernorm(h);  h = h + conv_1(mlp(conv_0(v)))            # mlp_conv, deltas from v

  Only the block rows are convolved; the context K/V (target features through `fc` and `hidden_norm`) are as in
  DFlash. vLLM sizes the block as 1 + num_speculative_tokens, so it matches this drafter (which always fills its
  whole block) when served with ``num_speculative_tokens = block_size - 1``.
- **Block input**: the embeddings of ``[anchor, MASK x (B-1)]`` times ``input_embedding_scale`` (default 1).
- **Candidates**: block rows 1..B-1 (draft positions d = 1..B-1) go through the LM head; the candidates at d are
  the top K tokens of those raw logits, and their unary scores are ``a = cap * tanh(m * z / cap)`` (z the raw logit,
  m = ``output_multiplier``, cap = ``final_logit_softcapping``; no tanh when the cap is 0/None). vLLM applies the
  multiplier and the cap to the K selected values only (`get_top_k_tokens`): both are monotonic (m > 0), so the
  selection is the same as over the whole vocabulary.
- **Candidate selector** (`candidate_selector`): with ``r_d = hidden_projection(hidden[d])`` (R numbers from the
  drafter's final normed hidden state at draft position d), the score of moving from predecessor candidate i to
  candidate j at position d is
  ``S[d, i, j] = a[d, j] + sum_r predecessor_codebook[prev(d, i), r] * r_d[r] * successor_codebook[cand(d, j), r]``,
  where ``prev(1, i)`` is the anchor token for every i and ``prev(d, i) = cand(d - 1, i)`` after that.
- **The walk** (how the selector's path becomes the drafts): i_0 = 0; at d = 1..B-1 the draft is candidate
  ``i_d`` chosen from the row ``S[d, i_{d-1}, :]``: its argmax (greedy), or a sample of ``softmax(S[d, i_{d-1}, :] /
  temperature)`` (Gumbel-max; vLLM keeps the realized row, -inf off the K candidates, as the draft logits of that
  position, and its rejection sampler divides them by the temperature: q_d = softmax(S[d, i_{d-1}, :] / T) over the
  K candidates, 0 elsewhere). hf-dflash's walk is in ``candidates_dflash.py`` (:func:`selector_walk`); it passes the
  row through the call's logits processors (temperature and the other warpers) before choosing (README, "DFlash2").

Checkpoint keys (z-lab / vLLM names; vLLM prefixes all but ``lm_head*`` with ``model.`` and fuses q/k/v and
gate/up): the DFlash ones (``fc.weight [H, n*H]``, ``hidden_norm.weight``, ``norm.weight``, ``layers.{i}.self_attn.
{q,k,v,o}_proj.weight``, ``.{q,k}_norm.weight``, ``layers.{i}.mlp.{gate,up,down}_proj.weight``,
``layers.{i}.{input,post_attention}_layernorm.weight``) plus ``layers.{i}.{attention_conv,mlp_conv}.base_kernel
[2, T, H]``, ``layers.{i}.{attention_conv,mlp_conv}.kernel_projection.weight [2*T*G, H]``,
``candidate_selector.predecessor_codebook [V, R]``, ``candidate_selector.successor_codebook [V, R]``,
``candidate_selector.hidden_projection.weight [R, H]``; optionally ``embed_tokens.weight [V, H]`` and
``lm_head.weight [V, H]`` (the incoai checkpoint ships neither: the target's are shared; vLLM keeps a drafter's
own copy when it differs from the target's, and so does hf-dflash, which always uses a shipped copy).
"""

import torch
import torch.nn.functional as F
from torch import nn
from transformers import initialization as init
from transformers.utils import logging

from .checkpoint_dflash import saved_weight_names
from .configuration_dflash import DFLASH2_ARCHITECTURE
from .configuration_dflash2 import OWNED_WEIGHTS, DFlash2Config
from .hub_dflash import VARIANTS
from .modeling_dflash import DFlashDecoderLayer, DFlashDraftModel


logger = logging.get_logger(__name__)


class DFlash2GroupedConv(nn.Module):
    """The grouped dynamic depthwise convolution along the block (module docstring): `base_kernel` [2, T, H] plus a
    per-row, per-group delta predicted by `kernel_projection` (H -> 2 * T * G)."""

    def __init__(self, hidden_size: int, taps: int, group_size: int, block_size: int):
        super().__init__()
        self.taps, self.group_size, self.block_size = taps, group_size, block_size
        self.num_groups = hidden_size // group_size
        self.base_kernel = nn.Parameter(torch.zeros(2, taps, hidden_size))
        self.kernel_projection = nn.Linear(hidden_size, 2 * taps * self.num_groups, bias=False)

    def deltas(self, normed: torch.Tensor) -> torch.Tensor:
        """[b, q, H] normed layer input -> [b, q, 2, T, G] kernel deltas (side, tap, group)."""
        return self.kernel_projection(normed).unflatten(-1, (2, self.taps, self.num_groups))

    def forward(self, x: torch.Tensor, deltas: torch.Tensor, side: int) -> torch.Tensor:
        """``out[p] = sum_t (base[side, t] + delta[p, side, t]) * x[p - t]`` over taps within p's block.

        Example (one channel, 2 taps, base [1, 0.5], no delta: each row adds half of the row before it in its block):
            >>> conv = DFlash2GroupedConv(hidden_size=1, taps=2, group_size=1, block_size=2)
            >>> _ = conv.base_kernel.data.copy_(torch.tensor([[[1.0], [0.5]], [[1.0], [0.0]]]))
            >>> conv(torch.tensor([[[1.0], [2.0], [4.0]]]), torch.zeros(1, 3, 2, 2, 1), side=0)[0, :, 0].tolist()
            [1.0, 2.5, 4.0]
        """
        rows = x.shape[-2]
        groups = x.unflatten(-1, (self.num_groups, self.group_size))  # [b, q, G, gs]
        kernel = self.base_kernel[side].view(self.taps, self.num_groups, self.group_size) + deltas[..., side, :, :, None]
        out = kernel[..., 0, :, :] * groups
        position = torch.arange(rows, device=x.device) % self.block_size
        for tap in range(1, min(self.taps, rows)):
            shifted = F.pad(groups[..., :-tap, :, :], (0, 0, 0, 0, tap, 0))  # row p reads row p - tap
            out = out + kernel[..., tap, :, :] * shifted * (position >= tap).view(-1, 1, 1).to(x.dtype)
        return out.flatten(-2)


class DFlash2DecoderLayer(DFlashDecoderLayer):
    """A DFlash layer whose attention and MLP are each wrapped in a grouped dynamic convolution (module docstring)."""

    def __init__(self, config: DFlash2Config, layer_idx: int):
        super().__init__(config, layer_idx)
        sizes = dict(hidden_size=config.hidden_size, taps=config.conv_kernel_size, group_size=config.conv_group_size,
                     block_size=config.block_size)
        self.attention_conv = DFlash2GroupedConv(**sizes)
        self.mlp_conv = DFlash2GroupedConv(**sizes)

    def forward(self, hidden_states, context, position_embeddings, attention_mask=None, past_key_values=None, **kwargs):
        normed = self.input_layernorm(hidden_states)
        deltas = self.attention_conv.deltas(normed)
        attended = self.self_attn(self.attention_conv(normed, deltas, 0), context, position_embeddings, attention_mask,
                                  past_key_values, **kwargs)
        hidden_states = hidden_states + self.attention_conv(attended, deltas, 1)
        normed = self.post_attention_layernorm(hidden_states)
        deltas = self.mlp_conv.deltas(normed)
        return hidden_states + self.mlp_conv(self.mlp(self.mlp_conv(normed, deltas, 0)), deltas, 1)


class DFlash2CandidateSelector(nn.Module):
    """Low-rank scores of the edges between the top-K candidates of neighbouring draft positions (module docstring)."""

    def __init__(self, hidden_size: int, vocab_size: int, rank: int):
        super().__init__()
        self.predecessor_codebook = nn.Parameter(torch.zeros(vocab_size, rank))
        self.successor_codebook = nn.Parameter(torch.zeros(vocab_size, rank))
        self.hidden_projection = nn.Linear(hidden_size, rank, bias=False)

    def forward(self, candidate_ids: torch.Tensor, unary: torch.Tensor, hidden: torch.Tensor,
                anchor_ids: torch.Tensor) -> torch.Tensor:
        """S [b, k, K, K]: ``S[:, d, i, j]`` scores candidate j at draft position d after candidate i at d - 1 (the
        anchor at the first position), from `candidate_ids` / `unary` [b, k, K], `hidden` [b, k, H] (the drafter's
        final states at those positions) and `anchor_ids` [b]."""
        top_k = candidate_ids.shape[-1]
        previous = torch.cat([anchor_ids.view(-1, 1, 1).expand(-1, 1, top_k), candidate_ids[:, :-1]], dim=1)
        weighted = self.predecessor_codebook[previous] * self.hidden_projection(hidden)[:, :, None, :]
        edges = torch.einsum("bdir,bdjr->bdij", weighted, self.successor_codebook[candidate_ids])
        return unary[:, :, None, :] + edges


def top_candidates(logits: torch.Tensor, top_k: int, multiplier: float = 1.0,
                   cap: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The `top_k` candidates of raw logits [..., V] and their unary scores ``cap * tanh(multiplier * z / cap)`` (no
    tanh without a cap): (ids [..., K], scores [..., K], fp32). The multiplier (> 0) and the cap are monotonic, so the
    top K of the raw logits are the top K of the scores (vLLM's `get_top_k_tokens` applies them to the K values only).

    Example (multiplier 2, cap 4):
        >>> ids, scores = top_candidates(torch.tensor([[0.0, 3.0, 1.0]]), top_k=2, multiplier=2.0, cap=4.0)
        >>> ids.tolist(), [round(s, 4) for s in scores[0].tolist()]
        ([[1, 2]], [3.6206, 1.8485])
    """
    values, ids = logits.topk(top_k, dim=-1)
    values = values.float() * multiplier
    return ids, (torch.tanh(values / cap) * cap if cap else values)


class DFlash2DraftModel(DFlashDraftModel):
    """
    DFlash2 drafter: a DFlash drafter whose layers convolve along the block, plus a candidate selector; its drafts
    are the selector's path through the top-K candidates of each position (see the module docstring and
    ``candidates_dflash.selector_walk``). Loads and saves the published layout (``architectures:
    ["DFlash2DraftModel"]``), with or without its own `embed_tokens` / `lm_head`.

    Example:
        >>> import hf_dflash
        >>> drafter = hf_dflash.DFlashDraftModel.from_pretrained("z-lab/Qwen3.8-27B-DFlash2")  # doctest: +SKIP
        >>> type(drafter).__name__  # doctest: +SKIP
        'DFlash2DraftModel'
        >>> drafter = hf_dflash.DFlash2DraftModel.from_target(target, num_hidden_layers=2, selector_top_k=8)  # doctest: +SKIP
        >>> out = target.generate(input_ids, assistant_model=drafter, max_new_tokens=64)  # doctest: +SKIP
    """

    config_class = DFlash2Config
    config: DFlash2Config
    decoder_layer_cls = DFlash2DecoderLayer
    _no_split_modules = ["DFlash2DecoderLayer"]

    def __init__(self, config: DFlash2Config):
        super().__init__(config)
        self.candidate_selector = DFlash2CandidateSelector(config.hidden_size, config.vocab_size, config.selector_rank)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size) if config.has_own_embed_tokens else None
        if config.has_own_lm_head:
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
            self.lm_head.requires_grad_(False)
        self.post_init()  # again: the modules above came after DFlashDraftModel's

    def _init_weights(self, module):
        super()._init_weights(module)
        # A fresh drafter starts as DFlash: every convolution the identity (tap 0 of the base kernel 1, no delta)
        if isinstance(module, DFlash2GroupedConv):
            init.copy_(module.base_kernel, torch.zeros_like(module.base_kernel).index_fill_(1, torch.tensor([0]), 1.0))
            init.zeros_(module.kernel_projection.weight)
        elif isinstance(module, DFlash2CandidateSelector):
            init.normal_(module.predecessor_codebook, std=self.config.initializer_range)
            init.normal_(module.successor_codebook, std=self.config.initializer_range)

    def forward(self, noise_embeds: torch.Tensor, *args, **kwargs):
        """DFlash's forward (same arguments and output) over the block embeddings times ``input_embedding_scale``."""
        if self.config.input_embedding_scale != 1.0:
            noise_embeds = noise_embeds * self.config.input_embedding_scale
        return super().forward(noise_embeds, *args, **kwargs)

    # ----------------------------------------------------------------------------------------------------------------
    # candidates and the selector (what the candidate generator walks)
    def own_embeddings(self) -> tuple[nn.Module | None, nn.Module | None]:
        """The drafter's own (input embeddings, LM head), each None where the checkpoint shares the target's."""
        return self.embed_tokens, (self.lm_head if self.config.has_own_lm_head else None)

    def candidate_scores(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The top-K candidates of raw LM-head `logits` [b, k, V] and their unary scores: see
        :func:`top_candidates`."""
        config = self.config
        return top_candidates(logits, config.selector_top_k, config.output_multiplier, config.final_logit_softcapping)

    def edge_scores(self, candidate_ids: torch.Tensor, unary: torch.Tensor, hidden: torch.Tensor,
                    anchor_ids: torch.Tensor) -> torch.Tensor:
        """The selector's S [b, k, K, K] (see :class:`DFlash2CandidateSelector`), in fp32, on the selector's device
        (every input is taken there: the drafter may sit on another device than the target that scored them)."""
        codebook = self.candidate_selector.predecessor_codebook
        device = codebook.device
        return self.candidate_selector(candidate_ids.to(device), unary.to(device), hidden.to(device, codebook.dtype),
                                       anchor_ids.to(device)).float()

    # ----------------------------------------------------------------------------------------------------------------
    # loading, draft vocabulary
    def set_draft_vocabulary(self, token_ids, lm_head=None) -> None:
        """DFlash2 drafters draft among the whole vocabulary (their selector's codebooks have a row per token)."""
        if token_ids is not None:
            raise ValueError("A DFlash2 drafter cannot take a draft vocabulary: its candidate selector scores the "
                             "whole vocabulary (codebooks of vocab_size rows). Keep drafter.set_draft_vocabulary(None).")
        super().set_draft_vocabulary(None)

    @classmethod
    def from_target(cls, target, num_hidden_layers: int = 1, block_size: int = 16, **config_overrides):
        """A fresh DFlash2 drafter for `target` (see :meth:`DFlashDraftModel.from_target`); DFlash2 fields default
        to conv_kernel_size 4, conv_group_size 16 (1 where 16 does not divide the hidden size), selector_rank 64,
        selector_top_k 8. Its convolutions start as the identity.

        Example:
            >>> drafter = DFlash2DraftModel.from_target(target, selector_top_k=4, selector_rank=16)  # doctest: +SKIP
        """
        hidden = target.config.get_text_config().hidden_size
        defaults = dict(conv_kernel_size=4, conv_group_size=16 if hidden % 16 == 0 else 1, selector_rank=64,
                        selector_top_k=8)
        return super().from_target(target, num_hidden_layers, block_size, **{**defaults, **config_overrides})

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, **kwargs):
        """Load a DFlash2 checkpoint in the published layout, with or without its own ``embed_tokens.weight`` /
        ``lm_head.weight`` (read from the weight names, as vLLM does; without them the target's are used).

        Example:
            >>> drafter = DFlash2DraftModel.from_pretrained("incoai/Qwen3.8-27B-DFlash2")  # doctest: +SKIP
        """
        names = saved_weight_names(pretrained_model_name_or_path, kwargs, download=True)
        if names is None:
            logger.warning(f"Could not list the weights of {pretrained_model_name_or_path!s} (not safetensors): "
                           "loading it as a DFlash2 drafter that shares the target's embeddings and LM head.")
        owned = {flag: name in (names or ()) for flag, name in OWNED_WEIGHTS.items()}
        config = kwargs.get("config")
        if config is not None:
            for flag, value in owned.items():
                setattr(config, flag, value)
        else:
            kwargs.update(owned)  # transformers sets config attributes from unused keyword arguments
        return super().from_pretrained(pretrained_model_name_or_path, *model_args, **kwargs)


VARIANTS[DFLASH2_ARCHITECTURE] = DFlash2DraftModel
DFlash2DraftModel.register_for_auto_class("AutoModel")
DFlash2Config.register_for_auto_class("AutoConfig")

# When hf_dflash is installed, a remote-code copy of this module hands back the installed class (see
# modeling_dflash.py).
if not __name__.startswith("hf_dflash."):
    try:
        from hf_dflash.modeling_dflash2 import DFlash2DraftModel  # noqa: F401, F811
    except ImportError:
        pass
