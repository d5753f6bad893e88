# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""What a run trains with: the frozen target, the drafter (fresh, from another drafter's weights or from the target's
last layers), the objective, and the AdamW optimizer with its cosine schedule, placed by accelerate."""

from __future__ import annotations

import math

import torch
from transformers import get_cosine_schedule_with_warmup
from transformers.utils import logging

from ..configuration_dflash import DFlashConfig
from ..modeling_dflash import DFlashDraftModel
from ..modeling_dflash2 import DFlash2DraftModel
from ..models import load_target
from .arguments import DFlashTrainingArguments
from .loss import Objective
from .recipe import shard_batches

logger = logging.get_logger(__name__)

INIT_DRAFTER_FIELDS = ("num_hidden_layers", "block_size", "target_layer_ids", "mask_token_id", "layer_fusion",
                       "split_context_kv", "hidden_size", "vocab_size")
# A saved draft vocabulary (EAGLE-3 layout: d2t and the target's LM-head rows for those tokens) is an export-time view
# of the target's head: training scores with the target's own head, and --draft-vocab-size rebuilds it at export.
DRAFT_VOCABULARY_KEYS = ("d2t", "lm_head.weight")


def initial_drafter_weights(fresh: DFlashDraftModel, init_drafter: str, grow_layers: bool = False) -> DFlashDraftModel:
    """`fresh` (built from the training arguments) with the weights of the drafter at `init_drafter`.

    With `grow_layers`, a drafter of fewer layers fills the first ones and every added layer starts as a copy of its
    last layer with the output projections (``o_proj``, ``down_proj``) at zero: each added layer then adds nothing to
    the residual stream, so the grown drafter drafts exactly as the one it grew from until training moves them.
    Raises a ValueError naming each architecture field that differs (e.g. --num-layers 5 for a 1-layer drafter), so
    a run never silently trains something other than what its arguments say.
    """
    loaded = DFlashDraftModel.from_pretrained(init_drafter, dtype=torch.float32)
    have, want = loaded.config.num_hidden_layers, fresh.config.num_hidden_layers
    if grow_layers and have >= want:
        raise ValueError(f"--grow-layers: the drafter at {init_drafter} has {have} layers and --num-layers is "
                         f"{want}: pass --num-layers above {have}, or drop --grow-layers.")
    fields = [name for name in INIT_DRAFTER_FIELDS if not (grow_layers and name == "num_hidden_layers")]
    differ = {name: (getattr(loaded.config, name), getattr(fresh.config, name)) for name in fields
              if getattr(loaded.config, name) != getattr(fresh.config, name)}
    if differ:
        listed = ", ".join(f"{name}: {a!r} there vs {b!r} here" for name, (a, b) in differ.items())
        raise ValueError(f"--init-drafter {init_drafter} does not match the training arguments ({listed}). Pass the "
                         "drafter's own values (--num-layers, --block-size, --target-layer-ids, --mask-token-id, the "
                         "DFlare switches), or drop --init-drafter to train from scratch.")
    wanted, saved = fresh.state_dict(), loaded.state_dict()
    weights = {name: tensor for name, tensor in saved.items() if name in wanted or name not in DRAFT_VOCABULARY_KEYS}
    if grow_layers:
        weights.update(added_layer_weights(weights, wanted, have, want))
    fresh.load_state_dict(weights, strict=True)
    logger.info(f"Drafter weights initialised from {init_drafter}"
                + (f" ({have} layer(s) grown to {want})" if grow_layers else "")
                + (" (its draft vocabulary left out: --draft-vocab-size sets the exported one)."
                   if len(weights) < len(saved) else "."))
    return fresh


def added_layer_weights(saved: dict, wanted: dict, num_saved: int, num_wanted: int) -> dict:
    """The weights of layers num_saved..num_wanted-1 of a grown drafter: copies of saved layer num_saved-1 whose
    output projections are zero, and DFlare's layer-fusion rows for them as `wanted` (the fresh init) has them."""
    last = f"layers.{num_saved - 1}."
    added = {}
    for layer in range(num_saved, num_wanted):
        for name, tensor in saved.items():
            if name.startswith(last):
                copy = tensor.clone()
                if name.endswith(("o_proj.weight", "o_proj.bias", "down_proj.weight", "down_proj.bias")):
                    copy.zero_()
                added[f"layers.{layer}." + name[len(last):]] = copy
    if "layer_fusion_weights" in saved:
        added["layer_fusion_weights"] = torch.cat([saved["layer_fusion_weights"],
                                                   wanted["layer_fusion_weights"][num_saved:]])
    return added


