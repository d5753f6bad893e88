# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""What a training run is: :class:`DFlashTrainingArguments` (the ``hf-dflash train`` flags), the checks that run
before anything is loaded, and the output folder's identity (a resumed run must be the same run).
"""

from __future__ import annotations

import json
import os
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from transformers.utils import logging

from ..checkpoint_dflash import hub_id_of

logger = logging.get_logger(__name__)

GAMMA_SCHEDULES = ("constant", "per-epoch", "linear")


VARIANTS = ("dflash", "dflare", "dflash2")


POSITION_WEIGHTINGS = ("fixed", "acceptance")


RUN_ARGS_FILE = "run_args.json"


TRAINER_STATE_FILE = "trainer_state.json"


ACCELERATE_STATE_DIR = "training_state"


# What a run saved before a field existed ran with, where that is not the field's default today.
DEFAULTS_BEFORE = {"position_weighting": "fixed"}


# Fields that do not change the optimisation trajectory: they may differ when a run is resumed.
NON_DEFINING_FIELDS = frozenset({
    "output_dir", "resume", "save_every", "save_total_limit", "eval_prompts", "num_eval_prompts",
    "eval_max_new_tokens", "feature_cache", "attn_implementation", "logging_steps", "push_to_hub",
    "max_eval_samples", "target_device_map", "eval_every", "max_cpu_seconds", "stop_at_step", "draft_vocab_size",
    "target_hub_id",
})


def _layer_ids(text: str) -> list[int]:
    return [int(x) for x in text.replace(" ", "").split(",") if x]


@dataclass
class DFlashTrainingArguments:
    """Arguments of :class:`DFlashTrainer` (the `hf-dflash train` command). Defaults follow the paper's recipe, except
    the position weighting: measured weights (``position_weighting="acceptance"``, D-PACE-like) led fixed weights at
    every point of a 20-CPU-minute comparison (docs/benchmarks/history/2026-12-01-recipe-options.md)."""

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
        "help": "dflash, or dflare: layer-wise feature fusion + split context K/V + progressive gamma, or dflash2: "
                "dynamic convolutions + a candidate selector trained on the true path (training/loss.py).",
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
    grow_layers: bool = field(default=False, metadata={
        "help": "With --init-drafter of fewer layers than --num-layers: keep its layers (and target layer ids) and "
                "add the rest as copies of its last layer whose output projections start at zero, so the grown "
                "drafter drafts exactly as the one it grew from until training moves them."})
    seed: int = field(default=0, metadata={"help": "Seed of init, shuffling, anchors and the held-out split."})
    max_steps: int | None = field(default=None, metadata={"help": "Stop after this many optimizer steps."})
    eval_split: float = field(default=0.05, metadata={"help": "Held-out share of the data (0 = none)."})
    max_eval_samples: int = field(default=256, metadata={"help": "Cap on held-out samples."})
    eval_data: str | None = field(default=None, metadata={
        "help": "Take the held-out split from this file instead (the split --eval-split/--seed give a run on it, so "
                "runs on different --data share one held-out set); all of --data trains, less any held-out sample."})
    max_train_samples: int = field(default=0, metadata={
        "help": "Train on the first N samples left after the held-out split only (data-scaling comparisons at the "
                "same held-out set); 0 = all."})
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
    eval_every: int = field(default=0, metadata={
        "help": "Held-out evaluation every N optimizer steps (and at step 0) besides each epoch end, appended to "
                "training_log.jsonl with training seconds and processed tokens/blocks (0 = epoch ends only)."})
    max_cpu_seconds: float | None = field(default=None, metadata={
        "help": "Stop after this many CPU seconds of training steps (process CPU time of all processes together, "
                "evaluation excluded; equal-compute comparisons). The learning-rate schedule still follows --epochs / "
                "--max-steps."})
    stop_at_step: int | None = field(default=None, metadata={
        "help": "Stop after this many optimizer steps, the learning-rate schedule still that of --epochs / "
                "--max-steps: one stage of a longer schedule, or the rebuild of a run a CPU budget stopped there."})
    # recipe options beyond the paper; the defaults keep the paper's recipe except position_weighting (measured best)
    distill_weight: float = field(default=0.0, metadata={
        "help": "Share a of distillation from the frozen target's next-token distribution at each label position: "
                "per-token loss (1-a) CE(label) + a KL(target || drafter); 0 = hard labels only."})
    distill_top_k: int = field(default=0, metadata={
        "help": "Distil the target's top-k tokens only (renormalised); 0 = its full distribution. Target logits come "
                "from its final hidden states (cached with --feature-cache)."})
    acceptance_loss_weight: float = field(default=0.0, metadata={
        "help": "Share l of the acceptance-aware (LK-style) loss -log(1 + sum_k prod_{j<=k} p_j(label)) per block "
                "(the expected accepted drafts): loss = (1-l) position-weighted loss + l acceptance loss; 0 = off."})
    position_weighting: str = field(default="acceptance", metadata={
        "help": "acceptance (default): w_k = running rate at which training drafts reach position k (all earlier "
                "positions right), starting from the fixed weights (D-PACE-like); fixed: the paper's "
                "w_k = exp(-(k-1)/gamma).",
        "choices": POSITION_WEIGHTINGS})
    position_weight_floor: float = field(default=0.02, metadata={
        "help": "Smallest weight of a position under --position-weighting acceptance."})
    train_vocab_size: int = field(default=0, metadata={
        "help": "Training-time LM head restricted to the N most frequent response tokens of the training data plus "
                "each batch's labels (cuts the head's cost; held-out metrics use the full head); 0 = full vocabulary."})
    train_vocab_sampled: int = field(default=0, metadata={
        "help": "With --train-vocab-size: also S tokens drawn each step from the rest of the vocabulary (sampled "
                "softmax; their logits get + log((V - N) / S), so the rare tokens' mass is estimated and pushed "
                "down too); 0 = none."})
    draft_vocab_size: int = field(default=0, metadata={
        "help": "The exported drafter drafts among the N most frequent response tokens of the training data only "
                "(a d2t draft vocabulary: a smaller LM head at inference, lossless); 0 = the whole vocabulary."})
    init_from_target: bool = field(default=False, metadata={
        "help": "Initialise the drafter layers and final norm from the target's last layers where names and shapes "
                "match (instead of random)."})
    push_to_hub: str | None = field(default=None, metadata={"help": "Hub repo id to upload the final drafter to."})
    target_hub_id: str | None = field(default=None, metadata={
        "help": "The target's Hub id (org/name), named in the drafter's config and model card when --target is a "
                "local folder (default: --target when it is a Hub id; HuggingFaceTB/SmolLM2-135M-Instruct for "
                "smollm2). Config files never name a local folder."})

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
        for key in ("target", "data", "eval_data"):
            value = fingerprint[key]
            fingerprint[key] = os.path.abspath(value) if value is not None and os.path.exists(value) else value
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
    for name in ("distill_weight", "acceptance_loss_weight"):
        if not 0 <= getattr(args, name) <= 1:
            raise ValueError(f"{name}={getattr(args, name)} must be in [0, 1] (a share of the loss).")
    for name in ("distill_top_k", "train_vocab_size", "train_vocab_sampled", "eval_every", "draft_vocab_size",
                 "max_train_samples"):
        if getattr(args, name) < 0:
            raise ValueError(f"{name}={getattr(args, name)} must be >= 0 (0 = off).")
    if args.position_weighting not in POSITION_WEIGHTINGS:
        raise ValueError(f"position_weighting={args.position_weighting!r}; choose one of {POSITION_WEIGHTINGS}.")
    if not 0 < args.position_weight_floor <= 1:
        raise ValueError(f"position_weight_floor={args.position_weight_floor} must be in (0, 1].")
    if args.train_vocab_sampled and not args.train_vocab_size:
        raise ValueError("--train-vocab-sampled samples the tokens outside --train-vocab-size: set that too.")
    if args.distill_top_k and not args.distill_weight:
        logger.warning("--distill-top-k has no effect without --distill-weight > 0.")
    if args.init_from_target and args.init_drafter:
        raise ValueError("--init-from-target and --init-drafter both set the drafter's initial weights: pass one.")
    if args.grow_layers and not args.init_drafter:
        raise ValueError("--grow-layers grows the drafter given by --init-drafter: pass --init-drafter too.")
    for name in ("data", "eval_data"):
        path = getattr(args, name)
        if path is not None and not Path(path).exists():
            raise ValueError(f"--{name.replace('_', '-')} {path!r} does not exist.")
    if args.target_hub_id and hub_id_of(args.target_hub_id) != args.target_hub_id:
        raise ValueError(f"--target-hub-id {args.target_hub_id!r} is not a Hub id: pass the target's repository "
                         "on the Hub, e.g. --target-hub-id Qwen/Qwen3-8B.")
    if args.stop_at_step is not None and args.stop_at_step < 1:
        raise ValueError(f"--stop-at-step {args.stop_at_step} must be >= 1 (optimizer steps).")
    if args.eval_data and not args.eval_split:
        raise ValueError(f"--eval-data {args.eval_data!r} needs --eval-split > 0 (the share of it held out).")


def write_run_arguments(args: DFlashTrainingArguments) -> None:
    """Record the run's fingerprint in ``run_args.json`` of its output folder: what :func:`check_output_dir` compares
    a later run (and a --resume) in that folder against."""
    Path(args.output_dir).mkdir(parents=True, exist_ok=True)
    (Path(args.output_dir) / RUN_ARGS_FILE).write_text(json.dumps(args.run_fingerprint(), indent=2) + "\n",
                                                       encoding="utf-8")


def check_output_dir(args: DFlashTrainingArguments) -> Path | None:
    """The checkpoint to resume from (None: start fresh). Raises if the folder holds a different run, or a run that
    would be overwritten without --resume."""
    output = Path(args.output_dir)
    saved_file = output / RUN_ARGS_FILE
    checkpoint = last_checkpoint(output)
    if saved_file.exists():
        saved = json.loads(saved_file.read_text(encoding="utf-8"))
        current = json.loads(json.dumps(args.run_fingerprint()))  # same JSON types as the saved copy
        # a field added after the run started (e.g. a new recipe option) matches when it keeps the value that run had
        defaults = json.loads(json.dumps({f.name: f.default for f in fields(DFlashTrainingArguments)
                                          if f.default is not MISSING} | DEFAULTS_BEFORE))
        pairs = {k: (saved.get(k, defaults.get(k)), current.get(k)) for k in sorted(set(saved) | set(current))}
        differ = {k: (was, now) for k, (was, now) in pairs.items() if was != now}
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
