# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""The training loop: :class:`DFlashTrainer` (accelerate for devices and DDP, exact resume from atomic checkpoints,
held-out evaluation every epoch and every ``eval_every`` steps into ``training_log.jsonl``, the recipe options of
issue 13, generate()-measured tau, learning curves and export at the end) and :func:`train`.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm
from transformers import get_cosine_schedule_with_warmup
from transformers.utils import logging

from ..data import load_prompts, load_training_samples, prompt_text, prompt_token_ids
from ..evaluation.acceptance import measure_acceptance_length
from ..modeling_dflash import DFlashDraftModel
from ..models import load_target, pad_token_id, target_display_name
from .arguments import (
    ACCELERATE_STATE_DIR,
    RUN_ARGS_FILE,
    TRAINER_STATE_FILE,
    DFlashTrainingArguments,
    check_output_dir,
    validate_arguments,
)
from .curves import CURVES_FILE, LOG_FILE, TrainingLog, plot_training_curves, read_log
from .export import push_folder_to_hub, write_folder_atomically
from .features import FeatureCache, target_outputs
from .loss import (
    BlockLossOutput,
    Objective,
    add_sums,
    block_diffusion_loss,
    resolve_attn_implementation,
)
from .recipe import (
    IGNORE_INDEX,
    BlockBatch,
    dynamic_position_weights,
    epoch_order,
    frequent_tokens,
    gamma_at,
    initial_reach_rates,
    make_block_batch,
    position_weights,
    sample_anchors,
    sampled_tokens,
    shard_batches,
    split_heldout,
    stable_seed,
    training_vocabulary,
    update_reach_rates,
)

