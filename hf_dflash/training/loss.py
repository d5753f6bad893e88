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


def block_mask_mod(anchors: torch.Tensor, context_length: int, block_size: int,
                   sliding_window: int | None = None) -> Callable:
    """The training visibility rule as a flex-attention `mask_mod(b, h, q, kv) -> bool`.

    Keys are [context (target features of all S positions), blocks]. Query q belongs to block q // B: it sees
    context keys strictly before that block's anchor (at inference the anchor's own features are not computed yet)
    and the keys of its own block (bidirectional), never other blocks. With `sliding_window` W (the drafter's
    sliding_attention layers), a query at position p = anchor + q % B sees only keys at positions > p - W, as at
    inference. Works on scalars (flex) and on broadcast index tensors (the dense mask), so both backends share one
    definition.
    """

    def mask_mod(batch_idx, head_idx, q_idx, kv_idx):
        block = q_idx // block_size
        in_context = kv_idx < context_length
        sees_context = in_context & (kv_idx < anchors[batch_idx, block])
        sees_own_block = ~in_context & ((kv_idx - context_length) // block_size == block)
        if sliding_window is not None:
            offset = q_idx % block_size
            sees_context = sees_context & (kv_idx > anchors[batch_idx, block] + offset - sliding_window)
            sees_own_block = sees_own_block & ((kv_idx - context_length) % block_size > offset - sliding_window)
        return sees_context | sees_own_block

    return mask_mod


def dense_block_mask(anchors: torch.Tensor, context_length: int, block_size: int,
                     sliding_window: int | None = None) -> torch.Tensor:
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
    rule = block_mask_mod(anchors, context_length, block_size, sliding_window)
    return rule(batch_idx, None, q_idx, kv_idx)[:, None]


def flex_block_mask(anchors: torch.Tensor, context_length: int, block_size: int, sliding_window: int | None = None):
    """The same rule as a flex-attention `BlockMask` (skips fully masked tiles: blocks x far-away context)."""
    from torch.nn.attention.flex_attention import create_block_mask

    batch, num_blocks = anchors.shape
    q_len = num_blocks * block_size
    return create_block_mask(block_mask_mod(anchors, context_length, block_size, sliding_window), batch, None, q_len,
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
class Objective:
    """What the drafter minimises besides the paper's position-weighted cross-entropy (every default: off).

    - ``distill_weight`` a: the per-token loss is (1 - a) CE(label) + a KL(target || drafter), where the target's
      next-token distribution at a label's position comes from its final hidden state (``teacher_hidden``);
      ``distill_top_k`` > 0 keeps only the target's top-k tokens, renormalised.
    - ``acceptance_weight`` l: loss = (1 - l) position-weighted loss + l mean over blocks of
      -log(1 + sum_k prod_{j<=k} p_j), p_j the drafter's probability of label j: the (log) expected number of
      accepted drafts of a block, which is what inference rewards (LK-style, arXiv 2602.23881 in spirit).
    - ``logit_softcap``: the target's final logit soft-capping (Gemma-style), applied to its distribution.
    """

    distill_weight: float = 0.0
    distill_top_k: int = 0
    acceptance_weight: float = 0.0
    logit_softcap: float | None = None

    @property
    def distills(self) -> bool:
        return self.distill_weight > 0


@dataclass
class BlockLossOutput:
    """Loss (for backward) plus the sums behind the reported loss, per-position accuracy and the expected
    acceptance length; sums add up across micro-batches and processes. The reported loss is always the
    position-weighted hard-label cross-entropy, whatever the objective, so recipes stay comparable."""

    loss: torch.Tensor
    weighted_ce: torch.Tensor  # sum of w_k * CE (detached)
    weight: torch.Tensor  # sum of w_k over supervised labels
    correct: torch.Tensor  # [B-1] correct predictions per draft position
    counted: torch.Tensor  # [B-1] supervised labels per draft position
    acceptance_sum: torch.Tensor  # sum over blocks of 1 + sum_k prod_{j<=k} correct_j
    num_blocks: torch.Tensor
    reached: torch.Tensor | None = None  # [B-1] supervised positions whose earlier positions were all right

    def sums(self) -> list[torch.Tensor]:
        reached = self.reached if self.reached is not None else torch.zeros_like(self.counted)
        return [self.weighted_ce, self.weight, self.correct, self.counted, self.acceptance_sum, self.num_blocks,
                reached]

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
    itself (within the window, for sliding_attention layers). `drafter` may be wrapped (DDP); its config picks the
    attention kernel, `attn_implementation` only which mask is built (a flex `BlockMask` or a dense boolean one).
    """
    block_size = batch.labels.shape[-1] + 1
    seq_len, (b, num_blocks) = batch.context_length, batch.anchors.shape
    build = flex_block_mask if attn_implementation == "flex_attention" else dense_block_mask
    config = getattr(drafter, "module", drafter).config  # DDP wraps the drafter
    mask = build(batch.anchors, seq_len, block_size)
    if "sliding_attention" in (config.layer_types or ()):  # one mask per layer type, as at inference
        mask = {"full_attention": mask,
                "sliding_attention": build(batch.anchors, seq_len, block_size, config.sliding_window)}
    positions = torch.cat([torch.arange(seq_len, device=features.device).expand(b, -1), batch.block_positions], dim=1)
    hidden = drafter(
        noise_embeds=embed_tokens(batch.block_ids),
        context_hidden_states=features,
        position_ids=positions,
        attention_mask=mask,
    ).last_hidden_state
    return hidden.view(b, num_blocks, block_size, -1)


def teacher_rows(teacher_hidden: torch.Tensor, batch: BlockBatch) -> torch.Tensor:
    """The target's final hidden state that predicts each label: position anchor + k - 1 for label k (the target's
    next-token distribution there is what the label was generated from), [b, A, B-1, H]."""
    b, num_blocks, drafts = batch.labels.shape
    positions = batch.block_positions.view(b, num_blocks, drafts + 1)[:, :, :-1].clamp_max(teacher_hidden.shape[1] - 1)
    gathered = teacher_hidden.gather(1, positions.flatten(1)[:, :, None].expand(-1, -1, teacher_hidden.shape[-1]))
    return gathered.view(b, num_blocks, drafts, -1)


def block_diffusion_loss(drafter, embed_tokens, lm_head, features: torch.Tensor, batch: BlockBatch,
                         weights: torch.Tensor, attn_implementation: str = "sdpa", chunk_size: int = 4096,
                         objective: Objective | None = None, teacher_hidden: torch.Tensor | None = None,
                         vocab_ids: torch.Tensor | None = None,
                         vocab_offsets: torch.Tensor | None = None) -> BlockLossOutput:
    """The block loss of a batch, with the sums behind per-position accuracy and expected tau.

    Default: loss = sum(w_k * CE_k) / sum(w_k) over supervised labels. `objective` adds distillation (needs
    `teacher_hidden`, the target's final hidden states [b, S, H]) and the acceptance-aware term; `vocab_ids`
    (sorted, containing every label) restricts the LM head to those rows, `vocab_offsets` (sampled negatives) is
    added to their logits in the loss (not to the argmax). A block's expected acceptance length is
    1 + sum_k prod_{j<=k} correct_j (an unsupervised position ends it).
    """
    objective = objective or Objective()
    hidden = block_hidden_states(drafter, embed_tokens, features, batch, attn_implementation)
    drafts = hidden[:, :, 1:]  # position 0 holds the anchor: not a prediction
    supervised = batch.labels != IGNORE_INDEX
    labels = batch.labels[supervised]
    if vocab_ids is not None:
        vocab_ids = vocab_ids.to(labels.device)
        labels = torch.searchsorted(vocab_ids, labels)
    teacher = None
    if objective.distills:
        if teacher_hidden is None:
            raise ValueError("distillation needs the target's final hidden states (teacher_hidden).")
        teacher = teacher_rows(teacher_hidden.to(hidden.device), batch)[supervised]
    weight = weights.to(hidden.device)[None, None, :].expand_as(batch.labels)[supervised]
    ce, kl, hits = chunked_token_losses(drafts[supervised], labels, lm_head, chunk_size, vocab_ids, teacher,
                                        objective, vocab_offsets)
    weighted_ce = (ce * weight).sum()
    token_loss = ce if kl is None else (1 - objective.distill_weight) * ce + objective.distill_weight * kl
    loss = (token_loss * weight).sum() / weight.sum().clamp_min(1e-6)
    model = getattr(drafter, "module", drafter)  # DDP wraps the drafter
    if getattr(model, "candidate_selector", None) is not None:  # DFlash2: the selector learns the true path too
        path_ce = selector_path_losses(model, lm_head, drafts, batch, chunk_size)
        loss = loss + (path_ce * weight).sum() / weight.sum().clamp_min(1e-6)
    valid = batch.block_valid
    if objective.acceptance_weight > 0:
        log_p = torch.zeros(supervised.shape, dtype=ce.dtype, device=ce.device).masked_scatter(supervised, -ce)
        reach = torch.exp(torch.cumsum(log_p, dim=-1)) * supervised.to(ce.dtype).cumprod(dim=-1)
        acceptance = -torch.log1p(reach.sum(dim=-1))[valid]  # [blocks]: -log(1 + expected accepted drafts)
        acceptance_loss = acceptance.sum() / valid.sum().clamp_min(1)
        loss = (1 - objective.acceptance_weight) * loss + objective.acceptance_weight * acceptance_loss
    correct = torch.zeros_like(supervised)
    correct[supervised] = hits
    prefix = correct.long().cumprod(dim=-1)
    accepted = prefix.sum(dim=-1)
    before = torch.cat([torch.ones_like(prefix[..., :1]), prefix[..., :-1]], dim=-1).bool()
    return BlockLossOutput(
        loss=loss,
        weighted_ce=weighted_ce.detach().float(),
        weight=weight.sum().float(),
        correct=correct.sum(dim=(0, 1)).float(),
        counted=supervised.sum(dim=(0, 1)).float(),
        acceptance_sum=(1 + accepted[valid]).sum().float(),
        num_blocks=valid.sum().float(),
        reached=(before & supervised).sum(dim=(0, 1)).float(),
    )


def selector_path_losses(model, lm_head, drafts: torch.Tensor, batch: BlockBatch, chunk_size: int) -> torch.Tensor:
    """DFlash2: per supervised draft position, the cross-entropy of the true token under the walk's row after the
    true previous token, softmax(S[d, i*_{d-1}, :]) (i* = the labels' candidate indices; the anchor's row at d = 1).

    z-lab and Inco AI published no training code; this is the closest recipe public code supports: train the
    selector on the path the target wrote (teacher forcing, as the token loss trains the drafts), with candidates as
    at inference, the top `selector_top_k` tokens of the LM head (taken without gradient), except that a label
    outside them replaces the last one (so the true path always exists). `drafts` [b, A, B-1, H] are the drafter's
    final states at the draft positions; returns the losses of ``batch.labels != IGNORE_INDEX``, in its order.
    """
    b, num_blocks, steps = batch.labels.shape
    labels = batch.labels.reshape(b * num_blocks, steps)
    hidden = drafts.reshape(b * num_blocks, steps, -1)
    supervised = labels != IGNORE_INDEX
    with torch.no_grad():
        rows = hidden.reshape(-1, hidden.shape[-1])
        candidates = torch.cat([head_logits(lm_head, rows[i : i + chunk_size]).topk(model.config.selector_top_k).indices
                                for i in range(0, rows.shape[0], chunk_size)]).view(*labels.shape, -1)
        truth = labels.clamp_min(0)[..., None]
        missing = ~(candidates == truth).any(-1, keepdim=True)
        candidates[..., -1:] = torch.where(missing, truth, candidates[..., -1:])
        index = (candidates == truth).long().argmax(-1)  # [N, steps]: the label's place among the candidates
    z = (hidden[..., None, :].to(lm_head.weight.dtype) * lm_head.weight[candidates]).sum(-1).float()
    config = model.config
    unary = z * config.output_multiplier
    if config.final_logit_softcapping:
        unary = torch.tanh(unary / config.final_logit_softcapping) * config.final_logit_softcapping
    anchors = batch.block_ids.view(b * num_blocks, steps + 1)[:, 0]
    edges = model.edge_scores(candidates, unary, hidden, anchors)  # [N, steps, K, K]
    previous = torch.cat([torch.zeros_like(index[:, :1]), index[:, :-1]], dim=1)
    chosen_rows = edges.gather(2, previous[..., None, None].expand(-1, -1, 1, edges.shape[-1]))[:, :, 0]
    ce = F.cross_entropy(chosen_rows.reshape(-1, chosen_rows.shape[-1]), index.reshape(-1), reduction="none")
    on_path = supervised.long().cumprod(dim=-1).bool()  # every label before it supervised: the true path is known
    return (ce.view_as(labels) * on_path)[supervised]


def head_logits(lm_head, hidden: torch.Tensor, vocab_ids: torch.Tensor | None = None) -> torch.Tensor:
    """LM-head logits (fp32) over the whole vocabulary, or over the rows `vocab_ids` only."""
    hidden = hidden.to(lm_head.weight.dtype)
    if vocab_ids is None:
        return lm_head(hidden).float()
    bias = lm_head.bias[vocab_ids] if getattr(lm_head, "bias", None) is not None else None
    return F.linear(hidden, lm_head.weight[vocab_ids], bias).float()


def chunked_token_losses(hidden: torch.Tensor, labels: torch.Tensor, lm_head, chunk_size: int,
                         vocab_ids: torch.Tensor | None = None, teacher: torch.Tensor | None = None,
                         objective: Objective | None = None, vocab_offsets: torch.Tensor | None = None
                         ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Per row: (CE of the label, KL(target || drafter) or None, argmax == label), with LM-head logits materialised
    `chunk_size` rows at a time (recomputed in backward): 8K rows x a 150K vocabulary would otherwise hold gigabytes
    of logits. `teacher` holds the target's final hidden states of the rows (distillation); `vocab_offsets` are
    added to the (restricted) logits of both before the softmax."""
    objective = objective or Objective()
    offsets = None if vocab_offsets is None else vocab_offsets.to(hidden.device)

    def chunk(h, y, t):
        logits = head_logits(lm_head, h, vocab_ids)
        log_q = F.log_softmax(logits if offsets is None else logits + offsets, dim=-1)
        ce = -log_q.gather(1, y[:, None])[:, 0]
        kl = None
        if t is not None:
            with torch.no_grad():
                teacher_logits = head_logits(lm_head, t, vocab_ids)
                if objective.logit_softcap:
                    teacher_logits = torch.tanh(teacher_logits / objective.logit_softcap) * objective.logit_softcap
                if offsets is not None:
                    teacher_logits = teacher_logits + offsets
                if objective.distill_top_k:
                    top = teacher_logits.topk(min(objective.distill_top_k, teacher_logits.shape[-1]), dim=-1)
                    log_p, index = F.log_softmax(top.values, dim=-1), top.indices
                else:
                    log_p, index = F.log_softmax(teacher_logits, dim=-1), None
            student = log_q if index is None else log_q.gather(1, index)
            kl = (log_p.exp() * (log_p - student)).sum(dim=-1)
        return ce, kl, logits.argmax(dim=-1) == y

    if hidden.shape[0] <= chunk_size:
        return chunk(hidden, labels, teacher)
    parts = []
    for start in range(0, hidden.shape[0], chunk_size):
        part = slice(start, start + chunk_size)
        parts.append(torch.utils.checkpoint.checkpoint(chunk, hidden[part], labels[part],
                                                       None if teacher is None else teacher[part],
                                                       use_reentrant=False))
    ce, kl, hits = zip(*parts)
    return torch.cat(ce), None if teacher is None else torch.cat(kl), torch.cat(hits)


def add_sums(total: BlockLossOutput | None, out: BlockLossOutput) -> BlockLossOutput:
    """Accumulate the metric sums of micro-batches (the loss field keeps the last one's, detached)."""
    if total is None:
        return BlockLossOutput(out.loss.detach(), *out.sums())
    return BlockLossOutput(out.loss.detach(), *(a + b for a, b in zip(total.sums(), out.sums())))
