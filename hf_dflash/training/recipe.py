# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""The DFlash recipe: loss decay gamma (and its schedules), position weights, random anchors, the block layout of a
batch, and the data order (shuffling, held-out split, sharding over processes). Every random choice is a function of
(seed, epoch, sample), so a resumed run repeats the uninterrupted one exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from .arguments import DFlashTrainingArguments

IGNORE_INDEX = -100


# Paper values of the loss decay per block size; other sizes interpolate (and extrapolate) linearly.
PAPER_GAMMAS = ((8, 4.0), (10, 5.0), (16, 7.0))


# ----------------------------------------------------------------------------------------------------------------------
# gamma, weights, anchors
def default_gamma(block_size: int) -> float:
    """Loss decay gamma for a block size: the paper's 4 / 5 / 7 at B = 8 / 10 / 16, linear in between and beyond.

    Example:
        >>> default_gamma(16), default_gamma(8), default_gamma(12)
        (7.0, 4.0, 5.666666666666667)
    """
    points = PAPER_GAMMAS
    if block_size <= points[1][0]:
        (x0, y0), (x1, y1) = points[0], points[1]
    else:
        (x0, y0), (x1, y1) = points[1], points[2]
    return max(0.5, y0 + (block_size - x0) * (y1 - y0) / (x1 - x0))


def gamma_at(args: DFlashTrainingArguments, epoch: int, step: int, total_steps: int) -> float:
    """Gamma for an optimizer step: constant, stepped per epoch (DFlare appendix: +1 per epoch), or linear in steps.

    Example:
        >>> args = DFlashTrainingArguments("t", "d", "o", gamma_schedule="per-epoch", epochs=3)
        >>> [gamma_at(args, e, 0, 30) for e in range(3)]
        [4.5, 5.5, 6.5]
    """
    base = args.gamma if args.gamma is not None else default_gamma(args.block_size)
    schedule = args.resolved_gamma_schedule
    if schedule == "constant":
        return base
    start = args.gamma_start if args.gamma_start is not None else base - 2.5
    end = args.gamma_end if args.gamma_end is not None else start + (args.epochs - 1)
    if schedule == "per-epoch":
        fraction = epoch / max(1, args.epochs - 1)
    else:
        fraction = step / max(1, total_steps - 1)
    return start + (end - start) * min(1.0, fraction)


def position_weights(block_size: int, gamma: float) -> torch.Tensor:
    """Loss weight of draft positions k = 1..B-1: exp(-(k-1)/gamma); later positions matter only if earlier ones hit.

    Example:
        >>> position_weights(4, 1.0)
        tensor([1.0000, 0.3679, 0.1353])
    """
    return torch.exp(-torch.arange(block_size - 1, dtype=torch.float32) / gamma)


# Momentum of the running reach rates behind --position-weighting acceptance (about the last 10 steps count).
REACH_RATE_MOMENTUM = 0.9


def initial_reach_rates(block_size: int, gamma: float) -> list[float]:
    """Starting point of the dynamic position weights: the fixed weights exp(-(k-1)/gamma), as Python floats (they
    are checkpointed as JSON, which round-trips floats exactly)."""
    return [math.exp(-k / gamma) for k in range(block_size - 1)]


def update_reach_rates(rates: list[float], reached: torch.Tensor, counted: torch.Tensor,
                       momentum: float = REACH_RATE_MOMENTUM) -> list[float]:
    """Running rate at which drafts reach position k (every position before k right), from one step's counts;
    positions without labels this step keep their rate.

    Example:
        >>> update_reach_rates([1.0, 0.5], torch.tensor([4.0, 1.0]), torch.tensor([4.0, 4.0]), momentum=0.5)
        [1.0, 0.375]
    """
    out = []
    for rate, hit, total in zip(rates, reached.tolist(), counted.tolist()):
        out.append(momentum * rate + (1 - momentum) * hit / total if total > 0 else rate)
    return out


def dynamic_position_weights(rates: list[float], floor: float) -> torch.Tensor:
    """D-PACE-like weights: position k counts as often as drafts reach it, i.e. in proportion to the measured chance
    that all positions before it were accepted (at least `floor`, so no position is abandoned).

    Example:
        >>> dynamic_position_weights([1.0, 0.2, 0.001], floor=0.01)
        tensor([1.0000, 0.2000, 0.0100])
    """
    return torch.tensor(rates, dtype=torch.float32).clamp_min(floor)