def initial_weights_from_target(drafter: DFlashDraftModel, target) -> list[str]:
    """Copy the target's last decoder layers into the drafter's layers (drafter layer i <- target layer
    n - L + i) and its final norm into the drafter's, wherever a parameter's name and shape match; DFlare's separate
    context projections (``k_proj_target`` / ``v_proj_target``) start from the same layer's ``k_proj`` / ``v_proj``.
    Returns the drafter parameter names that were copied (the rest keep their random init)."""
    decoder = target.get_decoder()
    target_layers = list(decoder.layers)
    drafter_layers = list(drafter.layers)
    offset = len(target_layers) - len(drafter_layers)
    copied = []
    with torch.no_grad():
        pairs = [(f"layers.{i}.", layer, target_layers[max(0, offset + i)]) for i, layer in enumerate(drafter_layers)]
        pairs.append(("norm.", drafter.norm, getattr(decoder, "norm", None)))
        for prefix, mine, theirs in pairs:
            if theirs is None:
                continue
            source = dict(theirs.named_parameters())
            for name, param in mine.named_parameters():
                origin = name.replace("k_proj_target", "k_proj").replace("v_proj_target", "v_proj")
                if origin in source and source[origin].shape == param.shape:
                    param.copy_(source[origin].to(param.dtype))
                    copied.append(prefix + name)
    if not copied:
        logger.warning("--init-from-target: no drafter parameter matches the target's layers in name and shape; the "
                       "drafter keeps its random initialisation.")
    else:
        logger.info(f"Drafter initialised from the target's last {len(drafter_layers)} layer(s): "
                    f"{len(copied)} tensors.")
    return copied


def mixed_precision_mode(setting: str) -> str:
    """accelerate's mixed-precision mode for --mixed-precision: "auto" is bf16 where the GPU has it, else none.

    >>> mixed_precision_mode("fp16")
    'fp16'
    """
    if setting != "auto":
        return setting
    return "bf16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "no"


def frozen_target(args: DFlashTrainingArguments, device: torch.device, target=None, tokenizer=None) -> tuple:
    """(target, tokenizer): the ones given (both, else --target is loaded onto `device`), the target in eval mode
    without gradients: only the drafter trains."""
    if target is None or tokenizer is None:
        target, tokenizer = load_target(args.target, args.target_dtype, device=device,
                                        device_map=args.target_device_map)
    return target.eval().requires_grad_(False), tokenizer


def drafter_to_train(args: DFlashTrainingArguments, target, attn_implementation: str,
                     device: torch.device) -> DFlashDraftModel:
    """The drafter the arguments describe for `target` (its random init drawn from the global RNG, so seed first),
    with the --init-drafter / --init-from-target weights, in fp32 on `device` in train mode.

    Raises a ValueError for target layer ids the target does not have, or an --init-drafter of another architecture.
    """
    drafter_class = DFlash2DraftModel if args.variant == "dflash2" else DFlashDraftModel
    layer_ids = args.target_layer_ids
    if args.grow_layers and layer_ids is None:  # a grown drafter keeps the features it was trained on
        layer_ids = DFlashConfig.from_pretrained(args.init_drafter).target_layer_ids
    drafter = drafter_class.from_target(
        target, num_hidden_layers=args.num_layers, block_size=args.block_size,
        target_layer_ids=layer_ids, mask_token_id=args.mask_token_id, **args.drafter_switches,
    )
    if args.init_drafter:
        drafter = initial_drafter_weights(drafter, args.init_drafter, args.grow_layers)
    if args.init_from_target:
        initial_weights_from_target(drafter, target)
    drafter.config._attn_implementation = attn_implementation
    return drafter.to(device=device, dtype=torch.float32).train()  # fp32 master weights; autocast does bf16


def run_length(args: DFlashTrainingArguments, num_samples: int, num_processes: int) -> tuple[int, int]:
    """(optimizer steps per epoch, optimizer steps of the whole run): an epoch is each process's share of the
    micro-batches, grad_accum of them per step (the last step may have fewer); --max-steps caps the run, and with it
    the learning-rate schedule.

    >>> run_length(DFlashTrainingArguments("t", "d", "o", batch_size=2, grad_accum=2, epochs=3), 10, 1)
    (3, 9)
    >>> run_length(DFlashTrainingArguments("t", "d", "o", batch_size=2, grad_accum=2, epochs=3, max_steps=7), 10, 1)
    (3, 7)
    """
    steps_per_epoch = math.ceil(len(shard_batches(num_samples, args.batch_size, num_processes, 0)) / args.grad_accum)
    total_steps = steps_per_epoch * args.epochs
    if args.max_steps is not None:
        total_steps = min(total_steps, args.max_steps)
    return steps_per_epoch, total_steps


def prepared_optimization(accelerator, drafter: DFlashDraftModel, args: DFlashTrainingArguments,
                          total_steps: int) -> tuple:
    """(model, optimizer, scheduler): the drafter and AdamW prepared by accelerate (DDP / FSDP wrapping), and the
    cosine schedule with warmup over `total_steps`. The scheduler is deliberately not prepared: we step it once per
    optimizer step ourselves, where a prepared one steps once per process."""
    optimizer = torch.optim.AdamW(drafter.parameters(), lr=args.lr, weight_decay=args.weight_decay, betas=(0.9, 0.95))
    scheduler = get_cosine_schedule_with_warmup(optimizer, math.ceil(args.warmup_ratio * total_steps), total_steps)
    model, optimizer = accelerator.prepare(drafter, optimizer)
    return model, optimizer, scheduler


def training_objective(args: DFlashTrainingArguments, target) -> Objective:
    """The run's loss options (distillation, acceptance-aware loss), with the target's final logit soft-capping so
    that distillation sees the distribution the target really samples from."""
    softcap = getattr(target.config, "final_logit_softcapping", None)
    return Objective(args.distill_weight, args.distill_top_k, args.acceptance_loss_weight,
                     softcap if isinstance(softcap, (int, float)) else None)
