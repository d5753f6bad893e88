# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""The end of a run: the final drafter folder, written atomically, and its upload to the Hub."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from transformers.utils import logging

from .arguments import RUN_ARGS_FILE

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
