# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""The end of a run: the drafter for inference, its tau measured with real generate(), the final drafter folder
(weights and model card, training_info.json, eval.json, learning curves) written atomically, and its upload to the
Hub."""

from __future__ import annotations

import copy
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers.utils import logging

from ..data import load_prompts, prompt_text, prompt_token_ids
from ..evaluation.acceptance import measure_acceptance_length
from ..hub_dflash import VARIANTS
from ..modeling_dflash import DFlashDraftModel
from ..models import target_display_name
from .arguments import RUN_ARGS_FILE, DFlashTrainingArguments
from .curves import CURVES_FILE, LOG_FILE, plot_training_curves, read_log

logger = logging.get_logger(__name__)


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


def inference_drafter(config, state_dict: dict[str, torch.Tensor], target,
                      draft_vocab: torch.Tensor | None = None) -> DFlashDraftModel:
    """A drafter ready for inference from the full (gathered) weights: the target's dtype and device, sdpa
    attention, eval mode, restricted to `draft_vocab` when given (with the target's LM head rows for those tokens as
    its draft head: the layout vLLM serves). Built afresh because a sharded (FSDP) model cannot simply be copied."""
    drafter_class = VARIANTS.get((config.architectures or [""])[0], DFlashDraftModel)  # DFlash2 by its architecture
    drafter = drafter_class(copy.deepcopy(config))
    drafter.load_state_dict(state_dict, strict=True)
    drafter.config._attn_implementation = "sdpa"  # training may have used flex masks; inference passes none
    if draft_vocab is not None:
        drafter.set_draft_vocabulary(draft_vocab, lm_head=target.get_output_embeddings())
    device = target.get_input_embeddings().weight.device
    return drafter.to(device=device, dtype=target.dtype).eval()


def tau_prompt_ids(args: DFlashTrainingArguments, tokenizer, eval_samples: list[dict]) -> list[list[int]]:
    """Prompts for the generate()-measured tau: --eval-prompts, else the held-out samples' prompts (their tokens
    before the first response token)."""
    count = args.num_eval_prompts
    if count <= 0:
        return []
    if args.eval_prompts:
        prompts = load_prompts(args.eval_prompts, count)
        texts = [prompt_text(tokenizer, p) for _, p in prompts]
        return [prompt_token_ids(tokenizer, t) for t in texts]
    ids = []
    for sample in eval_samples[:count]:
        start = int(sample["loss_mask"].long().argmax())  # first response token
        ids.append(sample["input_ids"][:start].tolist())
    return [i for i in ids if i]


def measured_tau(target, drafter: DFlashDraftModel, prompts: list[list[int]], max_new_tokens: int) -> dict[str, Any]:
    """``{"generate": acceptance statistics, "tau": mean acceptance length}`` of real generate() over `prompts`, or
    ``{}`` without prompts."""
    if not prompts:
        return {}
    measured = measure_acceptance_length(target, drafter, prompts, max_new_tokens)
    logger.info(f"Measured acceptance length tau = {measured['tau']:.3f} over {len(prompts)} prompts.")
    return {"generate": measured, "tau": measured["tau"]}


def tau_measured_on(generate: dict[str, Any] | None, prompts: str = "held-out prompts") -> str | None:
    """What the trainer's tau was measured on, for training_info.json and the model card.

    >>> tau_measured_on({"num_prompts": 8, "max_new_tokens": 96})
    '8 held-out prompts, 96 new tokens, greedy, full blocks'
    """
    if not generate:
        return None
    return f"{generate['num_prompts']} {prompts}, {generate['max_new_tokens']} new tokens, greedy, full blocks"


def recipe_options(args: DFlashTrainingArguments) -> dict[str, Any]:
    """The issue-13 recipe options this run changed from their defaults (recorded in training_info.json).

    >>> recipe_options(DFlashTrainingArguments("t", "d", "o", distill_weight=0.5))
    {'distill_weight': 0.5}
    """
    names = ("distill_weight", "distill_top_k", "acceptance_loss_weight", "position_weighting",
             "position_weight_floor", "train_vocab_size", "train_vocab_sampled", "init_from_target",
             "draft_vocab_size")
    defaults = DFlashTrainingArguments("t", "d", "o")
    return {n: getattr(args, n) for n in names if getattr(args, n) != getattr(defaults, n)}


def training_info(args: DFlashTrainingArguments, num_samples: int, results: dict[str, Any]) -> dict[str, Any]:
    """What training_info.json (and the model card) say about the run, from its arguments and final `results`."""
    heldout = results["heldout"]
    info = {
        "target": args.target_hub_id or target_display_name(args.target),  # the config's name (save_pretrained)
        "dataset": args.data,
        "init_drafter": args.init_drafter,
        "num_samples": num_samples,
        "epochs": results.get("epochs", args.epochs),  # trained, not asked for (--epochs is an upper bound)
        "steps": results["steps"],
        "block_size": args.block_size,
        "num_layers": args.num_layers,
        "learning_rate": args.lr,
        "max_length": args.max_length,
        "tau": results.get("tau"),
        "tau_measured_on": tau_measured_on(results.get("generate"),
                                           "prompts of --eval-prompts" if args.eval_prompts else "held-out prompts"),
        "heldout_acceptance_length": heldout.get("acceptance_length"),
        "heldout_accuracy": heldout.get("accuracy"),
    }
    recipe = recipe_options(args)
    if recipe:
        info["recipe"] = recipe
    if args.push_to_hub:
        info["repo_id"] = args.push_to_hub
    return info


def write_final_drafter(args: DFlashTrainingArguments, drafter: DFlashDraftModel, results: dict[str, Any],
                        num_samples: int) -> None:
    """Write the final drafter into --output (weights and model card, training_info.json, eval.json = `results`, the
    learning curves) atomically, then upload it to --push-to-hub if asked."""
    drafter.training_info = training_info(args, num_samples, results)
    # the model card's usage snippets name the Hub repo, else the output folder (not the temporary one written)
    drafter.hub_repo_id = args.push_to_hub or Path(args.output_dir).resolve().name

    def write(folder: Path) -> None:
        drafter.save_pretrained(folder)
        (folder / "training_info.json").write_text(json.dumps(drafter.training_info, indent=2) + "\n")
        (folder / "eval.json").write_text(json.dumps(results, indent=2) + "\n")
        log = Path(args.output_dir) / LOG_FILE
        if log.exists() and plot_training_curves(read_log(log), folder / CURVES_FILE):
            logger.info(f"Learning curves: {Path(args.output_dir) / CURVES_FILE}")

    write_folder_atomically(Path(args.output_dir), write)
    if args.push_to_hub:
        push_folder_to_hub(args.output_dir, args.push_to_hub)


def write_weights_in_dtype(source: str | os.PathLike, destination: str | os.PathLike,
                           dtype: torch.dtype = torch.bfloat16) -> Path:
    """Copy a drafter's ``config.json`` and ``model.safetensors`` from `source` into `destination` with its floating
    weights cast to `dtype` (integer buffers such as a draft vocabulary's ``d2t`` kept), each file written atomically.
    Published drafters are stored in bf16: half the download, and a float32 target upcasts them at load without loss.

    Example:
        >>> write_weights_in_dtype("runs/final", "hf_dflash/assets/smollm2-dflash")  # doctest: +SKIP
        PosixPath('hf_dflash/assets/smollm2-dflash')
    """
    from safetensors import safe_open
    from safetensors.torch import save_file

    source, destination = Path(source), Path(destination)
    weights = {}
    with safe_open(source / "model.safetensors", framework="pt") as f:
        metadata = f.metadata()
        for name in f.keys():
            tensor = f.get_tensor(name)
            weights[name] = tensor.to(dtype) if tensor.is_floating_point() else tensor
    config = json.loads((source / "config.json").read_text())
    config["dtype"] = str(dtype).removeprefix("torch.")

    def write(folder: Path) -> None:
        save_file(weights, folder / "model.safetensors", metadata=metadata)
        (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")

    write_folder_atomically(destination, write)
    return destination
