# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""The benchmark's report: Markdown tables (methods side by side, DFlash's per-cycle costs and acceptance) and a
PNG plot.
"""

from pathlib import Path

from transformers.utils import logging

from .methods import METHOD_LABELS

logger = logging.get_logger(__name__)


def _fmt(value, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def machine_line(machine: dict | None) -> list[str]:
    """The run's stamp as one line (none for a report that has no stamp).

    Example:
        >>> machine_line({"date": "2026-12-03T08:00:00Z", "commit": "abc", "cpu": "AMD EPYC", "cores": 2,
        ...               "threads": 1, "torch": "2.13.0", "transformers": "5.24.0", "hf_dflash": "0.1.0",
        ...               "load_average_1min": {"before": 1.02, "after": 1.1}, "other_load_cores": 0.98})
        ['Run 2026-12-03T08:00:00Z, commit abc, AMD EPYC (2 cores), 1 threads, torch 2.13.0, transformers 5.24.0, hf-dflash 0.1.0; load average 1.02 before, 1.1 after; other processes kept 0.98 cores busy.']
    """
    if not machine:
        return []
    load = machine.get("load_average_1min") or {}
    return [f"Run {machine.get('date')}, commit {machine.get('commit')}, {machine.get('cpu')} ({machine.get('cores')} "
            f"cores), {machine.get('threads')} threads, torch {machine.get('torch')}, transformers "
            f"{machine.get('transformers')}, hf-dflash {machine.get('hf_dflash')}; load average {load.get('before')} "
            f"before, {load.get('after')} after; other processes kept {machine.get('other_load_cores')} cores busy."]


def decoding(config: dict) -> str:
    """How the run decoded, for the report's first line.

    Example:
        >>> decoding({}), decoding({"sampling": {"temperature": 0.7, "top_p": 0.9, "seed": 0}})
        ('greedy', 'sampled (temperature 0.7, top_p 0.9, seed 0)')
    """
    sampling = config.get("sampling")
    if not sampling:
        return "greedy"
    return f"sampled (temperature {sampling['temperature']}, top_p {sampling['top_p']}, seed {sampling['seed']})"


def identity_cell(identical: bool | None) -> str:
    """``yes``, ``**NO**``, or ``sampled`` (draws: nothing to compare token for token)."""
    return "sampled" if identical is None else "yes" if identical else "**NO**"


def markdown_report(report: dict) -> str:
    """The report as Markdown tables: methods side by side, then DFlash's per-cycle costs and acceptance.

    Example:
        >>> print(markdown_report(report))  # doctest: +SKIP
    """
    config, results = report["config"], report["results"]
    lines = [
        f"Target `{config['target']}`, drafter `{config['drafter']}` (block {config['block_size']}), "
        f"{config['device']}/{config['dtype']}, {config['threads']} threads, {decoding(config)}, max_new_tokens="
        f"{config['max_new_tokens']}, prompts per dataset: {config['datasets']}.",
        *machine_line(report.get("machine")),
        "",
        "| dataset | method | tau | tokens/s (median) | speedup (median) | TTFT ms | TPOT ms | TPOT speedup "
        "| identical |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, per_method in results.items():
        for method, entry in per_method.items():
            lines.append(
                f"| {name} | {METHOD_LABELS[method]} | {_fmt(entry['tau'])} | {_fmt(entry['tokens_per_s'], '.1f')} | "
                f"{_fmt(entry['speedup'])}x | {_fmt(entry.get('ttft_ms'), '.1f')} | "
                f"{_fmt(entry.get('tpot_ms'), '.1f')} | {_fmt(entry.get('tpot_speedup'))}x | "
                f"{identity_cell(entry['identical'])} |"
            )
    costs = {name: m["dflash"] for name, m in results.items() if "dflash" in m and "cycles" in m["dflash"]}
    if costs:
        lines += [
            "",
            "hf-dflash per cycle (medians over prompts): ceiling = tau x t(1) / (t(verify) + t(draft)).",
            "",
            "| dataset | tau | t(1) ms | t(draft) ms | t(verify) ms | ceiling | measured |",
            "|---|---|---|---|---|---|---|",
        ]
        for name, e in costs.items():
            lines.append(
                f"| {name} | {_fmt(e['tau'])} | {_fmt(e['t1_ms'], '.1f')} | {_fmt(e['t_draft_ms'], '.1f')} | "
                f"{_fmt(e['t_verify_ms'], '.1f')} | {_fmt(e['ceiling'])}x | {_fmt(e['speedup'])}x |"
            )
        block = max(len(e["acceptance_by_position"]) for e in costs.values()) + 1
        lines += [
            "",
            "hf-dflash acceptance rate by block position k (fraction of verifications accepting draft k).",
            "",
            "| dataset | " + " | ".join(str(k) for k in range(1, block)) + " |",
            "|---|" + "---|" * (block - 1),
        ]
        for name, e in costs.items():
            lines.append(f"| {name} | " + " | ".join(f"{p:.2f}" for p in e["acceptance_by_position"]) + " |")
    chosen = {name: m["dflash_default"]["chosen_drafts"] for name, m in results.items()
              if "chosen_drafts" in m.get("dflash_default", {})}
    if chosen:
        lines += ["", "hf-dflash default (cost-aware): cycles by drafts verified (0 = a plain target step).", ""]
        lines += [f"- {name}: " + ", ".join(f"{k}: {n}" for k, n in counts.items())
                  + f" (prompt-lookup drafts in {results[name]['dflash_default'].get('lookup_cycles', 0)})"
                  for name, counts in chosen.items()]
    return "\n".join(lines) + "\n"


def save_plot(report: dict, path: str | Path) -> bool:
    """PNG: speedup per dataset and method (left), DFlash acceptance by block position (right).

    Needs matplotlib (``pip install 'hf-dflash[bench]'``); returns False with a message when it is missing.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        logger.warning(f"matplotlib is not installed: skipping the plot {path} (pip install matplotlib).")
        return False
    results = report["results"]
    datasets = list(results)
    methods = [m for m in report["config"]["methods"] if m != "plain"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    width = 0.8 / max(1, len(methods))
    for i, method in enumerate(methods):
        values = [results[d][method]["speedup"] or 0.0 for d in datasets]
        left.bar([x + i * width for x in range(len(datasets))], values, width, label=METHOD_LABELS[method])
    left.axhline(1.0, color="black", linewidth=0.8)
    left.set_xticks([x + width * (len(methods) - 1) / 2 for x in range(len(datasets))], datasets)
    left.set_ylabel("speedup vs plain generate (median)")
    left.legend(fontsize=8)
    for d in datasets:
        positions = results[d].get("dflash", {}).get("acceptance_by_position")
        if positions:
            right.plot(range(1, len(positions) + 1), positions, marker="o", label=d)
    right.set_xlabel("block position k")
    right.set_ylabel("acceptance rate")
    right.set_ylim(0, 1)
    right.legend(fontsize=8)
    config = report["config"]
    fig.suptitle(f"{Path(config['target']).name}: {config['device']}, {config['dtype']}, {config['threads']} threads")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def batch_markdown(rows: list[dict]) -> str:
    lines = [
        "| batch | plain tok/s | DFlash tok/s | speedup | tau | identical |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['batch_size']} | {r['plain_tokens_per_s']:.1f} | {r['dflash_tokens_per_s']:.1f} | "
            f"{r['speedup']:.2f}x | {r['tau']:.2f} | {'yes' if r['identical'] else 'NO'} |"
        )
    return "\n".join(lines) + "\n"