def frequent_tokens(samples: list[dict], count: int) -> torch.Tensor:
    """The `count` most frequent response (supervised) tokens of `samples`, by count then id, sorted by id: the
    training-time vocabulary of --train-vocab-size (FR-Spec-like).

    Example:
        >>> s = {"input_ids": torch.tensor([5, 7, 7, 9, 9, 9]), "loss_mask": torch.tensor([0, 1, 1, 1, 1, 1]).bool()}
        >>> frequent_tokens([s], 2).tolist()
        [7, 9]
    """
    tokens = torch.cat([s["input_ids"][s["loss_mask"]].long() for s in samples])
    ids, counts = tokens.unique(return_counts=True)
    order = sorted(range(len(ids)), key=lambda i: (-int(counts[i]), int(ids[i])))[:count]
    return ids[order].sort().values


def batch_vocabulary(frequent: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Sorted token ids of the restricted LM head for one batch: the frequent tokens plus every label in it.

    Example:
        >>> batch_vocabulary(torch.tensor([3, 8]), torch.tensor([[5, IGNORE_INDEX, 8]])).tolist()
        [3, 5, 8]
    """
    present = labels[labels != IGNORE_INDEX].to(frequent.device)
    return torch.cat([frequent, present]).unique(sorted=True)


def sampled_tokens(frequent: torch.Tensor, vocab_size: int, count: int, generator: torch.Generator) -> torch.Tensor:
    """`count` token ids drawn uniformly without replacement from those NOT in `frequent` (sampled-softmax
    negatives of --train-vocab-sampled), sorted.

    Example:
        >>> sampled_tokens(torch.tensor([0, 1, 2]), 6, 2, torch.Generator().manual_seed(0)).tolist()
        [3, 5]
    """
    rest = torch.ones(vocab_size, dtype=torch.bool)
    rest[frequent] = False
    rest = rest.nonzero().flatten()
    pick = torch.randperm(len(rest), generator=generator)[: min(count, len(rest))]
    return rest[pick].sort().values


def training_vocabulary(frequent: torch.Tensor, labels: torch.Tensor, sampled: torch.Tensor | None = None,
                        vocab_size: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(sorted token ids of the restricted LM head, logit offsets or None) for one batch: the frequent tokens and
    every label exactly, plus `sampled` negatives, each standing for (V - N) / S tokens of the rest of the
    vocabulary (offset log((V - N) / S); labels and frequent tokens get 0), so that the softmax normaliser
    estimates the full vocabulary's.

    Example:
        >>> ids, offsets = training_vocabulary(torch.tensor([3, 8]), torch.tensor([[5, 8]]), torch.tensor([1, 5]), 10)
        >>> ids.tolist(), [round(x, 3) for x in offsets.tolist()]
        ([1, 3, 5, 8], [1.386, 0.0, 0.0, 0.0])
    """
    exact = batch_vocabulary(frequent, labels)
    if sampled is None or not len(sampled):
        return exact, None
    sampled = sampled.to(exact.device)
    ids = torch.cat([exact, sampled]).unique(sorted=True)
    weight = (vocab_size - len(frequent)) / len(sampled)
    offsets = torch.where(torch.isin(ids, exact), 0.0, math.log(max(weight, 1.0)))
    return ids, offsets


def stable_seed(*parts: int) -> int:
    """A seed that depends only on `parts` (not on Python's hash randomisation), for per-sample generators."""
    seed = 0x9E3779B1
    for part in parts:
        seed = (seed * 1_000_003 + int(part) + 0x7F4A7C15) % (2**61 - 1)
    return seed


def sample_anchors(loss_mask: torch.Tensor, num_anchors: int, generator: torch.Generator) -> torch.Tensor:
    """Sorted anchor positions p with p and p+1 both supervised (response tokens); at most `num_anchors` of them,
    drawn uniformly without replacement. Blocks may overlap.

    Example:
        >>> sample_anchors(torch.tensor([0, 0, 1, 1, 1, 1], dtype=torch.bool), 2, torch.Generator().manual_seed(0))
        tensor([2, 4])
    """
    candidates = (loss_mask[:-1] & loss_mask[1:]).nonzero().flatten()
    if candidates.numel() > num_anchors:
        choice = torch.randperm(candidates.numel(), generator=generator)[:num_anchors]
        candidates = candidates[choice].sort().values
    return candidates


# ----------------------------------------------------------------------------------------------------------------------
# blocks
@dataclass
class BlockBatch:
    """A padded batch of sequences and the blocks anchored in them (A blocks per sequence, padded)."""

    input_ids: torch.Tensor  # [b, S] right-padded
    attention_mask: torch.Tensor  # [b, S]
    anchors: torch.Tensor  # [b, A]; padding blocks have anchor 0 (no context, only themselves)
    block_valid: torch.Tensor  # [b, A] bool
    block_ids: torch.Tensor  # [b, A*B] token ids [token at anchor, MASK x (B-1)] per block
    block_positions: torch.Tensor  # [b, A*B] anchor + 0..B-1
    labels: torch.Tensor  # [b, A, B-1] token[anchor + k], IGNORE_INDEX where unsupervised
    sample_indices: list[int] = field(default_factory=list)

    def to(self, device) -> "BlockBatch":
        moved = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in self.__dict__.items()}
        return BlockBatch(**moved)

    @property
    def context_length(self) -> int:
        return self.input_ids.shape[1]


