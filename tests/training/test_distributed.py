# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""Data-parallel training on CPU: two gloo processes started by ``accelerate launch`` train the same drafter as one
process on the same data, resume step for step, and split the batches as :func:`shard_batches` says.

Two DDP processes with batch size 1 average the gradients of two single-sample losses; one process with batch size
1 and ``grad_accum`` 2 averages the same two losses, so both runs must agree step for step (up to float rounding of
the all-reduce). On a machine without GPUs ``accelerate launch --multi_gpu`` starts the processes but accelerate
only joins them into one gloo group with ``ACCELERATE_USE_CPU=true`` (without it each process trains alone).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import free_port, save_tiny_target, write_data
from safetensors.torch import load_file

from hf_dflash.training import DFlashTrainer, DFlashTrainingArguments
from hf_dflash.training.recipe import shard_batches

BLOCK = 8
KILL_AT = 7  # 4 steps per epoch; checkpoints at steps 2, 4 (epoch end) and 6: resumed mid-epoch, step 7 is redone

SCRIPT = """
import json, sys
from pathlib import Path
from hf_dflash.cli import main
from hf_dflash.training import DFlashTrainer, DFlashTrainingArguments

settings, root = json.loads(sys.argv[1]), Path(sys.argv[2])


class Killed(Exception):
    pass


def kill(trainer, log):
    if log["step"] == {kill_at}:
        raise Killed


def record(name, trainer):
    rank = trainer.accelerator.process_index
    state = {{"num_processes": trainer.accelerator.num_processes, "history": trainer.history,
             "groups": [trainer.epoch_groups(epoch) for epoch in range(settings["epochs"])],
             "compute": trainer.compute}}
    (root / f"{{name}}-{{rank}}.json").write_text(json.dumps(state))


# 1. the CLI, as `accelerate launch -m hf_dflash train` runs it
flags = [f"--{{k.replace('_', '-')}}={{v}}" for k, v in settings.items() if k not in ("target", "data")]
assert main(["train", "--target", settings["target"], "--data", settings["data"],
             "--output", str(root / "cli"), *flags]) == 0
# 2. killed after step {kill_at}, then resumed with the same number of processes
args = dict(settings, output_dir=str(root / "killed"))
try:
    DFlashTrainer(DFlashTrainingArguments(**args), callbacks=[kill]).train()
except Killed:
    pass
resumed = DFlashTrainer(DFlashTrainingArguments(**args, resume=True))
resumed.train()
record("resumed", resumed)
""".format(kill_at=KILL_AT)


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    """One `accelerate launch` of two CPU processes: a CLI run, and a killed + resumed run (same settings)."""
    root = tmp_path_factory.mktemp("ddp")
    settings = dict(target=str(save_tiny_target(root / "target")), data=str(write_data(root / "train.jsonl")),
                    num_layers=1, block_size=BLOCK, epochs=2, lr=3e-3, num_anchors=8, max_length=64, batch_size=1,
                    grad_accum=1, eval_split=0.1, num_eval_prompts=0, save_every=2, seed=3, logging_steps=1000)
    (root / "ddp.py").write_text(SCRIPT)
    env = {**os.environ, "ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1", "PYTHONPATH": os.getcwd()}
    command = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
               "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
               "--main_process_port", str(free_port()), str(root / "ddp.py"), json.dumps(settings), str(root)]
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    return root, settings


def single_process_run(root: Path, settings: dict) -> DFlashTrainer:
    args = DFlashTrainingArguments(**{**settings, "output_dir": str(root / "single"), "batch_size": 1,
                                      "grad_accum": 2})
    trainer = DFlashTrainer(args)
    trainer.train()
    return trainer


def assert_histories_match(ddp: list[dict], single: list[dict]) -> None:
    assert [h["step"] for h in ddp] == [h["step"] for h in single]
    for a, b in zip(ddp, single):
        if "heldout" in a:
            assert set(a["heldout"]) == set(b["heldout"])
            for key, value in a["heldout"].items():
                assert value == pytest.approx(b["heldout"][key], rel=1e-4, abs=1e-6), (a["step"], key)
        else:
            for key in ("epoch", "loss", "accuracy", "acceptance_length", "grad_norm", "lr", "gamma"):
                assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), (a["step"], key)


