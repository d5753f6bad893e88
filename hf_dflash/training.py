# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""Training DFlash drafters (the `hf-dflash train` command and its Python API).

Recipe (DFlash paper, as reproduced by SpecForge): the frozen target runs over each regenerated sequence and its
hidden states at ``target_layer_ids`` become the drafter's context; random anchors are drawn from response
positions; every anchor starts a block ``[token at anchor, MASK x (B-1)]`` at positions ``anchor + 0..B-1`` whose
labels are ``token[anchor + k]``; all blocks of a sequence go through the drafter in ONE forward, with a mask that
lets a block see the context strictly before its anchor (exactly what inference gives it) and itself
bidirectionally, never other blocks. Loss: cross-entropy weighted by ``exp(-(k - 1) / gamma)``, because a draft
position only counts when all positions before it were accepted.

`accelerate` places models and runs DDP, so one script covers a laptop CPU and ``accelerate launch`` on N GPUs.

Example:
    >>> from hf_dflash.training import DFlashTrainingArguments, DFlashTrainer
    >>> args = DFlashTrainingArguments(target="Qwen/Qwen3-8B", data="train.jsonl", output_dir="qwen3-8b-dflash",
    ...                                num_layers=5, block_size=16, epochs=6)
    >>> DFlashTrainer(args).train()  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, get_cosine_schedule_with_warmup
from transformers.utils import logging

from .data import (
    add_dataclass_command,
    load_prompts,
    load_training_samples,
    prompt_text,
    prompt_token_ids,
)
from .modeling_dflash import DFlashDraftModel
from .targets import load_target, target_display_name


logger = logging.get_logger(__name__)

IGNORE_INDEX = -100
GAMMA_SCHEDULES = ("constant", "per-epoch", "linear")
VARIANTS = ("dflash", "dflare")
# Paper values of the loss decay per block size; other sizes interpolate (and extrapolate) linearly.
PAPER_GAMMAS = ((8, 4.0), (10, 5.0), (16, 7.0))
RUN_ARGS_FILE = "run_args.json"
TRAINER_STATE_FILE = "trainer_state.json"
ACCELERATE_STATE_DIR = "training_state"
# Fields that do not change the optimisation trajectory: they may differ when a run is resumed.
NON_DEFINING_FIELDS = frozenset({
    "output_dir", "resume", "save_every", "save_total_limit", "eval_prompts", "num_eval_prompts",
    "eval_max_new_tokens", "feature_cache", "attn_implementation", "logging_steps", "push_to_hub",
    "max_eval_samples", "target_device_map",
})


def _layer_ids(text: str) -> list[int]:
    return [int(x) for x in text.replace(" ", "").split(",") if x]


