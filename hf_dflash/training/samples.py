# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""The run's samples: --data (and --eval-data) loaded, split into training and held-out samples, capped."""

from __future__ import annotations

from ..data import load_training_samples
from .arguments import DFlashTrainingArguments
from .recipe import split_heldout


def training_and_heldout_samples(args: DFlashTrainingArguments) -> tuple[list[dict], list[dict]]:
    """(training samples, held-out samples). Held out: a seeded split of --eval-data when given (and any sample
    also in --data leaves the training side, so no held-out sequence is trained on), else of --data itself.
    Samples with fewer than two blocks of response tokens (after truncation to --max-length) are dropped."""
    samples = load_training_samples(args.data, args.max_length, 2 * args.block_size)
    if args.eval_data:
        _, heldout = split_heldout(load_training_samples(args.eval_data, args.max_length, 2 * args.block_size),
                                   args.eval_split, args.max_eval_samples, args.seed)
        heldout_ids = {tuple(s["input_ids"].tolist()) for s in heldout}
        train = [s for s in samples if tuple(s["input_ids"].tolist()) not in heldout_ids]
    else:
        train, heldout = split_heldout(samples, args.eval_split, args.max_eval_samples, args.seed)
    if args.max_train_samples:
        train = train[:args.max_train_samples]
    return train, heldout
