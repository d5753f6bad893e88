# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""``hf-dflash regenerate --server`` against a real vLLM server: benchmarks/regenerate_server.py, slow.

Opt-in: ``HF_DFLASH_VLLM_CHECK=1`` and a vLLM venv (``$VLLM_VENV``, else the one benchmarks/conformance/vllm_check.sh creates;
``bash benchmarks/conformance/vllm_check.sh --print-venv`` names it). Starts vLLM's OpenAI server on the offline SmolLM2 in fp32
(~2 minutes here), regenerates 4 greedy prompts in-process and through the server, and checks that the server's
records carry the engine's token ids, equal to the in-process ones, and that `hf-dflash train` trains a drafter on
the server-made file (a few steps, the CLI a user runs).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hf_dflash.data import load_training_samples

ROOT = Path(__file__).resolve().parents[2]


def vllm_python() -> Path | None:
    if os.environ.get("VLLM_VENV"):
        venv = Path(os.environ["VLLM_VENV"])
    else:
        found = subprocess.run(["bash", str(ROOT / "benchmarks" / "conformance" / "vllm_check.sh"), "--print-venv"],
                               capture_output=True, text=True)
        venv = Path(found.stdout.strip()) if found.returncode == 0 else None
    return venv / "bin" / "python" if venv is not None and (venv / "bin" / "python").exists() else None


pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not os.environ.get("HF_DFLASH_VLLM_CHECK") or vllm_python() is None,
                       reason="opt-in: HF_DFLASH_VLLM_CHECK=1 and a vLLM venv (VLLM_VENV or benchmarks/conformance/vllm_check.sh)"),
]


def test_regenerate_on_a_vllm_server_writes_the_in_process_records(tmp_path):
    report_file = tmp_path / "report.json"
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "regenerate_server.py"), "--vllm-python", str(vllm_python()),
         "--limit", "4", "--max-new-tokens", "32", "--workdir", str(tmp_path / "work"), "--json", str(report_file)],
        env=env, capture_output=True, text=True,
        timeout=1800)
    assert report_file.exists(), done.stderr[-3000:]
    report = json.loads(report_file.read_text())
    same = report["comparison"]
    assert same["compared"] == 4 and not same["missing_on_server"]
    assert same["token_ids_from"] == ["engine"]  # vLLM returned them (return_token_ids)
    # greedy fp32 on both sides: measured identical here; a near-tie could in principle split the two CPU engines
    assert same["identical"] == 4, same["first_difference_at_response_token"]
    assert done.returncode == 0, done.stdout[-3000:]
    samples = load_training_samples(tmp_path / "work" / "server.jsonl", max_length=4096, min_response_tokens=1)
    assert len(samples) == 4
    output = tmp_path / "drafter"
    trained = subprocess.run(
        [sys.executable, "-m", "hf_dflash", "train", "--target", "smollm2", "--data",
         str(tmp_path / "work" / "server.jsonl"), "--output", str(output), "--num-layers", "1", "--block-size", "8",
         "--max-steps", "4", "--num-anchors", "8", "--batch-size", "1", "--eval-split", "0", "--num-eval-prompts",
         "0", "--save-every", "0", "--logging-steps", "1", "--train-vocab-size", "2048"],
        env=env, capture_output=True, text=True,
        timeout=900)
    assert trained.returncode == 0, trained.stderr[-3000:]
    steps = [json.loads(line) for line in (output / "training_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in steps if r["kind"] == "train"] == [1, 2, 3, 4]
    assert (output / "model.safetensors").exists() and (output / "config.json").exists()