@dataclass
class DFlashTrainingArguments:
    """Arguments of :class:`DFlashTrainer` (the `hf-dflash train` command). Defaults follow the paper's recipe."""

    target: str = field(metadata={"help": "Target model: local folder or Hub id.", "required": True})
    data: str = field(metadata={"help": "Regenerated data (JSONL/Parquet/datasets folder) from `regenerate`.",
                                "required": True})
    output_dir: str = field(metadata={"help": "Folder for checkpoints and the final drafter.", "required": True,
                                      "flag": "--output"})
    num_layers: int = field(default=5, metadata={"help": "Drafter decoder layers."})
    block_size: int = field(default=16, metadata={"help": "Block size B (anchor + B-1 drafts)."})
    epochs: int = field(default=6, metadata={"help": "Passes over the training data."})
    lr: float = field(default=6e-4, metadata={"help": "Peak AdamW learning rate."})
    num_anchors: int = field(default=512, metadata={"help": "Most anchors (blocks) per sequence."})
    max_length: int = field(default=3072, metadata={"help": "Sequences are truncated to this many tokens."})
    batch_size: int = field(default=1, metadata={"help": "Sequences per micro-batch per process."})
    grad_accum: int = field(default=1, metadata={"help": "Micro-batches per optimizer step."})
    warmup_ratio: float = field(default=0.04, metadata={"help": "Linear warmup share of all steps."})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay."})
    max_grad_norm: float = field(default=1.0, metadata={"help": "Gradient clipping norm."})
    gamma: float | None = field(default=None, metadata={"help": "Loss decay gamma (default: 7 @ B=16, 5 @ 10, 4 @ 8)."})
    variant: str = field(default="dflash", metadata={
        "help": "dflash, or dflare: layer-wise feature fusion + split context K/V + progressive gamma.",
        "choices": VARIANTS})
    layer_fusion: bool = field(default=False, metadata={"help": "DFlare layer-wise feature fusion (ablation: alone)."})
    split_context_kv: bool = field(default=False, metadata={
        "help": "DFlare separate K/V projections for context tokens (ablation: alone)."})
    gamma_schedule: str | None = field(default=None, metadata={
        "help": "constant | per-epoch | linear (default: per-epoch for DFlare drafters, constant for DFlash).",
        "choices": GAMMA_SCHEDULES})
    gamma_start: float | None = field(default=None, metadata={"help": "First gamma of a schedule (default gamma-2.5)."})
    gamma_end: float | None = field(default=None, metadata={"help": "Last gamma of a schedule (default +1/epoch)."})
    target_layer_ids: list[int] | None = field(default=None, metadata={
        "help": "Comma-separated target layer ids (default: z-lab rule, one per drafter layer).", "type": _layer_ids})
    mask_token_id: int | None = field(default=None, metadata={"help": "MASK token id (default: last embedding row)."})
    init_drafter: str | None = field(default=None, metadata={
        "help": "Start from this drafter's weights (folder or Hub id; e.g. continue a run on more data, or adapt a "
                "published drafter). Its architecture must match the other drafter arguments."})
    seed: int = field(default=0, metadata={"help": "Seed of init, shuffling, anchors and the held-out split."})
    max_steps: int | None = field(default=None, metadata={"help": "Stop after this many optimizer steps."})
    eval_split: float = field(default=0.05, metadata={"help": "Held-out share of the data (0 = none)."})
    max_eval_samples: int = field(default=256, metadata={"help": "Cap on held-out samples."})
    eval_prompts: str | None = field(default=None, metadata={"help": "Prompts for the final generate()-measured tau "
                                                                     "(default: held-out prompts)."})
    num_eval_prompts: int = field(default=8, metadata={"help": "Prompts for the final tau (0 = skip)."})
    eval_max_new_tokens: int = field(default=128, metadata={"help": "New tokens per final-tau prompt."})
    save_every: int = field(default=1000, metadata={"help": "Checkpoint every N optimizer steps (and each epoch)."})
    save_total_limit: int = field(default=2, metadata={"help": "Checkpoints kept."})
    resume: bool = field(default=False, metadata={"help": "Continue from the last checkpoint in --output."})
    feature_cache: str | None = field(default=None, metadata={"help": "Folder caching target features (small "
                                                                      "targets on CPU)."})
    attn_implementation: str = field(default="auto", metadata={
        "help": "auto (flex_attention on GPU, sdpa on CPU), flex_attention, sdpa or eager."})
    mixed_precision: str = field(default="auto", metadata={"help": "auto (bf16 on GPU), bf16, fp16 or no."})
    target_dtype: str = field(default="auto", metadata={"help": "auto (bf16 on GPU, fp32 on CPU) or a dtype name."})
    target_device_map: str | None = field(default=None, metadata={
        "help": "device_map for a target larger than one device (single process), e.g. auto."})
    logging_steps: int = field(default=10, metadata={"help": "Log every N optimizer steps."})
    push_to_hub: str | None = field(default=None, metadata={"help": "Hub repo id to upload the final drafter to."})

    @property
    def drafter_switches(self) -> dict[str, bool]:
        """DFlare architecture switches: --variant dflare turns both on; each can be switched on alone."""
        dflare = self.variant == "dflare"
        return {"layer_fusion": dflare or self.layer_fusion, "split_context_kv": dflare or self.split_context_kv}

    @property
    def resolved_gamma_schedule(self) -> str:
        """Progressive gamma is the DFlare recipe; DFlash keeps gamma constant unless told otherwise."""
        if self.gamma_schedule is not None:
            return self.gamma_schedule
        return "per-epoch" if any(self.drafter_switches.values()) else "constant"

    def run_fingerprint(self) -> dict[str, Any]:
        """The fields that define the run: a resumed run must match them."""
        fingerprint = {k: v for k, v in asdict(self).items() if k not in NON_DEFINING_FIELDS}
        for key in ("target", "data"):
            value = fingerprint[key]
            fingerprint[key] = os.path.abspath(value) if os.path.exists(value) else value
        return fingerprint


# ----------------------------------------------------------------------------------------------------------------------
# checks (cheap, before anything is loaded)
def validate_arguments(args: DFlashTrainingArguments) -> None:
    """Raise a ValueError naming the problem for settings that cannot train."""
    if args.block_size < 2:
        raise ValueError(f"block_size={args.block_size}: a DFlash block needs >= 2 tokens (anchor + drafts); "
                         "16 is the paper's value.")
    for name in ("num_layers", "epochs", "num_anchors", "batch_size", "grad_accum"):
        if getattr(args, name) < 1:
            raise ValueError(f"{name}={getattr(args, name)} must be >= 1.")
    if args.max_length < 2 * args.block_size:
        raise ValueError(f"max_length={args.max_length} leaves no room for 2 x block_size={args.block_size} tokens.")
    if args.gamma_schedule is not None and args.gamma_schedule not in GAMMA_SCHEDULES:
        raise ValueError(f"gamma_schedule={args.gamma_schedule!r}; choose one of {GAMMA_SCHEDULES}.")
    if not 0 <= args.eval_split < 1:
        raise ValueError(f"eval_split={args.eval_split} must be in [0, 1).")
    if args.attn_implementation not in ("auto", "flex_attention", "sdpa", "eager"):
        raise ValueError(f"attn_implementation={args.attn_implementation!r}: auto, flex_attention, sdpa or eager.")
    if not Path(args.data).exists():
        raise ValueError(f"--data {args.data!r} does not exist.")