logger = logging.get_logger(__name__)

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
        if args.eval_data:
            _, self.eval_samples = split_heldout(load_training_samples(args.eval_data, args.max_length,
                                                                       2 * args.block_size),
                                                 args.eval_split, args.max_eval_samples, args.seed)
            heldout = {tuple(s["input_ids"].tolist()) for s in self.eval_samples}
            self.train_samples = [s for s in samples if tuple(s["input_ids"].tolist()) not in heldout]
        else:
            self.train_samples, self.eval_samples = split_heldout(samples, args.eval_split, args.max_eval_samples,
                                                                  args.seed)
        if args.max_train_samples:
            self.train_samples = self.train_samples[:args.max_train_samples]

        mixed = args.mixed_precision
        if mixed == "auto":
            mixed = "bf16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "no"
        self.accelerator = Accelerator(mixed_precision=mixed)
        device = self.accelerator.device
        if target is None or tokenizer is None:
            target, tokenizer = load_target(args.target, args.target_dtype, device=device,
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
        if args.init_from_target:
            initial_weights_from_target(drafter, target)
        self.attn_implementation = resolve_attn_implementation(args.attn_implementation, device)
        drafter.config._attn_implementation = self.attn_implementation
        drafter = drafter.to(device=device, dtype=torch.float32).train()  # fp32 master weights; autocast does bf16
        self.layer_ids = list(drafter.config.target_layer_ids)
        self.pad_token_id = pad_token_id(target, tokenizer)

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

        self.feature_cache = self.heldout_cache = None
        if args.feature_cache:
            fingerprint = {"target": args.run_fingerprint()["target"], "data": args.run_fingerprint()["data"],
                           "target_layer_ids": self.layer_ids, "max_length": args.max_length,
                           "dtype": str(target.dtype)}
            self.feature_cache = self.heldout_cache = FeatureCache(args.feature_cache, fingerprint)
            if args.eval_data:  # held-out sample indices count in the --eval-data file: a cache of their own
                self.heldout_cache = FeatureCache(Path(args.feature_cache) / "eval", {
                    **fingerprint, "data": args.run_fingerprint()["eval_data"]})

        softcap = getattr(target.config, "final_logit_softcapping", None)
        self.objective = Objective(args.distill_weight, args.distill_top_k, args.acceptance_loss_weight,
                                   softcap if isinstance(softcap, (int, float)) else None)
        self.train_vocab = (frequent_tokens(self.train_samples, args.train_vocab_size)
                            if args.train_vocab_size else None)

        self.global_step, self.epoch, self.groups_done, self.last_saved_step = 0, 0, 0, -1
        self.history: list[dict[str, Any]] = []
        self.reach_rates = initial_reach_rates(args.block_size, gamma_at(args, 0, 0, self.total_steps))
        # compute spent so far (checkpointed: a resumed run continues the counts)
        self.compute = {"train_seconds": 0.0, "train_cpu_seconds": 0.0, "elapsed_seconds": 0.0, "tokens": 0,
                        "blocks": 0}
        self.log_bytes, self.last_eval_step, self.training_log = 0, None, None
        self._started, self._elapsed_base = None, 0.0
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

    def features_for(self, batch: BlockBatch, final_hidden: bool = False, cache: FeatureCache | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(target features, the target's final hidden states or None) of a batch, from `cache` when every sample is
        in it; `final_hidden` (distillation) also reads/writes the cached final hidden states."""
        kinds = ["", "final"] if final_hidden else [""]
        if cache is not None:
            cached = {kind: [cache.get(i, kind) for i in batch.sample_indices] for kind in kinds}
            if all(c is not None for parts in cached.values() for c in parts):
                padded = []
                for parts in cached.values():
                    out = torch.zeros(len(parts), batch.context_length, parts[0].shape[-1], dtype=parts[0].dtype)
                    for row, c in enumerate(parts):
                        out[row, : c.shape[0]] = c
                    padded.append(out.to(self.accelerator.device))
                return padded[0], (padded[1] if final_hidden else None)
        device = self.target.get_input_embeddings().weight.device
        features, final = target_outputs(self.target, batch.input_ids.to(device), batch.attention_mask.to(device),
                                         self.layer_ids, final_hidden)
        if cache is not None:
            lengths = batch.attention_mask.sum(dim=1).tolist()
            for row, (index, n) in enumerate(zip(batch.sample_indices, lengths)):
                cache.put(index, features[row, :n])
                if final is not None:
                    cache.put(index, final[row, :n], "final")
        return features.to(self.accelerator.device), None if final is None else final.to(self.accelerator.device)

    def compute_loss(self, batch: BlockBatch, weights: torch.Tensor, training: bool = False,
                     negatives: torch.Tensor | None = None) -> BlockLossOutput:
        """The loss of a batch: the run's objective and training vocabulary (with sampled `negatives`) when
        `training`, else (evaluation) the plain weighted cross-entropy over the full LM head, as inference sees it."""
        objective = self.objective if training else Objective()
        features, final = self.features_for(batch, final_hidden=objective.distills,
                                            cache=self.feature_cache if training else self.heldout_cache)
        device = self.embed_tokens.weight.device
        vocab, offsets = None, None
        if training and self.train_vocab is not None:
            vocab, offsets = training_vocabulary(self.train_vocab, batch.labels, negatives,
                                                 self.lm_head.weight.shape[0])
        with self.accelerator.autocast():
            return block_diffusion_loss(self.model, self.embed_tokens, self.lm_head, features, batch.to(device),
                                        weights, self.attn_implementation, objective=objective,
                                        teacher_hidden=final, vocab_ids=vocab, vocab_offsets=offsets)

    def step_negatives(self) -> torch.Tensor | None:
        """This step's sampled-softmax negatives (--train-vocab-sampled): a function of (seed, step), as resume
        needs."""
        if self.train_vocab is None or not self.args.train_vocab_sampled:
            return None
        generator = torch.Generator().manual_seed(stable_seed(self.args.seed, self.global_step, 31))
        return sampled_tokens(self.train_vocab, self.lm_head.weight.shape[0], self.args.train_vocab_sampled,
                              generator)

    def step_weights(self, gamma: float) -> torch.Tensor:
        """Position weights of this step: exp(-(k-1)/gamma), or the running reach rates (--position-weighting
        acceptance)."""
        if self.args.position_weighting == "acceptance":
            return dynamic_position_weights(self.reach_rates, self.args.position_weight_floor)
        return position_weights(self.args.block_size, gamma)

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
        weights, negatives = self.step_weights(gamma), self.step_negatives()
        totals, tokens = None, 0
        for i, positions in enumerate(group):
            batch = self.block_batch([self.train_samples[p] for p in positions], epoch)
            tokens += int(batch.attention_mask.sum())
            last = i == len(group) - 1
            with contextlib.nullcontext() if last else self.accelerator.no_sync(self.model):
                out = self.compute_loss(batch, weights, training=True, negatives=negatives)
                self.accelerator.backward(out.loss / len(group))
            totals = add_sums(totals, out)
        grad_norm = self.accelerator.clip_grad_norm_(self.model.parameters(), self.args.max_grad_norm)
        lr = self.scheduler.get_last_lr()[0]
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        totals = self._reduce(totals)
        metrics = totals.metrics()
        if self.accelerator.num_processes > 1:
            tokens = int(self.accelerator.reduce(torch.tensor(tokens, device=self.accelerator.device), "sum"))
        self.compute["tokens"] += tokens
        self.compute["blocks"] += int(totals.num_blocks)
        log = {
            "step": self.global_step + 1,
            "epoch": epoch,
            "loss": metrics["loss"],  # weighted CE over all micro-batches and processes of the step
            "accuracy": metrics["accuracy"],
            "acceptance_length": metrics["acceptance_length"],
            "grad_norm": float(grad_norm),
            "lr": lr,
            "gamma": gamma,
        }
        if self.args.position_weighting == "acceptance":
            log["position_weights"] = weights.tolist()
            self.reach_rates = update_reach_rates(self.reach_rates, totals.reached.cpu(), totals.counted.cpu())
        return log

    def _reduce(self, out: BlockLossOutput) -> BlockLossOutput:
        """Sums over all processes (the differentiable loss stays local)."""
        if self.accelerator.num_processes == 1:
            return out
        return BlockLossOutput(out.loss, *(self.accelerator.reduce(t, "sum") for t in out.sums()))

    def train(self) -> dict[str, Any]:
        """Train (resuming if asked), evaluate on the held-out split every epoch (and every ``eval_every`` steps),
        save, and measure tau at the end.

        Returns the final results (also written to ``eval.json``): held-out metrics, the compute spent and the
        generate()-measured tau. ``training_log.jsonl`` in the output folder holds the learning curves.
        """
        if self.resume_from is not None:
            self.load_checkpoint(self.resume_from)
        args = self.args
        self.training_log = TrainingLog(Path(args.output_dir) / LOG_FILE, self.log_bytes,
                                        enabled=self.accelerator.is_main_process)
        progress = tqdm(total=self.total_steps, initial=self.global_step, desc="train", unit="step",
                        disable=not self.accelerator.is_local_main_process)
        self._started, self._elapsed_base = time.perf_counter(), self.compute["elapsed_seconds"]
        heldout: dict[str, Any] = {}
        if args.eval_every and self.global_step == 0:
            heldout = self.evaluate_and_log()  # the untrained drafter: the curve's origin
        while self.epoch < args.epochs and self.global_step < self.total_steps and not self.out_of_budget():
            groups = self.epoch_groups(self.epoch)
            while (self.groups_done < len(groups) and self.global_step < self.total_steps
                   and not self.out_of_budget()):
                gamma = gamma_at(args, self.epoch, self.global_step, self.total_steps)
                wall, cpu = time.perf_counter(), time.process_time()
                log = self.training_step(groups[self.groups_done], self.epoch, gamma)
                self.compute["train_seconds"] += time.perf_counter() - wall
                self.compute["train_cpu_seconds"] += time.process_time() - cpu
                self.global_step += 1
                self.groups_done += 1
                self.history.append(log)
                progress.update(1)
                progress.set_postfix(loss=f"{log['loss']:.3f}", acc=f"{log['accuracy']:.2f}",
                                     tau=f"{log['acceptance_length']:.2f}")
                if self.global_step % args.logging_steps == 0:
                    logger.info(json.dumps(log))
                    self.training_log.append({"kind": "train", **log, **self.compute_so_far()})
                if args.eval_every and self.global_step % args.eval_every == 0:
                    heldout = self.evaluate_and_log()
                if args.save_every and self.global_step % args.save_every == 0:
                    self.save_checkpoint()
                for callback in self.callbacks:
                    callback(self, log)
            if self.groups_done >= len(groups):
                heldout = self.evaluate_and_log()
                if heldout and self.accelerator.is_local_main_process:
                    progress.write(f"epoch {self.epoch}: held-out acceptance length {heldout['acceptance_length']:.3f},"
                                   f" accuracy {heldout['accuracy']:.3f}")
                self.epoch, self.groups_done = self.epoch + 1, 0
                self.save_checkpoint()
        progress.close()
        heldout = self.evaluate_and_log()  # stopped by max_steps / the CPU budget mid-epoch (else: reused)
        if self.last_saved_step != self.global_step:
            self.save_checkpoint()
        return self.finish(heldout)

    def out_of_budget(self) -> bool:
        """--max-cpu-seconds spent (decided on the largest count of all processes, so they stop together)."""
        budget = self.args.max_cpu_seconds
        if budget is None:
            return False
        spent = torch.tensor(self.compute["train_cpu_seconds"], device=self.accelerator.device)
        if self.accelerator.num_processes > 1:
            spent = self.accelerator.gather(spent[None]).max()
        return float(spent) >= budget

    def compute_so_far(self) -> dict[str, Any]:
        """The compute counters, with the wall time since the run started (across resumes) as elapsed_seconds."""
        if self._started is not None:
            self.compute["elapsed_seconds"] = self._elapsed_base + time.perf_counter() - self._started
        return dict(self.compute)

    def evaluate_and_log(self) -> dict[str, Any]:
        """Held-out evaluation at this step, recorded in the history and in training_log.jsonl (once per step: a
        second call at the same step returns the recorded metrics)."""
        if self.last_eval_step == self.global_step:
            recorded = [h["heldout"] for h in self.history if "heldout" in h and h["step"] == self.global_step]
            return recorded[-1] if recorded else {}
        heldout = self.evaluate()
        self.last_eval_step = self.global_step
        if heldout:
            self.history.append({"step": self.global_step, "epoch": self.epoch, "heldout": heldout})
            if self.training_log is not None:
                self.training_log.append({"kind": "eval", "step": self.global_step, "epoch": self.epoch,
                                          **self.compute_so_far(), "heldout": heldout})
        return heldout

    @torch.no_grad()
    def evaluate(self) -> dict[str, Any]:
        """Per-position accuracy and expected acceptance length on the held-out split (fixed anchors), with the full
        LM head and the plain weighted cross-entropy (at this step's gamma) whatever the training objective."""
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
            totals = add_sums(totals, self.compute_loss(batch, weights))
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
                     "num_processes": accelerator.num_processes, "history": self.history,
                     "reach_rates": self.reach_rates, "compute": self.compute_so_far(),
                     "log_bytes": self.training_log.size if self.training_log is not None else 0,
                     "last_eval_step": self.last_eval_step}
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
        self.reach_rates = state.get("reach_rates", self.reach_rates)
        self.compute.update(state.get("compute", {}))
        self.log_bytes = state.get("log_bytes", 0)
        self.last_eval_step = state.get("last_eval_step")
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

    def recipe_options(self) -> dict[str, Any]:
        """The issue-13 recipe options this run changed from their defaults (recorded in training_info.json)."""
        names = ("distill_weight", "distill_top_k", "acceptance_loss_weight", "position_weighting",
                 "position_weight_floor", "train_vocab_size", "train_vocab_sampled", "init_from_target",
                 "draft_vocab_size")
        defaults = DFlashTrainingArguments("t", "d", "o")
        return {n: getattr(self.args, n) for n in names if getattr(self.args, n) != getattr(defaults, n)}

    def export_drafter(self, state_dict: dict[str, torch.Tensor]) -> DFlashDraftModel:
        """A drafter ready for inference from the full (gathered) weights: the target's dtype and device, sdpa
        attention, eval mode. Built afresh because a sharded (FSDP) model cannot simply be copied."""
        drafter = DFlashDraftModel(copy.deepcopy(self.model_config))
        drafter.load_state_dict(state_dict, strict=True)
        drafter.config._attn_implementation = "sdpa"  # training may have used flex masks; inference passes none
        if self.args.draft_vocab_size:
            drafter.set_draft_vocabulary(frequent_tokens(self.train_samples, self.args.draft_vocab_size))
        device = self.target.get_input_embeddings().weight.device
        return drafter.to(device=device, dtype=self.target.dtype).eval()

    def finish(self, heldout: dict[str, Any]) -> dict[str, Any]:
        """Measure tau with real generate(), write the drafter + training_info.json + eval.json atomically."""
        accelerator = self.accelerator
        state_dict = accelerator.get_state_dict(self.model)  # a collective under FSDP: every process calls it
        results: dict[str, Any] = {"heldout": heldout, "steps": self.global_step, "compute": self.compute_so_far()}
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
        recipe = self.recipe_options()
        if recipe:
            drafter.training_info["recipe"] = recipe
        if self.args.push_to_hub:
            drafter.training_info["repo_id"] = self.args.push_to_hub
        # the model card's usage snippets name the Hub repo, else the output folder (not the temporary one written)
        drafter.hub_repo_id = self.args.push_to_hub or Path(self.args.output_dir).resolve().name

        def write(folder: Path) -> None:
            drafter.save_pretrained(folder)
            (folder / "training_info.json").write_text(json.dumps(drafter.training_info, indent=2) + "\n")
            (folder / "eval.json").write_text(json.dumps(results, indent=2) + "\n")
            log = Path(self.args.output_dir) / LOG_FILE
            if log.exists() and plot_training_curves(read_log(log), folder / CURVES_FILE):
                logger.info(f"Learning curves: {Path(self.args.output_dir) / CURVES_FILE}")

        write_folder_atomically(Path(self.args.output_dir), write)
        if self.args.push_to_hub:
            push_folder_to_hub(self.args.output_dir, self.args.push_to_hub)
        accelerator.wait_for_everyone()
        return results


def train(args: DFlashTrainingArguments, **kwargs) -> dict[str, Any]:
    """Train a drafter: ``DFlashTrainer(args, **kwargs).train()``.

    Example:
        >>> train(DFlashTrainingArguments(target="t", data="train.jsonl", output_dir="out"))  # doctest: +SKIP
    """
    return DFlashTrainer(args, **kwargs).train()
