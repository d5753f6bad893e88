# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""Learning curves: ``training_log.jsonl`` (one JSON record per line, appended and flushed as training goes, cut
back to the checkpoint's length on resume so a resumed run has no duplicates) and the PNG drawn from it.

Records (every one carries the compute spent so far: ``train_seconds`` (wall) and ``train_cpu_seconds`` (all
processes together) of training steps, ``elapsed_seconds`` including evaluation, and the ``tokens`` / ``blocks``
processed):

- ``{"kind": "train", "step", "epoch", "loss", "accuracy", "acceptance_length", "lr", "gamma", "grad_norm", ...}``
  every ``logging_steps`` optimizer steps (training-batch metrics);
- ``{"kind": "eval", "step", "epoch", "heldout": {"loss", "accuracy", "accuracy_by_position",
  "acceptance_length", "num_samples"}, ...}`` at step 0 and every ``eval_every`` steps (when set), at each epoch
  end and at the end: held-out expected tau and per-position accuracy, the curve recipes are compared by.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..data.records import append_record

LOG_FILE = "training_log.jsonl"


CURVES_FILE = "training_curves.png"


class TrainingLog:
    """Append-only JSONL log. Each record is one ``write`` of a whole line, flushed and fsynced, so a kill leaves at
    most a partial last line; ``keep_bytes`` (the size recorded in the checkpoint being resumed, 0 for a fresh run)
    cuts the file back atomically (temporary file + rename), dropping what was logged after that checkpoint."""

    def __init__(self, path: str | os.PathLike, keep_bytes: int = 0, enabled: bool = True):
        self.path = Path(path)
        self.enabled = enabled
        if not enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        data = self.path.read_bytes() if self.path.exists() else b""
        if len(data) != keep_bytes or not self.path.exists():
            tmp = self.path.with_name(f".{self.path.name}.tmp{os.getpid()}")
            tmp.write_bytes(data[:keep_bytes])
            os.replace(tmp, self.path)

    @property
    def size(self) -> int:
        return self.path.stat().st_size if self.enabled and self.path.exists() else 0

    def append(self, record: Mapping[str, Any]) -> None:
        if not self.enabled:
            return
        append_record(self.path, dict(record))


def read_log(path: str | os.PathLike, kind: str | None = None) -> list[dict[str, Any]]:
    """The records of a training log (a run's folder or the file), optionally of one kind; a partial last line
    (a kill mid-write) is skipped."""
    path = Path(path)
    if path.is_dir():
        path = path / LOG_FILE
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if kind is None or record.get("kind") == kind:
            records.append(record)
    return records


def plot_training_curves(runs: Mapping[str, list[dict[str, Any]]] | list[dict[str, Any]], path: str | os.PathLike,
                         x: str = "train_cpu_seconds") -> bool:
    """Draw held-out expected tau against `x` (train_cpu_seconds, train_seconds, tokens, blocks or step) for one
    run (its records) or several ({name: records}), plus held-out accuracy by position at the last evaluation.
    Returns False (and draws nothing) when matplotlib is not installed or no run has an evaluation."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    if not isinstance(runs, Mapping):
        runs = {"": runs}
    evals = {name: [r for r in records if r.get("kind") == "eval" and r.get("heldout")]
             for name, records in runs.items()}
    evals = {name: records for name, records in evals.items() if records}
    if not evals:
        return False
    figure, (curve, positions) = plt.subplots(1, 2, figsize=(11, 4))
    for name, records in evals.items():
        xs = [r.get(x, 0) / (60 if x.endswith("seconds") else 1) for r in records]
        curve.plot(xs, [r["heldout"]["acceptance_length"] for r in records], marker=".", label=name or None)
        last = records[-1]["heldout"]["accuracy_by_position"]
        positions.plot(range(1, len(last) + 1), last, marker=".", label=name or None)
    label = {"train_cpu_seconds": "training CPU minutes", "train_seconds": "training minutes (wall)",
             "elapsed_seconds": "minutes (wall, with evaluation)"}.get(x, x)
    curve.set(xlabel=label, ylabel="held-out expected acceptance length", title="learning curve")
    positions.set(xlabel="draft position k", ylabel="held-out accuracy", title="accuracy by position (last eval)")
    for axis in (curve, positions):
        axis.grid(alpha=0.3)
        if any(evals):
            axis.legend(fontsize=8)
    figure.tight_layout()
    path = Path(path)
    tmp = path.with_name(f".{path.stem}.tmp{os.getpid()}{path.suffix}")
    figure.savefig(tmp, dpi=100)
    plt.close(figure)
    os.replace(tmp, path)
    return True