def check_output_dir(args: DFlashTrainingArguments) -> Path | None:
    """The checkpoint to resume from (None: start fresh). Raises if the folder holds a different run, or a run that
    would be overwritten without --resume."""
    output = Path(args.output_dir)
    saved_file = output / RUN_ARGS_FILE
    checkpoint = last_checkpoint(output)
    if saved_file.exists():
        saved = json.loads(saved_file.read_text(encoding="utf-8"))
        current = json.loads(json.dumps(args.run_fingerprint()))  # same JSON types as the saved copy
        differ = {k: (saved.get(k), current.get(k)) for k in sorted(set(saved) | set(current))
                  if saved.get(k) != current.get(k)}
        if differ:
            details = "; ".join(f"{k}: saved {a!r}, now {b!r}" for k, (a, b) in differ.items())
            raise ValueError(f"Output folder {output} holds a different run ({details}). Use another --output, or the "
                             "same settings to resume it.")
        if checkpoint is not None and not args.resume:
            raise ValueError(f"Output folder {output} already holds this run (checkpoint {checkpoint.name}). Pass "
                             "--resume to continue it, or use another --output.")
    elif checkpoint is not None:
        raise ValueError(f"Output folder {output} holds checkpoints without {RUN_ARGS_FILE}; use another --output.")
    if args.resume and checkpoint is None:
        logger.warning(f"--resume: no checkpoint in {output}; starting from scratch.")
    return checkpoint if args.resume else None


def last_checkpoint(output_dir: str | os.PathLike) -> Path | None:
    """The newest complete `checkpoint-{step}` folder (they appear by an atomic rename, so present = complete)."""
    folder = Path(output_dir) / "checkpoints"
    if not folder.is_dir():
        return None
    steps = [(int(p.name.split("-")[1]), p) for p in folder.glob("checkpoint-*") if p.name.split("-")[1].isdigit()]
    return max(steps)[1] if steps else None


# ----------------------------------------------------------------------------------------------------------------------
# target loading
def resolve_dtype(name: str) -> torch.dtype:
    """'auto' -> bf16 on GPUs that support it, fp32 otherwise; else the named torch dtype."""
    if name == "auto":
        cuda_bf16 = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
        return torch.bfloat16 if cuda_bf16 else torch.float32
    return getattr(torch, name.removeprefix("torch."))


def load_target_and_tokenizer(name_or_path: str, dtype: str = "auto", device: str | torch.device | None = None,
                              device_map: str | None = None):
    """(target in eval mode with frozen weights, tokenizer with a pad token) from a Hub id, a local folder, a
    ``.gguf`` file or ``"smollm2"`` (the offline SmolLM2-135M-Instruct, see :mod:`hf_dflash.targets`).

    `device_map` (e.g. ``"auto"``) spreads a target too large for one device over all visible ones (one process).

    Example:
        >>> target, tokenizer = load_target_and_tokenizer("HuggingFaceTB/SmolLM2-135M-Instruct")  # doctest: +SKIP
    """
    torch_dtype = resolve_dtype(dtype)
    if device_map:
        target = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=torch_dtype, device_map=device_map)
        tokenizer = AutoTokenizer.from_pretrained(name_or_path)
    else:
        device = device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu")
        target, tokenizer = load_target(name_or_path, dtype=torch_dtype, device=device)
    target.eval().requires_grad_(False)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return target, tokenizer


# ----------------------------------------------------------------------------------------------------------------------
# the recipe: gamma, anchors, blocks, mask, loss
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


def context_features(target, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                     layer_ids: list[int]) -> torch.Tensor:
    """Target hidden states at `layer_ids` (output of layer k = hidden_states[k + 1]), concatenated: [b, S, T*H]."""
    wanted = sorted({i + 1 for i in layer_ids})
    with torch.no_grad():
        out = target(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=wanted,
                     logits_to_keep=1, use_cache=False)
    return torch.cat([out.hidden_states[i + 1] for i in layer_ids], dim=-1)


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


# ----------------------------------------------------------------------------------------------------------------------
# evaluation with real generate()
@torch.no_grad()
def measure_acceptance_length(target, drafter, prompts: list[list[int]], max_new_tokens: int = 128) -> dict[str, Any]:
    """Mean acceptance length tau measured by real greedy ``target.generate(assistant_model=drafter)`` calls.

    Example:
        >>> measure_acceptance_length(target, drafter, [tokenizer("Hi")["input_ids"]])["tau"]  # doctest: +SKIP
        3.7
    """
    config = GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=target.generation_config.eos_token_id,
        pad_token_id=target.generation_config.pad_token_id or _first(target.generation_config.eos_token_id),
        bos_token_id=target.generation_config.bos_token_id,
    )
    lengths, per_prompt = [], []
    for ids in prompts:
        input_ids = torch.tensor([ids], device=target.device)
        target.generate(input_ids, attention_mask=torch.ones_like(input_ids), generation_config=config,
                        assistant_model=drafter)
        lengths += drafter.last_stats.acceptance_lengths
        per_prompt.append(drafter.last_stats.mean_acceptance_length)
    block = drafter.config.block_size
    return {
        "tau": sum(lengths) / len(lengths) if lengths else 0.0,
        "tau_per_prompt": per_prompt,
        "acceptance_by_position": [sum(a > k for a in lengths) / max(1, len(lengths)) for k in range(1, block)],
        "num_prompts": len(prompts),
        "num_verifications": len(lengths),
        "max_new_tokens": max_new_tokens,
    }