def make_block_batch(samples: list[dict], anchors: list[torch.Tensor], block_size: int, mask_token_id: int,
                     pad_token_id: int) -> BlockBatch:
    """Pad sequences (right) and lay out every anchor's block and labels.

    Example:
        >>> s = {"input_ids": torch.arange(10, 16), "loss_mask": torch.tensor([0, 0, 1, 1, 1, 1]).bool(), "index": 0}
        >>> b = make_block_batch([s], [torch.tensor([2])], block_size=3, mask_token_id=99, pad_token_id=0)
        >>> b.block_ids.tolist(), b.block_positions.tolist(), b.labels.tolist()
        ([[12, 99, 99]], [[2, 3, 4]], [[[13, 14]]])
    """
    batch, length = len(samples), max(len(s["input_ids"]) for s in samples)
    num_blocks = max(1, max(len(a) for a in anchors))
    input_ids = torch.full((batch, length), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((batch, length), dtype=torch.long)
    supervised = torch.zeros((batch, length + block_size), dtype=torch.bool)  # room for blocks running off the end
    anchor_pos = torch.zeros((batch, num_blocks), dtype=torch.long)
    block_valid = torch.zeros((batch, num_blocks), dtype=torch.bool)
    for row, (sample, anchor) in enumerate(zip(samples, anchors)):
        n = len(sample["input_ids"])
        input_ids[row, :n] = sample["input_ids"]
        attention_mask[row, :n] = 1
        supervised[row, :n] = sample["loss_mask"]
        anchor_pos[row, : len(anchor)] = anchor
        block_valid[row, : len(anchor)] = True
    offsets = torch.arange(block_size)
    positions = anchor_pos[:, :, None] + offsets  # [b, A, B]
    padded_ids = torch.cat([input_ids, torch.full((batch, block_size), pad_token_id)], dim=1)
    targets = padded_ids.gather(1, positions[:, :, 1:].flatten(1)).view(batch, num_blocks, block_size - 1)
    keep = supervised.gather(1, positions[:, :, 1:].flatten(1)).view_as(targets) & block_valid[:, :, None]
    labels = torch.where(keep, targets, torch.full_like(targets, IGNORE_INDEX))
    block_ids = torch.full((batch, num_blocks, block_size), mask_token_id, dtype=torch.long)
    block_ids[:, :, 0] = input_ids.gather(1, anchor_pos)
    return BlockBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        anchors=anchor_pos,
        block_valid=block_valid,
        block_ids=block_ids.flatten(1),
        block_positions=positions.flatten(1),
        labels=labels,
        sample_indices=[int(s["index"]) for s in samples],
    )


# ----------------------------------------------------------------------------------------------------------------------
# data order
def shard_batches(num_samples: int, batch_size: int, num_processes: int, process_index: int,
                  order: list[int] | None = None) -> list[list[tuple[int, bool]]]:
    """This process's batches of (sample position, counts) pairs: every process gets the same number of full
    batches (DDP steps in lockstep); the wrap-around repeats are flagged so that evaluation skips them.

    Example:
        >>> shard_batches(3, batch_size=1, num_processes=2, process_index=1)
        [[(1, True)], [(0, False)]]
    """
    order = list(range(num_samples)) if order is None else order
    per_step = batch_size * num_processes
    needed = math.ceil(num_samples / per_step) * per_step
    padded = [(order[i % num_samples], i < num_samples) for i in range(needed)]
    return [padded[s + process_index * batch_size : s + (process_index + 1) * batch_size]
            for s in range(0, needed, per_step)]


def epoch_order(num_samples: int, seed: int, epoch: int) -> list[int]:
    """The shuffled sample order of one epoch: a function of (seed, epoch) only, so a resumed run can rebuild it."""
    generator = torch.Generator().manual_seed(stable_seed(seed, epoch, 17))
    return torch.randperm(num_samples, generator=generator).tolist()


def split_heldout(samples: list[dict], fraction: float, max_samples: int, seed: int) -> tuple[list[dict], list[dict]]:
    """(train, held-out) by a seeded shuffle; at least one sample on each side when fraction > 0 and there are two."""
    if fraction <= 0 or len(samples) < 2:
        return samples, []
    count = min(max_samples, max(1, round(fraction * len(samples))), len(samples) - 1)
    order = torch.randperm(len(samples), generator=torch.Generator().manual_seed(stable_seed(seed, 99))).tolist()
    heldout = set(order[:count])
    return ([s for i, s in enumerate(samples) if i not in heldout], [s for i, s in enumerate(samples) if i in heldout])
