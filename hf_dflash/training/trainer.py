# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""The training loop: :class:`DFlashTrainer` (accelerate for devices and DDP, exact resume from atomic checkpoints,
held-out evaluation every epoch and every ``eval_every`` steps into ``training_log.jsonl``, the recipe options
beyond the paper, generate()-measured tau, learning curves and export at the end) and :func:`train`.

What the loop is built from lives beside it: :mod:`~hf_dflash.training.build` (target, drafter, optimizer,
schedule), :mod:`~hf_dflash.training.samples` (train / held-out split), :mod:`~hf_dflash.training.features` (target
features and their caches), :mod:`~hf_dflash.training.checkpoints` (checkpoint files) and
:mod:`~hf_dflash.training.export` (tau, the final drafter folder). This module keeps the loop's state and steps.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm
from transformers.utils import logging

from ..modeling_dflash import DFlashDraftModel
from ..models import pad_token_id
from .arguments import DFlashTrainingArguments, check_output_dir, validate_arguments, write_run_arguments
from .build import (
    drafter_to_train,
    frozen_target,
    mixed_precision_mode,
    prepared_optimization,
    run_length,
    training_objective,
)
from .checkpoints import read_checkpoint, register_checkpoint_hooks, write_checkpoint
from .curves import LOG_FILE, TrainingLog
from .export import inference_drafter, measured_tau, recipe_options, tau_prompt_ids, write_final_drafter
from .features import FeatureCache, batch_features, feature_caches
from .loss import BlockLossOutput, Objective, add_sums, block_diffusion_loss, resolve_attn_implementation
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
    stable_seed,
    training_vocabulary,
    update_reach_rates,
)
from .samples import training_and_heldout_samples

