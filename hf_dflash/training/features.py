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

from ..generation_dflash import target_features


def context_features(target, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                     layer_ids: list[int]) -> torch.Tensor:
    """The drafter's context for whole sequences: :func:`~hf_dflash.generation_dflash.target_features` (the same
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
