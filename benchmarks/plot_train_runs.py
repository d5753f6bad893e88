"""Learning curves of several drafter training runs on one CPU-time axis (BENCHMARKS.md, "Training").

Left: held-out expected acceptance length (the trainer's eval) against training CPU-minutes; right: held-out
accuracy by draft position at each run's last eval. A run is `LABEL=LOG.jsonl` (the trainer's `training_log.jsonl`),
with `@MINUTES` appended when it started from a drafter that had already trained that long (its curve starts there).
`--points LABEL=MIN:TAU,MIN:TAU` adds measured points that have no log (e.g. a table's quarter-budget values).
`--steps` puts optimizer steps on the x axis instead (`@STEPS` then offsets a run): runs trained on different CPUs
compare by step, since a CPU-second buys a different number of steps on each.

    python benchmarks/plot_train_runs.py --output benchmarks/results/2026-12-02-train-long-runs/train_smollm2_long_runs.png \\
        "run 1: DFlash, best recipe from scratch, 768 prompts=benchmarks/results/2026-12-01-train-run1-768/train_smollm2_v3_768_log.jsonl" \\
        "DFlare twin of run 1 (same data, recipe, steps)=benchmarks/results/2026-12-02-train-dflare-twin-768/train_smollm2_dflare_768_log.jsonl" \\
        "run 2: DFlash, best recipe from scratch, 1,536 prompts=benchmarks/results/2026-12-02-train-run2-1536/train_smollm2_v3_1536_log.jsonl" \\
        "run 3: shipped drafter trained on (from its 5,801 CPU-s)=benchmarks/results/2026-12-02-train-shipped-continuation/train_smollm2_cont_1536_log.jsonl@96.7" \\
        --points "20-min recipes, features cached: measured weights=0:1,5:1.264,10:1.312,15:1.415,20:1.503" \\
        --points "20-min recipes, features cached: sampled head=0:1,5:1.096,10:1.152,15:1.213,20:1.279"
"""

from __future__ import annotations

import argparse
import json


def eval_records(path: str) -> list[dict]:
    """The log's held-out eval records, in step order (a resumed run logs some steps twice: the last one counts)."""
    by_step = {}
    with open(path, encoding="utf-8") as file:
        for line in file:
            record = json.loads(line) if line.strip() else {}
            if record.get("kind") == "eval" and "heldout" in record:
                by_step[record["step"]] = record
    return [by_step[step] for step in sorted(by_step)]


def parse_run(spec: str) -> tuple[str, str, float]:
    """(label, log path, start: CPU-minutes, or steps with --steps) of `LABEL=PATH[@START]`."""
    label, _, rest = spec.rpartition("=")
    path, _, offset = rest.partition("@")
    return label, path, float(offset or 0.0)


def parse_points(spec: str) -> tuple[str, list[float], list[float]]:
    """(label, minutes, taus) of `LABEL=MIN:TAU,MIN:TAU`."""
    label, _, rest = spec.rpartition("=")
    pairs = [tuple(map(float, pair.split(":"))) for pair in rest.split(",")]
    return label, [m for m, _ in pairs], [t for _, t in pairs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="LABEL=LOG.jsonl[@START_CPU_MINUTES_OR_STEPS]")
    parser.add_argument("--points", action="append", default=[], help="LABEL=MIN:TAU,MIN:TAU (no log)")
    parser.add_argument("--steps", action="store_true", help="optimizer steps on the x axis, not CPU-minutes")
    parser.add_argument("--output", required=True)
    args = parser.parse_args()

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (curve, positions) = plt.subplots(1, 2, figsize=(11, 4))
    for axis in (curve, positions):  # 20 distinct colours: more than 10 runs share the default cycle's
        axis.set_prop_cycle(color=plt.cm.tab20.colors)
    for spec in args.runs:
        label, path, offset = parse_run(spec)
        records = eval_records(path)
        xs = [offset + (r["step"] if args.steps else r["train_cpu_seconds"] / 60) for r in records]
        curve.plot(xs, [r["heldout"]["acceptance_length"] for r in records], marker=".", label=label)
        last = records[-1]["heldout"]["accuracy_by_position"]
        positions.plot(range(1, len(last) + 1), last, marker=".", label=label)
    for spec in args.points:
        label, minutes, taus = parse_points(spec)
        curve.plot(minutes, taus, linestyle=":", marker="x", label=label)
    curve.set(title="learning curve", xlabel="optimizer steps" if args.steps else "training CPU minutes",
              ylabel="held-out expected acceptance length")
    positions.set(title="accuracy by position (last eval)", xlabel="draft position k", ylabel="held-out accuracy")
    for axis in (curve, positions):
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(args.output, dpi=100)
    print(args.output)


if __name__ == "__main__":
    main()
