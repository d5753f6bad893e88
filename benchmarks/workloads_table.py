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


def bound(per_method: dict, key: str = "speedup") -> float | None:
    """The default's speed over the faster of plain and prompt lookup (the >= 0.95 bound): its speedup over plain
    divided by max(1, prompt lookup's)."""
    default, lookup = per_method.get("dflash_default"), per_method.get("pld")
    if default is None or default.get(key) is None:
        return None
    return default[key] / max(1.0, lookup[key] if lookup and lookup.get(key) else 1.0)


def prompt_tokens(report: dict, dataset: str) -> int:
    return int(statistics.median(p["prompt_tokens"] for p in report["per_prompt"] if p["dataset"] == dataset))


def cell(entry: dict, with_tau: bool, key: str = "speedup") -> str:
    if entry.get(key) is None:
        return "-"
    text = f"{entry[key]:.2f}x"
    if with_tau and entry.get("tau") is not None:
        text += f" ({entry['tau']:.2f})"
    return text if entry["identical"] else text + " **differs**"


def table(runs: dict[str, dict], key: str = "speedup", only: tuple[str, ...] = ()) -> str:
    """Category x run rows, one column per method: `key` "speedup" (end to end) or "tpot_speedup" (time per output
    token after the first), with tau for ours; `only`: these categories."""
    methods = [m for m in METHOD_NAMES if any(m in r["results"].get("overall", {}) for r in runs.values())]
    header = ("| category | prompt tokens | run | " + " | ".join(METHOD_NAMES[m] for m in methods)
              + " | default / max(plain, lookup) |")
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    datasets = [d for d in dict.fromkeys(d for r in runs.values() for d in r["results"]) if d != "overall"]
    datasets.append("overall")  # last, and it covers each run's own categories
    for dataset in [d for d in datasets if not only or d in only]:
        for label, report in runs.items():
            per_method = report["results"].get(dataset)
            if per_method is None:
                continue
            tokens = "all" if dataset == "overall" else str(prompt_tokens(report, dataset))
            cells = [cell(per_method[m], m.startswith("dflash"), key) if m in per_method else "-" for m in methods]
            if set(cells[1:]) == {"-"}:
                continue  # a run that did not time this (e.g. prefills before the bench timed them)
            ratio = bound(per_method, key)
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
    """Speedup end to end, TPOT speedup (after the first token), and tau against prompt tokens: a colour per method,
    a line style per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = dict(zip(METHOD_NAMES, ("black", "tab:blue", "tab:orange", "tab:green", "tab:red")))
    styles = ["-", "-.", "--", ":"]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    panels = (("speedup", "speedup over plain generate, end to end"),
              ("tpot_speedup", "TPOT speedup (after the first token)"), ("tau", "tau (tokens per verification)"))
    for style, (label, report) in zip(styles, runs.items()):
        sweep = [d for d in SWEEP if d in report["results"]]
        tokens = [prompt_tokens(report, d) for d in sweep]
        for method, name in METHOD_NAMES.items():
            if method == "plain" or not sweep or method not in report["results"][sweep[0]]:
                continue
            for axis, (key, _) in zip(axes, panels):
                values = [report["results"][d][method].get(key) for d in sweep]
                if any(v is None for v in values):
                    continue
                axis.plot(tokens, values, style, marker="o", color=colours[method], label=f"{name}, {label}")
    for axis, (_, title) in zip(axes, panels):
        axis.set_xscale("log", base=2)
        axis.set_xlabel("prompt tokens")
        axis.set_title(title, fontsize=10)
        axis.grid(alpha=0.3)
    for axis in axes[:2]:
        axis.axhline(1.0, color="gray", linewidth=0.8)
    axes[0].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def with_tpot_speedup(report: dict) -> dict:
    """`report` with `tpot_speedup` in each entry: reports written before the rename call it `decode_speedup` (the
    ratio of per-token times after the prompt, over all new tokens: within a token of TPOT's)."""
    for per_method in report["results"].values():
        for entry in per_method.values():
            if "tpot_speedup" not in entry and "decode_speedup" in entry:
                entry["tpot_speedup"] = entry["decode_speedup"]
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="LABEL=bench.json")
    parser.add_argument("--plot", default=None)
    args = parser.parse_args()
    runs = {}
    for item in args.runs:
        label, path = item.rsplit("=", 1)
        with open(path, encoding="utf-8") as f:
            runs[label] = with_tpot_speedup(json.load(f))
    long = ("doc_qa", "summarize", *SWEEP)
    print("End to end:\n\n" + table(runs) + "\n\nTPOT speedup (time per output token after the first; each call's "
          "prefill left out, both sides):\n\n" + table(runs, "tpot_speedup", long) + "\n\n" + stamps(runs))
    if args.plot:
        plot(runs, args.plot)


if __name__ == "__main__":
    main()
