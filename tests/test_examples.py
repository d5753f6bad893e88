# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""The example scripts run as documented: ``python examples/train_drafter.py`` (the CPU toy run, ~12 s)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


# slow (~38 s): runs with the slow suite in .ci/run; the trainer's own fast tests cover training
@pytest.mark.slow
def test_train_drafter_example_trains_a_drafter_that_beats_an_untrained_one(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, str(ROOT / "examples" / "train_drafter.py"), "--workdir", str(tmp_path)],
                            capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    found = re.search(r"acceptance length tau: untrained ([\d.]+) -> trained ([\d.]+)", result.stdout)
    assert found, result.stdout[-2000:]
    untrained, trained = float(found[1]), float(found[2])
    assert untrained < 1.3 and trained > untrained + 1.5, (untrained, trained)  # measured: 1.00 -> 3.07
    for name in ("config.json", "model.safetensors", "eval.json", "README.md"):
        assert (tmp_path / "drafter" / name).exists(), name
