# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""A bench run's progress file: the finished prompt rounds, one JSON line each, so that a killed run resumes where it
stopped.
"""

import dataclasses
import os
from pathlib import Path

from transformers.utils import logging

from ..data.records import append_record, read_records
from ..stats_dflash import DFlashStats
from .methods import Run

logger = logging.get_logger(__name__)


class BenchProgress:
    """The finished prompt rounds of a bench run, one JSON line each, so that a killed run resumes where it stopped
    (a run at 8K-token prompts takes minutes per prompt). The first line records what was asked (target, drafter,
    methods, tokens, threads...); a rerun asking something else is refused before any work. A line cut short by a
    kill is dropped when the file is opened again, and each line is flushed to disk before the next prompt starts.

    Example:
        >>> import tempfile
        >>> path = Path(tempfile.mkdtemp()) / "bench.progress.jsonl"
        >>> BenchProgress(path, {"methods": ["plain"]}).record(("gsm8k", 0, 0), {"plain": Run([1, 2], 0.5, 2)})
        >>> BenchProgress(path, {"methods": ["plain"]}).done[("gsm8k", 0, 0)]["plain"].new_tokens
        [1, 2]
    """

    def __init__(self, path: str | os.PathLike, asked: dict):
        self.path = Path(path)
        self.done: dict[tuple[str, int, int], dict[str, Run]] = {}
        if not self.path.exists():
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._append(asked)
            return
        self._drop_cut_line()  # or the next record would be glued to it, and lost on the next resume
        recorded, *entries = read_records(self.path)
        if recorded != asked:
            changed = sorted(k for k in set(asked) | set(recorded) if asked.get(k) != recorded.get(k))
            differences = "; ".join(f"{k}: {recorded.get(k)!r} there, {asked.get(k)!r} now" for k in changed)
            raise ValueError(f"{self.path} holds a bench run of other settings ({differences}); delete it to "
                             "start over, or pass the same settings to resume it.")
        for entry in entries:
            runs = {method: run_from_json(run) for method, run in entry["runs"].items()}
            self.done[(entry["dataset"], entry["index"], entry["round"])] = runs
        if self.done:
            logger.warning(f"Resuming the bench from {self.path}: {len(self.done)} prompt runs already done.")

    def _drop_cut_line(self) -> None:
        """Cut the file back to its last complete line (atomically: temporary file + rename)."""
        text = self.path.read_text(encoding="utf-8")
        if not text.endswith("\n"):
            partial = self.path.with_name(self.path.name + ".tmp")
            partial.write_text(text[: text.rfind("\n") + 1], encoding="utf-8")
            partial.replace(self.path)

    def record(self, key: tuple[str, int, int], runs: dict[str, Run]) -> None:
        dataset, index, round_ = key
        self._append({"dataset": dataset, "index": index, "round": round_,
                      "runs": {method: dataclasses.asdict(run) for method, run in runs.items()}})

    def _append(self, entry: dict) -> None:
        append_record(self.path, entry)


def run_from_json(entry: dict) -> Run:
    """A :class:`Run` as :class:`BenchProgress` wrote it (``dataclasses.asdict``)."""
    stats = entry.get("stats")
    return Run(entry["new_tokens"], entry["seconds"], entry["target_forwards"],
               None if stats is None else DFlashStats(**stats), entry.get("prefill_seconds"))