logger = logging.get_logger(__name__)


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
        self.args, self.callbacks = args, list(callbacks or [])
        self.resume_from = check_output_dir(args)
        self.train_samples, self.eval_samples = training_and_heldout_samples(args)
        self.accelerator = Accelerator(mixed_precision=mixed_precision_mode(args.mixed_precision))
        device = self.accelerator.device
        self.target, self.tokenizer = frozen_target(args, device, target, tokenizer)
        self.embed_tokens, self.lm_head = self.target.get_input_embeddings(), self.target.get_output_embeddings()
        set_seed(args.seed)  # the drafter's random init, and all global randomness after it, follow --seed
        self.attn_implementation = resolve_attn_implementation(args.attn_implementation, device)
        drafter = drafter_to_train(args, self.target, self.attn_implementation, device)
        self.layer_ids = list(drafter.config.target_layer_ids)
        self.pad_token_id = pad_token_id(self.target, self.tokenizer)
        self.steps_per_epoch, self.total_steps = run_length(args, len(self.train_samples),
                                                            self.accelerator.num_processes)
        self.model, self.optimizer, self.scheduler = prepared_optimization(self.accelerator, drafter, args,
                                                                           self.total_steps)
        register_checkpoint_hooks(self.accelerator, self.scheduler)
        self.feature_cache, self.heldout_cache = feature_caches(args, self.layer_ids, self.target.dtype)
        self.objective = training_objective(args, self.target)
        self.train_vocab = frequent_tokens(self.train_samples, args.train_vocab_size) if args.train_vocab_size else None
        self.start_progress()
        if self.accelerator.is_main_process:
            write_run_arguments(args)
        logger.info(f"DFlash training: {len(self.train_samples)} train / {len(self.eval_samples)} held-out samples, "
                    f"{self.total_steps} steps, attention {self.attn_implementation}, layers {self.layer_ids}.")

    def start_progress(self) -> None:
        """Put the loop at step 0: data position, history, reach rates and compute counters, the state that
        :meth:`progress_state` checkpoints so that a resumed run continues the same counts."""
        self.global_step, self.epoch, self.groups_done, self.last_saved_step = 0, 0, 0, -1
        self.history: list[dict[str, Any]] = []
        self.reach_rates = initial_reach_rates(self.args.block_size, gamma_at(self.args, 0, 0, self.total_steps))
        self.compute = {"train_seconds": 0.0, "train_cpu_seconds": 0.0, "elapsed_seconds": 0.0, "tokens": 0,
                        "blocks": 0}
        self.log_bytes, self.last_eval_step, self.training_log = 0, None, None
        self._started, self._elapsed_base = None, 0.0

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
        """(target features, the target's final hidden states or None) of a batch on this process's device: see
        :func:`~hf_dflash.training.features.batch_features`."""
        return batch_features(self.target, batch, self.layer_ids, self.accelerator.device, final_hidden, cache)

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

    def _reduce(self, out: BlockLossOutput) -> BlockLossOutput:
        """Sums over all processes (the differentiable loss stays local)."""
        if self.accelerator.num_processes == 1:
            return out
        return BlockLossOutput(out.loss, *(self.accelerator.reduce(t, "sum") for t in out.sums()))

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
        while self.epoch < args.epochs and self.global_step < self.total_steps and not self.stop_here():
            groups = self.epoch_groups(self.epoch)
            while (self.groups_done < len(groups) and self.global_step < self.total_steps
                   and not self.stop_here()):
                gamma = gamma_at(args, self.epoch, self.global_step, self.total_steps)
                wall, cpu = time.perf_counter(), time.process_time()
                log = self.training_step(groups[self.groups_done], self.epoch, gamma)
                self.compute["train_seconds"] += time.perf_counter() - wall
                self.compute["train_cpu_seconds"] += self.all_processes(time.process_time() - cpu)
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

    def all_processes(self, seconds: float) -> float:
        """The sum of `seconds` over all processes: a step's CPU time counts every core that worked on it, so runs
        on one and on two processes compare at equal compute."""
        if self.accelerator.num_processes == 1:
            return seconds
        return float(self.accelerator.reduce(torch.tensor(seconds, device=self.accelerator.device), "sum"))

    def stop_here(self) -> bool:
        """--stop-at-step reached or --max-cpu-seconds spent (the same sum on every process: they stop together)."""
        budget, last = self.args.max_cpu_seconds, self.args.stop_at_step
        return ((budget is not None and self.compute["train_cpu_seconds"] >= budget)
                or (last is not None and self.global_step >= last))

    def compute_so_far(self) -> dict[str, Any]:
        """The compute counters, with the wall time since the run started (across resumes) as elapsed_seconds."""
        if self._started is not None:
            self.compute["elapsed_seconds"] = self._elapsed_base + time.perf_counter() - self._started
        return dict(self.compute)

    # ------------------------------------------------------------------------------------------------------------------
    # evaluation
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
    # checkpoints (the files: hf_dflash.training.checkpoints)
    def save_checkpoint(self) -> Path:
        """Write `checkpoints/checkpoint-{step}` atomically: drafter (save_pretrained), optimizer, scheduler, RNG and
        data position go to a temporary folder that is renamed into place when complete."""
        final = write_checkpoint(self.accelerator, self.model, self.args.output_dir, self.global_step,
                                 self.progress_state, self.args.save_total_limit)
        self.last_saved_step = self.global_step
        return final

    def load_checkpoint(self, checkpoint: str | os.PathLike) -> None:
        """Restore weights, optimizer, scheduler, RNG and the data position from a checkpoint folder."""
        checkpoint = Path(checkpoint)
        self.restore_progress(read_checkpoint(self.accelerator, checkpoint))
        logger.info(f"Resumed from {checkpoint} at step {self.global_step} (epoch {self.epoch}).")

    def progress_state(self) -> dict[str, Any]:
        """The loop's state as a checkpoint's trainer_state.json holds it."""
        return {"global_step": self.global_step, "epoch": self.epoch, "groups_done": self.groups_done,
                "num_processes": self.accelerator.num_processes, "history": self.history,
                "reach_rates": self.reach_rates, "compute": self.compute_so_far(),
                "log_bytes": self.training_log.size if self.training_log is not None else 0,
                "last_eval_step": self.last_eval_step}

    def restore_progress(self, state: dict[str, Any]) -> None:
        """Continue from a :meth:`progress_state`; fields a checkpoint of an older version lacks keep their start."""
        self.global_step, self.epoch, self.groups_done = state["global_step"], state["epoch"], state["groups_done"]
        self.history = state["history"]
        self.reach_rates = state.get("reach_rates", self.reach_rates)
        self.compute.update(state.get("compute", {}))
        self.log_bytes = state.get("log_bytes", 0)
        self.last_eval_step = state.get("last_eval_step")
        self.last_saved_step = self.global_step

    # ------------------------------------------------------------------------------------------------------------------
    # the end: final tau, export, upload (hf_dflash.training.export)
    def eval_prompt_ids(self) -> list[list[int]]:
        """Prompts for the generate()-measured tau: --eval-prompts, else the held-out samples' prompts."""
        return tau_prompt_ids(self.args, self.tokenizer, self.eval_samples)

    def recipe_options(self) -> dict[str, Any]:
        """The issue-13 recipe options this run changed from their defaults (recorded in training_info.json)."""
        return recipe_options(self.args)

    def export_drafter(self, state_dict: dict[str, torch.Tensor]) -> DFlashDraftModel:
        """A drafter ready for inference from the full (gathered) weights, with the --draft-vocab-size tokens most
        frequent in the training samples: see :func:`~hf_dflash.training.export.inference_drafter`."""
        draft_vocab = (frequent_tokens(self.train_samples, self.args.draft_vocab_size)
                       if self.args.draft_vocab_size else None)
        return inference_drafter(self.model_config, state_dict, self.target, draft_vocab)

    def epochs_trained(self) -> float:
        """Epochs completed, with the part of the last one that --max-steps or --max-cpu-seconds cut short."""
        if self.groups_done == 0:
            return float(self.epoch)
        return round(self.epoch + self.groups_done / self.steps_per_epoch, 2)

    def finish(self, heldout: dict[str, Any]) -> dict[str, Any]:
        """Measure tau with real generate(), write the drafter + training_info.json + eval.json atomically."""
        state_dict = self.accelerator.get_state_dict(self.model)  # a collective under FSDP: every process calls it
        results: dict[str, Any] = {"heldout": heldout, "steps": self.global_step, "epochs": self.epochs_trained(),
                                   "compute": self.compute_so_far()}
        if self.accelerator.is_main_process:
            drafter = self.export_drafter(state_dict)
            results.update(measured_tau(self.target, drafter, self.eval_prompt_ids(), self.args.eval_max_new_tokens))
            write_final_drafter(self.args, drafter, results, num_samples=len(self.train_samples))
        self.accelerator.wait_for_everyone()
        return results


def train(args: DFlashTrainingArguments, **kwargs) -> dict[str, Any]:
    """Train a drafter: ``DFlashTrainer(args, **kwargs).train()``.

    Example:
        >>> train(DFlashTrainingArguments(target="t", data="train.jsonl", output_dir="out"))  # doctest: +SKIP
    """
    return DFlashTrainer(args, **kwargs).train()
