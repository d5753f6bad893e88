#!/usr/bin/env python
# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""Helpers of scripts/compare_recipes.sh (recipe options at equal CPU time).

    python scripts/compare_recipes.py smoke-prompts --count 24 --output prompts.jsonl
    python scripts/compare_recipes.py fill-cache --data train.jsonl --feature-cache DIR [--max-length 512 ...]
    python scripts/compare_recipes.py table RUNS_FOLDER [--budget SECONDS]

* ``smoke-prompts``: code + math prompts only (no ShareGPT download), from the training-prompt builders'
  generators (hf_dflash.evaluation.training_prompts), for a quick end-to-end check of the comparison.
* ``fill-cache``: target features and final hidden states of every sample into the feature cache, BEFORE the
  recipes train, so that no recipe is charged the target forward (the first one to run would otherwise pay it).
* ``table``: one Markdown row per run folder with a ``training_log.jsonl``: held-out expected tau at 25/50/75/100%
  of the CPU budget (the last evaluation at or before that much training CPU time), per-position accuracy, steps,
  tokens and blocks per CPU-minute, the generate()-measured tau when the run finished; plus ``curves.png`` with every
  run's learning curve. Written to RUNS_FOLDER/table.md and printed.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path


def smoke_prompts(count: int, output: Path, seed: int = 0) -> None:
    from hf_dflash.evaluation import training_prompts as builder

    rng = random.Random(seed)
    starts, entry_points = builder.evaluation_guard()
    functions = builder.stdlib_functions(entry_points)
    prompts = [builder.code_prompt(rng, f) for f in rng.sample(functions, count // 2)]
    while len(prompts) < count:
        prompts.append(builder.math_prompt(rng))
    prompts = [p for p in prompts if not builder.is_evaluation_text(p, starts)]
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts), encoding="utf-8")
    tmp.replace(output)
    print(json.dumps({"output": str(output), "prompts": len(prompts)}))


def fill_cache(argv: list[str]) -> None:
    """Build a trainer with the comparison's arguments (distillation on, so final hidden states are kept too) and
    compute the target outputs of every training and held-out sample once."""
    import torch

    from hf_dflash.cli import add_dataclass_arguments, dataclass_from_namespace
    from hf_dflash.training import DFlashTrainer, DFlashTrainingArguments

    parser = argparse.ArgumentParser(prog="compare_recipes.py fill-cache")
    add_dataclass_arguments(parser, DFlashTrainingArguments)
    args = dataclass_from_namespace(DFlashTrainingArguments, parser.parse_args(argv))
    args.distill_weight = args.distill_weight or 1.0
    trainer = DFlashTrainer(args)
    for samples, cache in ((trainer.train_samples, trainer.feature_cache), (trainer.eval_samples, trainer.heldout_cache)):
        for start in range(0, len(samples), args.batch_size):
            group = samples[start : start + args.batch_size]
            batch = trainer.block_batch(group, epoch=0)
            with torch.no_grad():
                trainer.features_for(batch, final_hidden=True, cache=cache)
            if (start // args.batch_size) % 50 == 0 or start + len(group) == len(samples):
                print(f"feature cache: {start + len(group)}/{len(samples)}", file=sys.stderr)


def _at_budget(evals: list[dict], seconds: float) -> dict | None:
    """The last evaluation at or before `seconds` of training CPU time; a run stops at the first step that crosses
    its budget, so an evaluation less than one step's CPU time past `seconds` counts as at it."""
    last = evals[-1]
    per_step = last["train_cpu_seconds"] / max(1, last["step"])
    before = [r for r in evals if r["train_cpu_seconds"] <= seconds + 1.5 * per_step]
    return before[-1] if before else None


def table(folder: Path, budget: float | None) -> str:
    from hf_dflash.training import plot_training_curves, read_log

    runs = {p.parent.name: read_log(p) for p in sorted(folder.glob("*/training_log.jsonl"))}
    runs = {name: records for name, records in runs.items() if any(r["kind"] == "eval" for r in records)}
    if not runs:
        raise SystemExit(f"no run with held-out evaluations under {folder}")
    if budget is None:
        budget = min(max(r["train_cpu_seconds"] for r in records) for records in runs.values())
    fractions = (0.25, 0.5, 0.75, 1.0)
    lines = [f"Held-out expected tau at equal training CPU time (budget {budget / 60:.1f} CPU-min; the last evaluation "
             "at or before each point).", "",
             "| recipe | " + " | ".join(f"tau @ {f:.0%}" for f in fractions) + " | acc k=1 | acc k=2 | steps | "
             "tokens / CPU-min | blocks / CPU-min | generate tau |",
             "|---|" + "---|" * (len(fractions) + 6)]
    for name, records in runs.items():
        evals = [r for r in records if r["kind"] == "eval"]
        points = [_at_budget(evals, f * budget) for f in fractions]
        last = points[-1] or evals[-1]
        minutes = max(last["train_cpu_seconds"], 1e-9) / 60
        accuracy = last["heldout"]["accuracy_by_position"]
        eval_file = folder / name / "eval.json"
        tau = json.loads(eval_file.read_text()).get("tau") if eval_file.exists() else None
        cells = [f"{p['heldout']['acceptance_length']:.3f}" if p else "-" for p in points]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {accuracy[0]:.3f} | "
                     f"{accuracy[1] if len(accuracy) > 1 else float('nan'):.3f} | {last['step']} | "
                     f"{last['tokens'] / minutes:,.0f} | {last['blocks'] / minutes:,.0f} | "
                     f"{'-' if tau is None else f'{tau:.3f}'} |")
    text = "\n".join(lines) + "\n"
    (folder / "table.md").write_text(text, encoding="utf-8")
    if plot_training_curves(runs, folder / "curves.png"):
        text += f"\nCurves: {folder / 'curves.png'}\n"
    return text


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "fill-cache":
        fill_cache(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    smoke = sub.add_parser("smoke-prompts")
    smoke.add_argument("--count", type=int, default=24)
    smoke.add_argument("--seed", type=int, default=0)
    smoke.add_argument("--output", type=Path, required=True)
    tab = sub.add_parser("table")
    tab.add_argument("folder", type=Path)
    tab.add_argument("--budget", type=float, default=None, help="CPU seconds (default: the shortest run's)")
    sub.add_parser("fill-cache", help="(arguments: those of `hf-dflash train`)")
    args = parser.parse_args()
    if args.command == "smoke-prompts":
        smoke_prompts(args.count, args.output, args.seed)
    else:
        print(table(args.folder, args.budget), end="")


if __name__ == "__main__":
    main()
