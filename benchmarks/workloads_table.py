# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""The workloads tables of BENCHMARKS.md from `hf-dflash bench` JSONs: category x method x run (threads, load), the
default policy against the faster of plain generate and prompt lookup, and the context-length sweep as a plot
(speedup and tau against prompt tokens, per method).

    python benchmarks/workloads_table.py "1 thread, quiet=q1.json" "2 threads, quiet=q2.json" \\
        "1 thread, loaded=l1.json" --plot sweep.png > table.md
"""

import argparse
import json
import statistics

SWEEP = ("context_512", "context_2k", "context_4k", "context_8k")
METHOD_NAMES = {"plain": "plain", "pld": "prompt lookup", "dflash": "full blocks", "dflash_default": "default",
                "dflash_default_tree": "default + tree"}


def bound(per_method: dict) -> float | None:
    """The default's speed over the faster of plain and prompt lookup (the >= 0.95 bound): its speedup over plain
    divided by max(1, prompt lookup's)."""
    default, lookup = per_method.get("dflash_default"), per_method.get("pld")
    if default is None:
        return None
    return default["speedup"] / max(1.0, lookup["speedup"] if lookup else 1.0)


def prompt_tokens(report: dict, dataset: str) -> int:
    return int(statistics.median(p["prompt_tokens"] for p in report["per_prompt"] if p["dataset"] == dataset))


def cell(entry: dict, with_tau: bool) -> str:
    text = f"{entry['speedup']:.2f}x"
    if with_tau and entry.get("tau") is not None:
        text += f" ({entry['tau']:.2f})"
    return text if entry["identical"] else text + " **differs**"


def table(runs: dict[str, dict]) -> str:
    methods = [m for m in METHOD_NAMES if any(m in r["results"].get("overall", {}) for r in runs.values())]
    header = ("| category | prompt tokens | run | " + " | ".join(METHOD_NAMES[m] for m in methods)
              + " | default / max(plain, lookup) |")
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    datasets = list(dict.fromkeys(d for r in runs.values() for d in r["results"]))
    for dataset in datasets:
        for label, report in runs.items():
            per_method = report["results"].get(dataset)
            if per_method is None:
                continue
            tokens = "all" if dataset == "overall" else str(prompt_tokens(report, dataset))
            cells = [cell(per_method[m], m.startswith("dflash")) if m in per_method else "-" for m in methods]
            ratio = bound(per_method)
            lines.append(f"| {dataset} | {tokens} | {label} | " + " | ".join(cells)
                         + f" | {'-' if ratio is None else f'{ratio:.2f}'} |")
    return "\n".join(lines)


def stamps(runs: dict[str, dict]) -> str:
    lines = []
    for label, report in runs.items():
        m, c = report["machine"], report["config"]
        load = m.get("load_average_1min") or {}
        lines.append(f"- {label}: {m['date']}, commit {m['commit']}, {m['cpu']} ({m['cores']} cores), "
                     f"{c['threads']} threads, other processes kept {m.get('other_load_cores')} cores busy "
                     f"(load average {load.get('before')} -> {load.get('after')}), torch {m['torch']}, "
                     f"transformers {m['transformers']}, {c['max_new_tokens']} new tokens, prompts per category "
                     f"{sorted(set(c['datasets'].values()))}")
    return "\n".join(lines)


def plot(runs: dict[str, dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (speed, tau) = plt.subplots(1, 2, figsize=(11, 4))
    for label, report in runs.items():
        sweep = [d for d in SWEEP if d in report["results"]]
        if not sweep:
            continue
        tokens = [prompt_tokens(report, d) for d in sweep]
        for method, name in METHOD_NAMES.items():
            if method == "plain" or method not in report["results"][sweep[0]]:
                continue
            style = "-" if "quiet" in label else "--"
            speed.plot(tokens, [report["results"][d][method]["speedup"] for d in sweep], style, marker="o",
                       label=f"{name}, {label}")
            if method.startswith("dflash"):
                tau.plot(tokens, [report["results"][d][method]["tau"] for d in sweep], style, marker="o",
                         label=f"{name}, {label}")
    for axis, title in ((speed, "speedup over plain generate"), (tau, "tau (tokens per target verification)")):
        axis.set_xscale("log", base=2)
        axis.set_xlabel("prompt tokens")
        axis.set_title(title)
        axis.grid(alpha=0.3)
    speed.axhline(1.0, color="gray", linewidth=0.8)
    speed.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="LABEL=bench.json")
    parser.add_argument("--plot", default=None)
    args = parser.parse_args()
    runs = {}
    for item in args.runs:
        label, path = item.rsplit("=", 1)
        with open(path, encoding="utf-8") as f:
            runs[label] = json.load(f)
    print(table(runs) + "\n\n" + stamps(runs))
    if args.plot:
        plot(runs, args.plot)


if __name__ == "__main__":
    main()