def _first(value):
    return value[0] if isinstance(value, (list, tuple)) else value


INIT_DRAFTER_FIELDS = ("num_hidden_layers", "block_size", "target_layer_ids", "mask_token_id", "layer_fusion",
                       "split_context_kv", "hidden_size", "vocab_size")


def initial_drafter_weights(fresh: DFlashDraftModel, init_drafter: str) -> DFlashDraftModel:
    """`fresh` (built from the training arguments) with the weights of the drafter at `init_drafter`.

    Raises a ValueError naming each architecture field that differs (e.g. --num-layers 5 for a 1-layer drafter), so
    a run never silently trains something other than what its arguments say.
    """
    loaded = DFlashDraftModel.from_pretrained(init_drafter, dtype=torch.float32)
    differ = {name: (getattr(loaded.config, name), getattr(fresh.config, name)) for name in INIT_DRAFTER_FIELDS
              if getattr(loaded.config, name) != getattr(fresh.config, name)}
    if differ:
        listed = ", ".join(f"{name}: {a!r} there vs {b!r} here" for name, (a, b) in differ.items())
        raise ValueError(f"--init-drafter {init_drafter} does not match the training arguments ({listed}). Pass the "
                         "drafter's own values (--num-layers, --block-size, --target-layer-ids, --mask-token-id, the "
                         "DFlare switches), or drop --init-drafter to train from scratch.")
    fresh.load_state_dict(loaded.state_dict(), strict=True)
    logger.info(f"Drafter weights initialised from {init_drafter}.")
    return fresh


# ----------------------------------------------------------------------------------------------------------------------
# feature cache
class FeatureCache:
    """Target features per sample on disk, for small targets where the target forward dominates (CPU).

    Features are stored at the target's dtype, so cached and recomputed training are the same computation.
    """

    def __init__(self, folder: str | os.PathLike, fingerprint: dict[str, Any]):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        meta = self.folder / "cache.json"
        if meta.exists():
            saved = json.loads(meta.read_text(encoding="utf-8"))
            if saved != fingerprint:
                raise ValueError(f"Feature cache {self.folder} was built for {saved}, not {fingerprint}: use another "
                                 "--feature-cache folder.")
        else:
            meta.write_text(json.dumps(fingerprint, indent=2) + "\n", encoding="utf-8")

    def get(self, index: int) -> torch.Tensor | None:
        path = self.folder / f"{index}.pt"
        return torch.load(path) if path.exists() else None

    def put(self, index: int, features: torch.Tensor) -> None:
        path = self.folder / f"{index}.pt"
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        torch.save(features.detach().cpu().clone(), tmp)
        os.replace(tmp, path)


