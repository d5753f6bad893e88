# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""Target features for training: what the frozen target gives the drafter as context, computed by the same function
inference uses, and optionally cached on disk (small targets on CPU, where the target forward dominates).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from ..modeling_dflash import target_features
from .arguments import DFlashTrainingArguments
from .recipe import BlockBatch


def context_features(target, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                     layer_ids: list[int]) -> torch.Tensor:
    """The drafter's context for whole sequences: :func:`~hf_dflash.modeling_dflash.target_features` (the same
    function inference uses) of one target forward, [b, S, T*H]."""
    return target_outputs(target, input_ids, attention_mask, layer_ids)[0]


def num_target_layers(target) -> int:
    config = target.config.get_text_config() if hasattr(target.config, "get_text_config") else target.config
    return int(config.num_hidden_layers)


def target_outputs(target, input_ids: torch.Tensor, attention_mask: torch.Tensor, layer_ids: list[int],
                   final_hidden: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(context features [b, S, T*H], the target's final (normed) hidden states [b, S, H] or None) of ONE target
    forward. The final hidden states give the target's next-token logits at every position through its LM head
    (distillation) at 1/T of the features' size, so they are what the feature cache keeps, not vocabulary-sized
    logits."""
    wanted = sorted({i + 1 for i in layer_ids} | ({num_target_layers(target)} if final_hidden else set()))
    with torch.no_grad():
        out = target(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=wanted,
                     logits_to_keep=1, use_cache=False)
    return target_features(out.hidden_states, layer_ids), (out.hidden_states[-1] if final_hidden else None)


class FeatureCache:
    """Target features per sample on disk, for small targets where the target forward dominates (CPU).

    Features are stored at the target's dtype, so cached and recomputed training are the same computation. With
    distillation the target's final hidden states are cached too (``{index}.final.pt``, 1/T of the features' size):
    its logits at every position follow from them through the frozen LM head, so distillation (full distribution or
    top-k) needs no target forward once a sample is cached.
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

    def path(self, index: int, kind: str = "") -> Path:
        return self.folder / (f"{index}.{kind}.pt" if kind else f"{index}.pt")

    def get(self, index: int, kind: str = "") -> torch.Tensor | None:
        """Features of sample `index` (kind ""), or the target's final hidden states (kind "final", distillation)."""
        path = self.path(index, kind)
        return torch.load(path) if path.exists() else None

    def put(self, index: int, features: torch.Tensor, kind: str = "") -> None:
        path = self.path(index, kind)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        torch.save(features.detach().cpu().clone(), tmp)
        os.replace(tmp, path)


def batch_features(target, batch: BlockBatch, layer_ids: list[int], device: torch.device, final_hidden: bool = False,
                   cache: FeatureCache | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(target features, the target's final hidden states or None) of a batch, on `device`: from `cache` when every
    sample is in it (zero-padded to the batch's length), else from one target forward whose per-sample results go
    into `cache`. `final_hidden` (distillation) also reads/writes the cached final hidden states."""
    kinds = ["", "final"] if final_hidden else [""]
    if cache is not None:
        cached = {kind: [cache.get(i, kind) for i in batch.sample_indices] for kind in kinds}
        if all(c is not None for parts in cached.values() for c in parts):
            padded = []
            for parts in cached.values():
                out = torch.zeros(len(parts), batch.context_length, parts[0].shape[-1], dtype=parts[0].dtype)
                for row, c in enumerate(parts):
                    out[row, : c.shape[0]] = c
                padded.append(out.to(device))
            return padded[0], (padded[1] if final_hidden else None)
    target_device = target.get_input_embeddings().weight.device
    features, final = target_outputs(target, batch.input_ids.to(target_device), batch.attention_mask.to(target_device),
                                     layer_ids, final_hidden)
    if cache is not None:
        lengths = batch.attention_mask.sum(dim=1).tolist()
        for row, (index, n) in enumerate(zip(batch.sample_indices, lengths)):
            cache.put(index, features[row, :n])
            if final is not None:
                cache.put(index, final[row, :n], "final")
    return features.to(device), None if final is None else final.to(device)


def feature_caches(args: DFlashTrainingArguments, layer_ids: list[int], dtype: torch.dtype
                   ) -> tuple[FeatureCache | None, FeatureCache | None]:
    """(training samples' cache, held-out samples' cache) under --feature-cache, (None, None) without it. The
    fingerprint names everything the features depend on, so a cache built for another run is refused, not misread;
    held-out samples from --eval-data are numbered in that file, so they get a cache of their own."""
    if not args.feature_cache:
        return None, None
    run = args.run_fingerprint()
    fingerprint = {"target": run["target"], "data": run["data"], "target_layer_ids": layer_ids,
                   "max_length": args.max_length, "dtype": str(dtype)}
    cache = FeatureCache(args.feature_cache, fingerprint)
    if not args.eval_data:
        return cache, cache
    return cache, FeatureCache(Path(args.feature_cache) / "eval", {**fingerprint, "data": run["eval_data"]})
