# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""The block-diffusion loss: the visibility rule (each block sees the context before its anchor and itself), as a
dense or flex-attention mask, the drafter forward over all blocks of a batch, and the weighted cross-entropy with the
sums behind per-position accuracy and the expected acceptance length.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from .recipe import IGNORE_INDEX, BlockBatch


def block_mask_mod(anchors: torch.Tensor, context_length: int, block_size: int) -> Callable:
    """The training visibility rule as a flex-attention `mask_mod(b, h, q, kv) -> bool`.

    Keys are [context (target features of all S positions), blocks]. Query q belongs to block q // B: it sees
    context keys strictly before that block's anchor (at inference the anchor's own features are not computed yet)
    and the keys of its own block (bidirectional), never other blocks. Works on scalars (flex) and on broadcast
    index tensors (the dense mask), so both backends share one definition.
    """

    def mask_mod(batch_idx, head_idx, q_idx, kv_idx):
        block = q_idx // block_size
        in_context = kv_idx < context_length
        sees_context = in_context & (kv_idx < anchors[batch_idx, block])
        sees_own_block = ~in_context & ((kv_idx - context_length) // block_size == block)
        return sees_context | sees_own_block

    return mask_mod


def dense_block_mask(anchors: torch.Tensor, context_length: int, block_size: int) -> torch.Tensor:
    """Boolean attention mask [b, 1, A*B, S + A*B] (True = attend) for sdpa / eager attention.

    Example:
        >>> dense_block_mask(torch.tensor([[2]]), context_length=3, block_size=2).int()[0, 0]
        tensor([[1, 1, 0, 1, 1],
                [1, 1, 0, 1, 1]], dtype=torch.int32)
    """
    batch, num_blocks = anchors.shape
    device = anchors.device
    q_idx = torch.arange(num_blocks * block_size, device=device)[None, :, None]
    kv_idx = torch.arange(context_length + num_blocks * block_size, device=device)[None, None, :]
    batch_idx = torch.arange(batch, device=device)[:, None, None]
    return block_mask_mod(anchors, context_length, block_size)(batch_idx, None, q_idx, kv_idx)[:, None]


def flex_block_mask(anchors: torch.Tensor, context_length: int, block_size: int):
    """The same rule as a flex-attention `BlockMask` (skips fully masked tiles: blocks x far-away context)."""
    from torch.nn.attention.flex_attention import create_block_mask

    batch, num_blocks = anchors.shape
    q_len = num_blocks * block_size
    return create_block_mask(block_mask_mod(anchors, context_length, block_size), batch, None, q_len,
                             context_length + q_len, device=anchors.device)


def is_flex_attention_available() -> bool:
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


def resolve_attn_implementation(name: str, device: torch.device) -> str:
    """'auto' -> flex_attention on GPUs (sparse, fused), sdpa elsewhere (flex has no CPU backward in torch 2.13)."""
    if name != "auto":
        return name
    return "flex_attention" if device.type == "cuda" and is_flex_attention_available() else "sdpa"


@dataclass
class BlockLossOutput:
    """Weighted loss (for backward) plus the sums behind the reported loss, per-position accuracy and the expected
    acceptance length; sums add up across micro-batches and processes."""

    loss: torch.Tensor
    weighted_ce: torch.Tensor  # sum of w_k * CE (detached)
    weight: torch.Tensor  # sum of w_k over supervised labels
    correct: torch.Tensor  # [B-1] correct predictions per draft position
    counted: torch.Tensor  # [B-1] supervised labels per draft position
    acceptance_sum: torch.Tensor  # sum over blocks of 1 + sum_k prod_{j<=k} correct_j
    num_blocks: torch.Tensor

    def sums(self) -> list[torch.Tensor]:
        return [self.weighted_ce, self.weight, self.correct, self.counted, self.acceptance_sum, self.num_blocks]

    def metrics(self) -> dict[str, Any]:
        return {
            "loss": float(self.weighted_ce / self.weight.clamp_min(1e-6)),
            "accuracy": float(self.correct.sum() / self.counted.sum().clamp_min(1)),
            "accuracy_by_position": (self.correct / self.counted.clamp_min(1)).tolist(),
            "acceptance_length": float(self.acceptance_sum / self.num_blocks.clamp_min(1)),
        }


def block_hidden_states(drafter, embed_tokens, features: torch.Tensor, batch: BlockBatch,
                        attn_implementation: str = "sdpa") -> torch.Tensor:
    """Drafter output for every block of a batch in ONE forward: [b, A, B, hidden].

    Context = target features of all S positions (keys 0..S-1), queries = the blocks concatenated, positions =
    [0..S-1, anchor + 0..B-1 per block], and the block mask restricts each block to context before its anchor plus
    itself. `drafter` may be wrapped (DDP); its config picks the attention kernel, `attn_implementation` only which
    mask is built (a flex `BlockMask` or a dense boolean one).
    """
    block_size = batch.labels.shape[-1] + 1
    seq_len, (b, num_blocks) = batch.context_length, batch.anchors.shape
    if attn_implementation == "flex_attention":
        mask = flex_block_mask(batch.anchors, seq_len, block_size)
    else:
        mask = dense_block_mask(batch.anchors, seq_len, block_size)
    positions = torch.cat([torch.arange(seq_len, device=features.device).expand(b, -1), batch.block_positions], dim=1)
    hidden = drafter(
        noise_embeds=embed_tokens(batch.block_ids),
        context_hidden_states=features,
        position_ids=positions,
        attention_mask=mask,
    ).last_hidden_state
    return hidden.view(b, num_blocks, block_size, -1)


def block_diffusion_loss(drafter, embed_tokens, lm_head, features: torch.Tensor, batch: BlockBatch,
                         weights: torch.Tensor, attn_implementation: str = "sdpa",
                         chunk_size: int = 4096) -> BlockLossOutput:
    """The weighted block loss of a batch, with the sums behind per-position accuracy and expected tau.

    loss = sum(w_k * CE_k) / sum(w_k) over supervised labels; a block's expected acceptance length is
    1 + sum_k prod_{j<=k} correct_j (an unsupervised position ends it).
    """
    hidden = block_hidden_states(drafter, embed_tokens, features, batch, attn_implementation)
    drafts = hidden[:, :, 1:]  # position 0 holds the anchor: not a prediction
    supervised = batch.labels != IGNORE_INDEX
    weight = weights.to(hidden.device)[None, None, :].expand_as(batch.labels)[supervised]
    weighted_ce, hits = chunked_weighted_cross_entropy(drafts[supervised], batch.labels[supervised], weight, lm_head,
                                                       chunk_size)
    loss = weighted_ce / weight.sum().clamp_min(1e-6)
    correct = torch.zeros_like(supervised)
    correct[supervised] = hits
    accepted = correct.long().cumprod(dim=-1).sum(dim=-1)
    valid = batch.block_valid
    return BlockLossOutput(
        loss=loss,
        weighted_ce=weighted_ce.detach().float(),
        weight=weight.sum().float(),
        correct=correct.sum(dim=(0, 1)).float(),
        counted=supervised.sum(dim=(0, 1)).float(),
        acceptance_sum=(1 + accepted[valid]).sum().float(),
        num_blocks=valid.sum().float(),
    )


def chunked_weighted_cross_entropy(hidden: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor, lm_head,
                                   chunk_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of weight * CE, argmax == label) over rows, with LM-head logits materialised `chunk_size` rows at a time
    (recomputed in backward): 8K rows x a 150K vocabulary would otherwise hold gigabytes of logits."""

    def chunk(h, y, w):
        logits = lm_head(h.to(lm_head.weight.dtype)).float()
        return (F.cross_entropy(logits, y, reduction="none") * w).sum(), logits.argmax(dim=-1) == y

    if hidden.shape[0] <= chunk_size:
        return chunk(hidden, labels, weights)
    totals, hits = [], []
    for start in range(0, hidden.shape[0], chunk_size):
        part = slice(start, start + chunk_size)
        total, hit = torch.utils.checkpoint.checkpoint(chunk, hidden[part], labels[part], weights[part],
                                                       use_reentrant=False)
        totals.append(total)
        hits.append(hit)
    return torch.stack(totals).sum(), torch.cat(hits)


def add_sums(total: BlockLossOutput | None, out: BlockLossOutput) -> BlockLossOutput:
    """Accumulate the metric sums of micro-batches (the loss field keeps the last one's, detached)."""
    if total is None:
        return BlockLossOutput(out.loss.detach(), *out.sums())
    return BlockLossOutput(out.loss.detach(), *(a + b for a, b in zip(total.sums(), out.sums())))