# ----------------------------------------------------------------------------------------------------------------------
# trainer
class DFlashTrainer:
    """Trains a DFlash drafter on regenerated data against its frozen target.

    Everything that can be checked without training is checked in ``__init__`` (arguments, output folder, data,
    target layers). ``callbacks`` are called as ``callback(trainer, log)`` after every optimizer step.

    Example:
        >>> trainer = DFlashTrainer(DFlashTrainingArguments(target="HuggingFaceTB/SmolLM2-135M-Instruct",
        ...     data="train.jsonl", output_dir="smollm2-dflash", num_layers=1, epochs=2))  # doctest: +SKIP
        >>> results = trainer.train()  # doctest: +SKIP
        >>> results["tau"]  # doctest: +SKIP
    """

    def __init__(self, args: DFlashTrainingArguments, target=None, tokenizer=None,
                 callbacks: list[Callable] | None = None):
        from accelerate import Accelerator
        from accelerate.utils import set_seed

        validate_arguments(args)
        self.args = args
        self.callbacks = list(callbacks or [])
        self.resume_from = check_output_dir(args)
        samples = load_training_samples(args.data, args.max_length, 2 * args.block_size)
        self.train_samples, self.eval_samples = split_heldout(samples, args.eval_split, args.max_eval_samples,
                                                              args.seed)

        mixed = args.mixed_precision
        if mixed == "auto":
            mixed = "bf16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "no"
        self.accelerator = Accelerator(mixed_precision=mixed)
        device = self.accelerator.device
        if target is None or tokenizer is None:
            target, tokenizer = load_target_and_tokenizer(args.target, args.target_dtype, device=device,
                                                          device_map=args.target_device_map)
        self.target, self.tokenizer = target.eval().requires_grad_(False), tokenizer
        self.embed_tokens = target.get_input_embeddings()
        self.lm_head = target.get_output_embeddings()

        set_seed(args.seed)
        drafter = DFlashDraftModel.from_target(
            target, num_hidden_layers=args.num_layers, block_size=args.block_size,
            target_layer_ids=args.target_layer_ids, mask_token_id=args.mask_token_id, **args.drafter_switches,
        )  # raises a ValueError for layer ids the target does not have
        if args.init_drafter:
            drafter = initial_drafter_weights(drafter, args.init_drafter)
        self.attn_implementation = resolve_attn_implementation(args.attn_implementation, device)
        drafter.config._attn_implementation = self.attn_implementation
        drafter = drafter.to(device=device, dtype=torch.float32).train()  # fp32 master weights; autocast does bf16
        self.layer_ids = list(drafter.config.target_layer_ids)
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

        steps_per_epoch = math.ceil(len(shard_batches(len(self.train_samples), args.batch_size,
                                                      self.accelerator.num_processes, 0)) / args.grad_accum)
        self.steps_per_epoch = steps_per_epoch
        self.total_steps = steps_per_epoch * args.epochs
        if args.max_steps is not None:
            self.total_steps = min(self.total_steps, args.max_steps)
        optimizer = torch.optim.AdamW(drafter.parameters(), lr=args.lr, weight_decay=args.weight_decay,
                                      betas=(0.9, 0.95))
        self.scheduler = get_cosine_schedule_with_warmup(
            optimizer, math.ceil(args.warmup_ratio * self.total_steps), self.total_steps
        )
        self.model, self.optimizer = self.accelerator.prepare(drafter, optimizer)
        # The scheduler is stepped once per optimizer step by us (a prepared one steps once per process).
        self.accelerator.register_for_checkpointing(self.scheduler)
        self.accelerator.register_save_state_pre_hook(self._skip_model_in_state)
        self.accelerator.register_load_state_pre_hook(self._load_model_from_checkpoint)

        self.feature_cache = None
        if args.feature_cache:
            self.feature_cache = FeatureCache(args.feature_cache, {
                "target": args.run_fingerprint()["target"], "data": args.run_fingerprint()["data"],
                "target_layer_ids": self.layer_ids, "max_length": args.max_length, "dtype": str(target.dtype)})

        self.global_step, self.epoch, self.groups_done, self.last_saved_step = 0, 0, 0, -1
        self.history: list[dict[str, Any]] = []
        if self.accelerator.is_main_process:
            Path(args.output_dir).mkdir(parents=True, exist_ok=True)
            (Path(args.output_dir) / RUN_ARGS_FILE).write_text(
                json.dumps(args.run_fingerprint(), indent=2) + "\n", encoding="utf-8")
        logger.info(f"DFlash training: {len(self.train_samples)} train / {len(self.eval_samples)} held-out samples, "
                    f"{self.total_steps} steps, attention {self.attn_implementation}, layers {self.layer_ids}.")

    # ------------------------------------------------------------------------------------------------------------------
    # batches
    def anchors_for(self, sample: dict, epoch: int) -> torch.Tensor:
        """Anchors of one sample in one epoch: a function of (seed, epoch, sample) only, so resuming is exact."""
        generator = torch.Generator().manual_seed(stable_seed(self.args.seed, epoch, sample["index"]))
        return sample_anchors(sample["loss_mask"], self.args.num_anchors, generator)

    def block_batch(self, samples: list[dict], epoch: int) -> BlockBatch:
        anchors = [self.anchors_for(s, epoch) for s in samples]
        batch = make_block_batch(samples, anchors, self.args.block_size, self.model_config.mask_token_id,
                                 self.pad_token_id)
        return batch.to(self.accelerator.device)

    @property
    def model_config(self):
        return self.accelerator.unwrap_model(self.model).config

    def features_for(self, batch: BlockBatch) -> torch.Tensor:
        """Target features of a batch, from the feature cache when every sample is in it."""
        cache = self.feature_cache
        if cache is not None:
            cached = [cache.get(i) for i in batch.sample_indices]
            if all(c is not None for c in cached):
                out = torch.zeros(len(cached), batch.context_length, cached[0].shape[-1], dtype=cached[0].dtype)
                for row, c in enumerate(cached):
                    out[row, : c.shape[0]] = c
                return out.to(self.accelerator.device)
        device = self.target.get_input_embeddings().weight.device
        features = context_features(self.target, batch.input_ids.to(device), batch.attention_mask.to(device),
                                    self.layer_ids)
        if cache is not None:
            lengths = batch.attention_mask.sum(dim=1).tolist()
            for row, (index, n) in enumerate(zip(batch.sample_indices, lengths)):
                cache.put(index, features[row, :n])
        return features.to(self.accelerator.device)

    def compute_loss(self, batch: BlockBatch, weights: torch.Tensor) -> BlockLossOutput:
        features = self.features_for(batch)
        with self.accelerator.autocast():
            return block_diffusion_loss(self.model, self.embed_tokens, self.lm_head, features,
                                        batch.to(self.embed_tokens.weight.device), weights, self.attn_implementation)

    # ------------------------------------------------------------------------------------------------------------------
    # training
    def epoch_groups(self, epoch: int) -> list[list[list[int]]]:
        """This process's micro-batches of one epoch (sample positions), grouped per optimizer step."""
        batches = shard_batches(len(self.train_samples), self.args.batch_size, self.accelerator.num_processes,
                                self.accelerator.process_index, epoch_order(len(self.train_samples), self.args.seed,
                                                                            epoch))
        batches = [[position for position, _ in batch] for batch in batches]
        return [batches[i : i + self.args.grad_accum] for i in range(0, len(batches), self.args.grad_accum)]

    def training_step(self, group: list[list[int]], epoch: int, gamma: float) -> dict[str, Any]:
        """One optimizer step over `group` (grad_accum micro-batches); returns the step's log entry."""
        weights = position_weights(self.args.block_size, gamma)
        totals = None
        for i, positions in enumerate(group):
            batch = self.block_batch([self.train_samples[p] for p in positions], epoch)
            last = i == len(group) - 1
            with contextlib.nullcontext() if last else self.accelerator.no_sync(self.model):
                out = self.compute_loss(batch, weights)
                self.accelerator.backward(out.loss / len(group))
            totals = _add_sums(totals, out)
        grad_norm = self.accelerator.clip_grad_norm_(self.model.parameters(), self.args.max_grad_norm)
        lr = self.scheduler.get_last_lr()[0]
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        metrics = self._reduce(totals).metrics()
        return {
            "step": self.global_step + 1,
            "epoch": epoch,
            "loss": metrics["loss"],  # weighted CE over all micro-batches and processes of the step
            "accuracy": metrics["accuracy"],
            "acceptance_length": metrics["acceptance_length"],
            "grad_norm": float(grad_norm),
            "lr": lr,
            "gamma": gamma,
        }

    def _reduce(self, out: BlockLossOutput) -> BlockLossOutput:
        """Sums over all processes (the differentiable loss stays local)."""
        if self.accelerator.num_processes == 1:
            return out
        return BlockLossOutput(out.loss, *(self.accelerator.reduce(t, "sum") for t in out.sums()))

    def train(self) -> dict[str, Any]:
        """Train (resuming if asked), evaluate on the held-out split every epoch, save, and measure tau at the end.

        Returns the final results (also written to ``eval.json``): held-out metrics and the generate()-measured tau.
        """
        if self.resume_from is not None:
            self.load_checkpoint(self.resume_from)
        args = self.args
        progress = tqdm(total=self.total_steps, initial=self.global_step, desc="train", unit="step",
                        disable=not self.accelerator.is_local_main_process)
        heldout: dict[str, Any] = {}
        while self.epoch < args.epochs and self.global_step < self.total_steps:
            groups = self.epoch_groups(self.epoch)
            while self.groups_done < len(groups) and self.global_step < self.total_steps:
                gamma = gamma_at(args, self.epoch, self.global_step, self.total_steps)
                log = self.training_step(groups[self.groups_done], self.epoch, gamma)
                self.global_step += 1
                self.groups_done += 1
                self.history.append(log)
                progress.update(1)
                progress.set_postfix(loss=f"{log['loss']:.3f}", acc=f"{log['accuracy']:.2f}",
                                     tau=f"{log['acceptance_length']:.2f}")
                if self.global_step % args.logging_steps == 0:
                    logger.info(json.dumps(log))
                if args.save_every and self.global_step % args.save_every == 0:
                    self.save_checkpoint()
                for callback in self.callbacks:
                    callback(self, log)
            if self.groups_done >= len(groups):
                heldout = self.evaluate()
                if heldout:
                    self.history.append({"step": self.global_step, "epoch": self.epoch, "heldout": heldout})
                if heldout and self.accelerator.is_local_main_process:
                    progress.write(f"epoch {self.epoch}: held-out acceptance length {heldout['acceptance_length']:.3f},"
                                   f" accuracy {heldout['accuracy']:.3f}")
                self.epoch, self.groups_done = self.epoch + 1, 0
                self.save_checkpoint()
        progress.close()
        if self.last_saved_step != self.global_step:  # stopped by max_steps mid-epoch
            self.save_checkpoint()
        if not heldout:
            heldout = self.evaluate()
        return self.finish(heldout)

    @torch.no_grad()
    def evaluate(self) -> dict[str, Any]:
        """Per-position accuracy and expected acceptance length on the held-out split (fixed anchors)."""
        if not self.eval_samples:
            return {}
        self.model.eval()
        weights = position_weights(self.args.block_size, gamma_at(self.args, self.epoch, self.global_step,
                                                                  self.total_steps))
        totals, batches = None, shard_batches(len(self.eval_samples), self.args.batch_size,
                                              self.accelerator.num_processes, self.accelerator.process_index)
        for batch_positions in batches:
            samples = [self.eval_samples[p] for p, _ in batch_positions]
            batch = self.block_batch(samples, epoch=-1)
            batch.block_valid &= torch.tensor([c for _, c in batch_positions], device=batch.block_valid.device)[:, None]
            batch.labels[~batch.block_valid] = IGNORE_INDEX  # wrap-around repeats do not count
            totals = _add_sums(totals, self.compute_loss(batch, weights))
        self.model.train()
        return {**self._reduce(totals).metrics(), "num_samples": len(self.eval_samples)}

    # ------------------------------------------------------------------------------------------------------------------
    # checkpoints
    def save_checkpoint(self) -> Path:
        """Write `checkpoints/checkpoint-{step}` atomically: drafter (save_pretrained), optimizer, scheduler, RNG and
        data position go to a temporary folder that is renamed into place when complete."""
        accelerator, root = self.accelerator, Path(self.args.output_dir) / "checkpoints"
        final, tmp = root / f"checkpoint-{self.global_step}", root / f".tmp-checkpoint-{self.global_step}"
        if accelerator.is_main_process:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        accelerator.wait_for_everyone()
        state_dict = accelerator.get_state_dict(self.model)
        accelerator.unwrap_model(self.model).save_pretrained(
            tmp, state_dict=state_dict, is_main_process=accelerator.is_main_process, save_function=accelerator.save)
        accelerator.save_state(str(tmp / ACCELERATE_STATE_DIR))
        if accelerator.is_main_process:
            state = {"global_step": self.global_step, "epoch": self.epoch, "groups_done": self.groups_done,
                     "num_processes": accelerator.num_processes, "history": self.history}
            (tmp / TRAINER_STATE_FILE).write_text(json.dumps(state) + "\n", encoding="utf-8")
            if final.exists():  # the epoch-end save can land on the step a periodic save just wrote
                shutil.rmtree(final)
            os.replace(tmp, final)
            self._delete_old_checkpoints(root)
        self.last_saved_step = self.global_step
        accelerator.wait_for_everyone()
        return final

    def _delete_old_checkpoints(self, root: Path) -> None:
        steps = sorted(int(p.name.split("-")[1]) for p in root.glob("checkpoint-*") if p.name.split("-")[1].isdigit())
        for step in steps[: max(0, len(steps) - self.args.save_total_limit)]:
            shutil.rmtree(root / f"checkpoint-{step}", ignore_errors=True)

    def _skip_model_in_state(self, models, weights, output_dir) -> None:
        weights.clear()  # the drafter is saved by save_pretrained next to the accelerate state, not twice

    def _load_model_from_checkpoint(self, models, input_dir) -> None:
        if models:  # not sharded (FSDP loads its own): read the save_pretrained weights of this checkpoint
            from safetensors.torch import load_file

            folder = Path(input_dir).parent
            index = folder / "model.safetensors.index.json"
            files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists() else [
                "model.safetensors"]
            state = {}
            for name in files:
                state.update(load_file(folder / name))
            self.accelerator.unwrap_model(models[0]).load_state_dict(state, strict=True)
            models.clear()

    def load_checkpoint(self, checkpoint: str | os.PathLike) -> None:
        """Restore weights, optimizer, scheduler, RNG and the data position from a checkpoint folder."""
        checkpoint = Path(checkpoint)
        state = json.loads((checkpoint / TRAINER_STATE_FILE).read_text(encoding="utf-8"))
        if state["num_processes"] != self.accelerator.num_processes:
            logger.warning(f"Resuming a run made with {state['num_processes']} processes on "
                           f"{self.accelerator.num_processes}: data order differs from the uninterrupted run.")
        self.accelerator.load_state(str(checkpoint / ACCELERATE_STATE_DIR))
        self.global_step, self.epoch, self.groups_done = state["global_step"], state["epoch"], state["groups_done"]
        self.history = state["history"]
        self.last_saved_step = self.global_step
        logger.info(f"Resumed from {checkpoint} at step {self.global_step} (epoch {self.epoch}).")

    # ------------------------------------------------------------------------------------------------------------------
    # the end: final tau, export, upload
    def eval_prompt_ids(self) -> list[list[int]]:
        """Prompts for the generate()-measured tau: --eval-prompts, else the held-out samples' prompts."""
        count = self.args.num_eval_prompts
        if count <= 0:
            return []
        if self.args.eval_prompts:
            prompts = load_prompts(self.args.eval_prompts, count)
            texts = [prompt_text(self.tokenizer, p) for _, p in prompts]
            return [prompt_token_ids(self.tokenizer, t) for t in texts]
        ids = []
        for sample in self.eval_samples[:count]:
            start = int(sample["loss_mask"].long().argmax())  # first response token
            ids.append(sample["input_ids"][:start].tolist())
        return [i for i in ids if i]

    def export_drafter(self, state_dict: dict[str, torch.Tensor]) -> DFlashDraftModel:
        """A drafter ready for inference from the full (gathered) weights: the target's dtype and device, sdpa
        attention, eval mode. Built afresh because a sharded (FSDP) model cannot simply be copied."""
        drafter = DFlashDraftModel(copy.deepcopy(self.model_config))
        drafter.load_state_dict(state_dict, strict=True)
        drafter.config._attn_implementation = "sdpa"  # training may have used flex masks; inference passes none
        device = self.target.get_input_embeddings().weight.device
        return drafter.to(device=device, dtype=self.target.dtype).eval()

    def finish(self, heldout: dict[str, Any]) -> dict[str, Any]:
        """Measure tau with real generate(), write the drafter + training_info.json + eval.json atomically."""
        accelerator = self.accelerator
        state_dict = accelerator.get_state_dict(self.model)  # a collective under FSDP: every process calls it
        results: dict[str, Any] = {"heldout": heldout, "steps": self.global_step}
        if not accelerator.is_main_process:
            accelerator.wait_for_everyone()
            return results
        drafter = self.export_drafter(state_dict)
        prompts = self.eval_prompt_ids()
        if prompts:
            results["generate"] = measure_acceptance_length(self.target, drafter, prompts,
                                                            self.args.eval_max_new_tokens)
            results["tau"] = results["generate"]["tau"]
            logger.info(f"Measured acceptance length tau = {results['tau']:.3f} over {len(prompts)} prompts.")
        drafter.training_info = {
            "target": target_display_name(self.args.target),
            "dataset": self.args.data,
            "init_drafter": self.args.init_drafter,
            "num_samples": len(self.train_samples),
            "epochs": self.args.epochs,
            "steps": self.global_step,
            "block_size": self.args.block_size,
            "num_layers": self.args.num_layers,
            "learning_rate": self.args.lr,
            "max_length": self.args.max_length,
            "tau": results.get("tau"),
            "heldout_acceptance_length": heldout.get("acceptance_length"),
            "heldout_accuracy": heldout.get("accuracy"),
        }
        if self.args.push_to_hub:
            drafter.training_info["repo_id"] = self.args.push_to_hub
        # the model card's usage snippets name the Hub repo, else the output folder (not the temporary one written)
        drafter.hub_repo_id = self.args.push_to_hub or Path(self.args.output_dir).resolve().name

        def write(folder: Path) -> None:
            drafter.save_pretrained(folder)
            (folder / "training_info.json").write_text(json.dumps(drafter.training_info, indent=2) + "\n")
            (folder / "eval.json").write_text(json.dumps(results, indent=2) + "\n")

        write_folder_atomically(Path(self.args.output_dir), write)
        if self.args.push_to_hub:
            push_folder_to_hub(self.args.output_dir, self.args.push_to_hub)
        accelerator.wait_for_everyone()
        return results


