# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""scripts/gpu_train.sh, the GPU training run, end to end on the CPU with a tiny random target: two runs with a small
budget, the second resuming the first's returned files, as a lent GPU runs it (docs/training.md, "On a GPU")."""

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import WORDS

from hf_dflash import DFlashDraftModel

ROOT = Path(__file__).resolve().parents[1]
# two training runs of the script (~25 s): with the slow tier that .ci/run also runs
pytestmark = pytest.mark.slow
FILE_LIMIT, MAX_FILES, TOTAL_LIMIT = 16 * 2**20, 8, 64 * 2**20  # what comes back from a lent machine


def run_script(out: Path, resume: Path, tiny: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable, "OMP_NUM_THREADS": "1",
           "GPU_TRAIN_INSTALL": "0", "GPU_TRAIN_RECEIVED": str(tmp_path / "received"), "TMPDIR": str(tmp_path),
           "GPU_TRAIN_BATCH": "2", "GPU_TRAIN_REGEN_BATCH": "8",
           "GPU_TRAIN_MAX_NEW_TOKENS": "24", "GPU_TRAIN_HELDOUT": "4", "GPU_TRAIN_PROMPTS_PER_RUN": "12",
           "GPU_TRAIN_EPOCHS": "2", "GPU_TRAIN_SHARD_SIZE": "60KB",  # the tiny drafter sharded as SmolLM2's is
           "GPU_TRAIN_EVAL_TOKENS": "16", "GPU_TRAIN_DRAFT_VOCAB": "0", "GPU_TRAIN_TRAIN_VOCAB": "0"}
    return subprocess.run(["bash", "scripts/gpu_train.sh", "--target", str(tiny / "target"), "--init",
                           str(tiny / "drafter"), "--device", "cpu", "--seconds", "60", "--in", str(resume)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def returned_files(out: Path) -> dict[str, int]:
    return {str(p.relative_to(out)): p.stat().st_size for p in out.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def two_runs(tiny_folder, tmp_path_factory):
    """(first OUT, second OUT, the resume folder): the second run starts from the first one's drafter and state,
    carried into the resume folder as .gpu-train/ is."""
    tmp_path = tmp_path_factory.mktemp("gpu_train")
    resume = tmp_path / "gpu-train"
    resume.mkdir()
    prompts = [{"prompt": f"Tell me about the {a} and the {b}.", "source": "chat"} for a in WORDS for b in WORDS[:2]]
    with gzip.open(resume / "prompts.jsonl.gz", "wt", encoding="utf-8") as f:
        f.writelines(json.dumps(p) + "\n" for p in prompts)
    outs = []
    for run in (1, 2):
        out = tmp_path / f"out{run}"
        done = run_script(out, resume, tiny_folder, tmp_path)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        shutil.rmtree(resume / "drafter", ignore_errors=True)  # what the next call carries in (.gpu-train/)
        shutil.copytree(out / "drafter", resume / "drafter")
        shutil.copy(out / "state.json", resume / "state.json")
        outs.append(out)
    return (*outs, resume)


def test_the_second_run_resumes_the_first(two_runs):
    first, second = (json.loads((out / "state.json").read_text()) for out in two_runs[:2])
    assert len(first["runs"]) == 1 and len(second["runs"]) == 2
    assert first["total_steps"] == first["runs"][0]["steps"] >= 1
    assert second["total_steps"] == first["total_steps"] + second["runs"][1]["steps"] > first["total_steps"]
    assert Path(first["runs"][0]["init_drafter"]) != two_runs[2] / "drafter"  # nothing carried yet: --init
    assert Path(second["runs"][1]["init_drafter"]) == two_runs[2] / "drafter"  # the carried drafter, not --init
    assert first["runs"][0]["prompts_from"] == 0 and first["next_prompt"] == 12
    assert second["runs"][1]["prompts_from"] == 12 and second["next_prompt"] == 4  # on from there, wrapping round
    assert [p["step"] for p in second["curve"]] == sorted(p["step"] for p in second["curve"])
    assert "calibration_seconds" in first["runs"][0] and "calibration_seconds" not in second["runs"][1]  # measured
    assert second["seconds_per_step"] > 0
    summary = json.loads((two_runs[1] / "summary.json").read_text())
    assert summary["total_steps"] == second["total_steps"] and "over_the_limits" not in summary
    assert {"regen_seconds", "train_step_seconds", "export_seconds"} <= set(summary["this_run"])


def test_what_comes_back_fits_the_limits(two_runs):
    for out in two_runs[:2]:
        files = returned_files(out)
        assert len(files) <= MAX_FILES and sum(files.values()) < TOTAL_LIMIT, files
        assert all(size < FILE_LIMIT for size in files.values()), files
        assert all(name.count("/") <= 1 for name in files), files
        assert {"state.json", "summary.json", "training_log.jsonl", "drafter/config.json",
                "drafter/model.safetensors.index.json"} <= set(files)


def test_the_returned_drafter_is_lossless_against_the_target(two_runs, tiny_folder):
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(tiny_folder / "target", dtype=torch.float32).eval()
    drafter = DFlashDraftModel.from_pretrained(two_runs[1] / "drafter", dtype=torch.float32).eval()
    assert next(drafter.parameters()).dtype == torch.float32
    saved = DFlashDraftModel.from_pretrained(two_runs[1] / "drafter")
    assert saved.dtype == torch.bfloat16  # stored in bf16, as shipped drafters are
    prompt = torch.tensor([[1, 5, 9, 14, 3, 7]])
    plain = target.generate(prompt, max_new_tokens=24, do_sample=False)
    assisted = target.generate(prompt, max_new_tokens=24, do_sample=False, assistant_model=drafter)
    assert torch.equal(plain, assisted)