def test_two_cpu_processes_train_what_one_process_trains(ddp_run):
    root, settings = ddp_run
    resumed = [json.loads((root / f"resumed-{rank}.json").read_text()) for rank in (0, 1)]
    assert [r["num_processes"] for r in resumed] == [2, 2]  # really one gloo group of two
    single = single_process_run(root, settings)
    assert single.global_step == 8  # 8 samples, 2 per step, 2 epochs
    assert_histories_match(resumed[0]["history"], single.history)
    ddp_weights, single_weights = load_file(root / "cli" / "model.safetensors"), load_file(
        root / "single" / "model.safetensors")
    assert set(ddp_weights) == set(single_weights)
    for name, tensor in single_weights.items():
        torch.testing.assert_close(ddp_weights[name], tensor, rtol=1e-4, atol=1e-5, msg=name)
    start = DFlashTrainer(DFlashTrainingArguments(**{**settings, "output_dir": str(root / "fresh")}))
    untrained = start.accelerator.unwrap_model(start.model).state_dict()
    assert any(not torch.allclose(untrained[n].float(), t, atol=1e-3) for n, t in single_weights.items())


def test_killed_ddp_run_resumes_step_for_step(ddp_run):
    """The resumed 2-process run equals the uninterrupted 2-process CLI run: history, weights, checkpoints."""
    root, _ = ddp_run
    resumed = json.loads((root / "resumed-0.json").read_text())
    state = json.loads(next((root / "killed" / "checkpoints").glob("checkpoint-*/trainer_state.json")).read_text())
    assert state["num_processes"] == 2
    assert (root / "cli" / "eval.json").exists() and (root / "killed" / "eval.json").exists()
    cli_weights, resumed_weights = (load_file(root / name / "model.safetensors") for name in ("cli", "killed"))
    for name, tensor in cli_weights.items():
        assert torch.equal(resumed_weights[name], tensor), name
    cli_state = json.loads(sorted((root / "cli" / "checkpoints").glob("checkpoint-*/trainer_state.json"),
                                  key=lambda p: int(p.parent.name.split("-")[1]))[-1].read_text())
    assert resumed["history"] == cli_state["history"]
    assert any(h.get("step") == KILL_AT for h in resumed["history"])


def test_every_process_counts_the_cpu_time_of_all(ddp_run):
    """The CPU seconds of training steps (--max-cpu-seconds and the curves' x axis) are summed over the processes
    each step: every process holds the same total, so a 2-process run is compared at the compute it used."""
    root, _ = ddp_run
    spent = [json.loads((root / f"resumed-{rank}.json").read_text())["compute"]["train_cpu_seconds"] for rank in (0, 1)]
    assert spent[0] == spent[1] > 0


def test_each_process_gets_its_own_share_of_every_step(ddp_run):
    """In every step, process 0 and process 1 take consecutive samples of the epoch's order: together the single
    process's micro-batches of that step, disjoint, every training sample once per epoch."""
    root, settings = ddp_run
    groups = [json.loads((root / f"resumed-{rank}.json").read_text())["groups"] for rank in (0, 1)]
    single = DFlashTrainer(DFlashTrainingArguments(**{**settings, "output_dir": str(root / "order"), "grad_accum": 2}))
    for epoch in range(settings["epochs"]):
        expected = single.epoch_groups(epoch)
        assert len(groups[0][epoch]) == len(groups[1][epoch]) == len(expected) == 4
        for step, (mine, theirs, both) in enumerate(zip(groups[0][epoch], groups[1][epoch], expected)):
            assert [mine[0], theirs[0]] == both, (epoch, step)
        positions = [p for g in groups for step in g[epoch] for batch in step for p in batch]
        assert sorted(positions) == list(range(8))


@pytest.mark.parametrize("num_samples, batch_size, num_processes", [
    (1, 1, 1), (7, 1, 1), (7, 3, 1), (8, 1, 2), (9, 1, 2), (9, 2, 2), (10, 3, 4), (5, 2, 8), (64, 4, 3)])
def test_shard_batches(num_samples, batch_size, num_processes):
    """Every process gets the same number of full batches; each step's batches are consecutive slices of the order;
    every sample is counted exactly once over all processes and the wrap-around repeats are flagged."""
    order = torch.randperm(num_samples, generator=torch.Generator().manual_seed(num_samples)).tolist()
    shards = [shard_batches(num_samples, batch_size, num_processes, rank, order) for rank in range(num_processes)]
    steps = -(-num_samples // (batch_size * num_processes))
    assert all(len(shard) == steps for shard in shards)
    assert all(len(batch) == batch_size for shard in shards for batch in shard)
    flat = [pair for step in range(steps) for shard in shards for pair in shard[step]]  # step-major, then process
    assert [p for p, _ in flat] == [order[i % num_samples] for i in range(len(flat))]
    assert [c for _, c in flat] == [i < num_samples for i in range(len(flat))]
    assert sorted(p for p, counted in flat if counted) == list(range(num_samples))
    if num_processes == 1:
        assert [[p for p, _ in b] for b in shards[0]] == [order[i : i + batch_size] + [order[j % num_samples] for j in
                range(num_samples, i + batch_size)] for i in range(0, num_samples, batch_size)]