def _add_sums(total: BlockLossOutput | None, out: BlockLossOutput) -> BlockLossOutput:
    """Accumulate the metric sums of micro-batches (the loss field keeps the last one's, detached)."""
    if total is None:
        return BlockLossOutput(out.loss.detach(), *out.sums())
    return BlockLossOutput(out.loss.detach(), *(a + b for a, b in zip(total.sums(), out.sums())))


def write_folder_atomically(folder: Path, write: Callable[[Path], Any]) -> None:
    """Let `write(tmp)` fill a temporary folder beside `folder`, then move each file in with os.replace, so readers
    never see a half-written file (the folder also holds checkpoints, so it cannot be swapped whole)."""
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / ".tmp-export"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    write(tmp)
    for path in sorted(tmp.rglob("*")):
        if path.is_file():
            destination = folder / path.relative_to(tmp)
            destination.parent.mkdir(parents=True, exist_ok=True)
            os.replace(path, destination)
    shutil.rmtree(tmp, ignore_errors=True)


def push_folder_to_hub(folder: str, repo_id: str) -> None:
    """Upload the final drafter (not the checkpoints) to the Hub."""
    from huggingface_hub import HfApi

    api = HfApi()
    api.create_repo(repo_id, exist_ok=True)
    api.upload_folder(repo_id=repo_id, folder_path=folder,
                      ignore_patterns=["checkpoints/*", ".tmp-*", RUN_ARGS_FILE])
    logger.info(f"Uploaded {folder} to https://huggingface.co/{repo_id}")


def train(args: DFlashTrainingArguments, **kwargs) -> dict[str, Any]:
    """Train a drafter: ``DFlashTrainer(args, **kwargs).train()``.

    Example:
        >>> train(DFlashTrainingArguments(target="t", data="train.jsonl", output_dir="out"))  # doctest: +SKIP
    """
    return DFlashTrainer(args, **kwargs).train()


# ----------------------------------------------------------------------------------------------------------------------
# command line
def add_parser(subparsers) -> None:
    """Register `hf-dflash train`."""
    add_dataclass_command(
        subparsers, "train", DFlashTrainingArguments,
        lambda args: {k: v for k, v in train(args).items() if k != "generate"},
        help="Train a DFlash drafter on regenerated data (runs under `accelerate launch` on N GPUs).",
        description="Train a DFlash drafter against its frozen target. N GPUs: accelerate launch -m hf_dflash train.",
    )
