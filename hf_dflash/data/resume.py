# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""What lets a regeneration resume: the output and its sidecars (``<output>.skipped``: prompts handled but not kept;
``<output>.meta.json``: the settings the output was written with), the prompts already done, and the refusal of a
rerun with other settings.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from transformers.utils import logging

from .arguments import RegenerationArguments
from .records import iter_records

logger = logging.get_logger(__name__)


def skipped_path(output: str | os.PathLike) -> Path:
    """Sidecar listing prompt indices that were processed but not kept (too short / prompt too long)."""
    return Path(f"{output}.skipped")


def meta_path(output: str | os.PathLike) -> Path:
    """Sidecar with the settings of the run that writes `output` (checked when resuming)."""
    return Path(f"{output}.meta.json")


def done_indices(output: str | os.PathLike) -> set[int]:
    """Prompt indices already handled by an earlier (possibly killed) run: kept or skipped.

    Also cuts an incomplete last line (a write interrupted by a kill) off the output so that appends stay valid.
    """
    done: set[int] = set()
    for path in (Path(output), skipped_path(output)):
        if not path.exists():
            continue
        _truncate_incomplete_last_line(path)
        for record in iter_records(path):
            done.add(int(record["index"]))
    return done


def _truncate_incomplete_last_line(path: Path) -> None:
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        keep = data.rfind(b"\n") + 1
        logger.warning(f"{path}: dropping an incomplete last line left by an interrupted run.")
        with open(path, "r+b") as f:
            f.truncate(keep)


def check_same_regeneration(args: RegenerationArguments) -> None:
    """Raise if `args.output` was written by a run with other settings, or by something else. Writes nothing."""
    settings = args.run_settings()
    path = meta_path(args.output)
    if path.exists():
        saved = json.loads(path.read_text(encoding="utf-8"))
        differ = {k: (saved.get(k), settings.get(k)) for k in {**saved, **settings} if saved.get(k) != settings.get(k)}
        if differ:
            details = ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in differ.items())
            raise ValueError(
                f"{args.output} holds a regeneration with other settings ({details}). Use another --output, "
                f"the same settings to resume it, or delete {args.output} and {path} to start over."
            )
    elif Path(args.output).exists() and Path(args.output).stat().st_size > 0:
        raise ValueError(f"{args.output} exists but was not written by `hf-dflash regenerate`; use another --output.")


def record_regeneration_settings(args: RegenerationArguments) -> None:
    """Create the output (it exists even when every sample is dropped) and its settings sidecar, once."""
    path = meta_path(args.output)
    if path.exists():
        return
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).touch()
    path.write_text(json.dumps(args.run_settings(), indent=2) + "\n", encoding="utf-8")
