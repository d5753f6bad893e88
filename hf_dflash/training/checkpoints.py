# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""Checkpoints for an exact resume: ``checkpoints/checkpoint-{step}`` holds the drafter (save_pretrained, so any
checkpoint loads as a drafter), accelerate's state (optimizer, scheduler, RNG) and the trainer's own state (data
position, history, compute). A checkpoint is written in a temporary folder and renamed into place, so a present
checkpoint is a complete one; those beyond --save-total-limit are deleted, oldest first.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from transformers.utils import logging

from .arguments import ACCELERATE_STATE_DIR, TRAINER_STATE_FILE

logger = logging.get_logger(__name__)


def register_checkpoint_hooks(accelerator, scheduler) -> None:
    """Make accelerate's save_state / load_state carry the (unprepared) scheduler, and leave the drafter's weights
    to the save_pretrained files beside its state instead of saving them twice."""
    accelerator.register_for_checkpointing(scheduler)

    def skip_model_in_state(models, weights, output_dir) -> None:
        weights.clear()

    def load_model_from_checkpoint(models, input_dir) -> None:
        if models:  # not sharded (FSDP loads its own): read the save_pretrained weights of this checkpoint
            accelerator.unwrap_model(models[0]).load_state_dict(saved_weights(Path(input_dir).parent), strict=True)
            models.clear()

    accelerator.register_save_state_pre_hook(skip_model_in_state)
    accelerator.register_load_state_pre_hook(load_model_from_checkpoint)


def saved_weights(folder: Path) -> dict:
    """The state dict save_pretrained wrote in `folder` (one safetensors file, or the shards its index names)."""
    from safetensors.torch import load_file

    index = folder / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists() else [
        "model.safetensors"]
    state = {}
    for name in files:
        state.update(load_file(folder / name))
    return state


def write_checkpoint(accelerator, model, output_dir: str | os.PathLike, step: int,
                     trainer_state: Callable[[], dict[str, Any]], save_total_limit: int) -> Path:
    """Write ``checkpoints/checkpoint-{step}`` atomically and return its path; every process calls it (saving is a
    collective under FSDP). `trainer_state` is called on the main process once the weights and accelerate's state
    are written, so its compute counters include the save."""
    root = Path(output_dir) / "checkpoints"
    final, tmp = root / f"checkpoint-{step}", root / f".tmp-checkpoint-{step}"
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    accelerator.wait_for_everyone()
    state_dict = accelerator.get_state_dict(model)
    accelerator.unwrap_model(model).save_pretrained(
        tmp, state_dict=state_dict, is_main_process=accelerator.is_main_process, save_function=accelerator.save)
    accelerator.save_state(str(tmp / ACCELERATE_STATE_DIR))
    if accelerator.is_main_process:
        (tmp / TRAINER_STATE_FILE).write_text(json.dumps(trainer_state()) + "\n", encoding="utf-8")
        if final.exists():  # the epoch-end save can land on the step a periodic save just wrote
            shutil.rmtree(final)
        os.replace(tmp, final)
        delete_old_checkpoints(root, save_total_limit)
    accelerator.wait_for_everyone()
    return final


def delete_old_checkpoints(root: Path, keep: int) -> None:
    """Delete all but the `keep` newest ``checkpoint-{step}`` folders under `root`."""
    steps = sorted(int(p.name.split("-")[1]) for p in root.glob("checkpoint-*") if p.name.split("-")[1].isdigit())
    for step in steps[: max(0, len(steps) - keep)]:
        shutil.rmtree(root / f"checkpoint-{step}", ignore_errors=True)


def read_checkpoint(accelerator, checkpoint: Path) -> dict[str, Any]:
    """Restore the prepared drafter, optimizer, scheduler and RNG from `checkpoint`; return the trainer state saved
    with them. Resuming on another number of processes works but shards the data differently, hence the warning."""
    state = json.loads((checkpoint / TRAINER_STATE_FILE).read_text(encoding="utf-8"))
    if state["num_processes"] != accelerator.num_processes:
        logger.warning(f"Resuming a run made with {state['num_processes']} processes on "
                       f"{accelerator.num_processes}: data order differs from the uninterrupted run.")
    accelerator.load_state(str(checkpoint / ACCELERATE_STATE_DIR))
    return state
