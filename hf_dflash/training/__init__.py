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

Layout: :mod:`~hf_dflash.training.arguments` (what a run is), :mod:`~hf_dflash.training.recipe` (gamma, anchors,
blocks, data order), :mod:`~hf_dflash.training.loss` (block mask and weighted loss),
:mod:`~hf_dflash.training.samples` (train / held-out samples), :mod:`~hf_dflash.training.features` (target
features, cached on disk), :mod:`~hf_dflash.training.build` (target, drafter, optimizer and schedule),
:mod:`~hf_dflash.training.trainer` (the loop: training step, evaluation, resume),
:mod:`~hf_dflash.training.checkpoints` (checkpoint files), :mod:`~hf_dflash.training.curves` (training_log.jsonl
and the learning-curve PNG), :mod:`~hf_dflash.training.export` (tau, the final drafter folder, Hub upload).

Recipe options beyond the paper (each off by default): distillation from the target's distribution
(``distill_weight``, ``distill_top_k``), an acceptance-aware loss (``acceptance_loss_weight``), position weights
that follow the measured acceptance (``position_weighting="acceptance"``), a training-time vocabulary
(``train_vocab_size``, ``train_vocab_sampled``) and initialisation from the target's last layers (``init_from_target``).

Example:
    >>> from hf_dflash.training import DFlashTrainingArguments, DFlashTrainer
    >>> args = DFlashTrainingArguments(target="Qwen/Qwen3-8B", data="train.jsonl", output_dir="qwen3-8b-dflash",
    ...                                num_layers=5, block_size=16, epochs=6)
    >>> DFlashTrainer(args).train()  # doctest: +SKIP
"""

from .arguments import (
    DFlashTrainingArguments,
    check_output_dir,
    last_checkpoint,
    validate_arguments,
)
from .curves import CURVES_FILE, LOG_FILE, TrainingLog, plot_training_curves, read_log
from .features import FeatureCache, context_features, target_outputs
from .loss import (
    BlockLossOutput,
    Objective,
    block_diffusion_loss,
    block_mask_mod,
    dense_block_mask,
    flex_block_mask,
)
from .recipe import (
    IGNORE_INDEX,
    BlockBatch,
    batch_vocabulary,
    default_gamma,
    dynamic_position_weights,
    epoch_order,
    frequent_tokens,
    gamma_at,
    make_block_batch,
    position_weights,
    sample_anchors,
    sampled_tokens,
    shard_batches,
    split_heldout,
    training_vocabulary,
)
from .build import initial_drafter_weights, initial_weights_from_target
from .trainer import DFlashTrainer, train

__all__ = [
    "CURVES_FILE",
    "IGNORE_INDEX",
    "LOG_FILE",
    "BlockBatch",
    "BlockLossOutput",
    "DFlashTrainer",
    "DFlashTrainingArguments",
    "FeatureCache",
    "Objective",
    "TrainingLog",
    "batch_vocabulary",
    "block_diffusion_loss",
    "block_mask_mod",
    "check_output_dir",
    "context_features",
    "default_gamma",
    "dense_block_mask",
    "dynamic_position_weights",
    "epoch_order",
    "flex_block_mask",
    "frequent_tokens",
    "gamma_at",
    "initial_drafter_weights",
    "initial_weights_from_target",
    "last_checkpoint",
    "make_block_batch",
    "plot_training_curves",
    "position_weights",
    "read_log",
    "sample_anchors",
    "sampled_tokens",
    "shard_batches",
    "split_heldout",
    "target_outputs",
    "train",
    "training_vocabulary",
    "validate_arguments",
]
