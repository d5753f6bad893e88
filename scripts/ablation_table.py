"""Markdown table of a DFlare ablation run by scripts/ablate_smollm2_dflare.sh (one row per variant).

    python scripts/ablation_table.py ~/.cache/hf_dflash/train/ablation

Rows appear for the variant folders that exist ("-continued": made with CONTINUE=1).
"""

import argparse
import json
from pathlib import Path


VARIANTS = {
    "dflash": "DFlash (fc, shared K/V, constant gamma)",
    "fusion": "+ layer-wise fusion only",
    "split_kv": "+ split context K/V only",
    "progressive": "+ progressive gamma only",
    "dflare": "DFlare (all three)",
    # CONTINUE=1: trained for the same epochs again from the weights above (fresh optimizer and schedule)
    "dflash-continued": "DFlash, continued (912 steps in all)",
    "dflare-continued": "DFlare, continued (912 steps in all)",
}


def row(folder: Path, variant: str) -> str | None:
    eval_file, bench_file = folder / variant / "eval.json", folder / f"bench-{variant}.json"
    if not eval_file.exists():
        return None
    results = json.loads(eval_file.read_text())
    heldout = results["heldout"]
    first = heldout["accuracy_by_position"][0]
    bench = json.loads(bench_file.read_text())["results"]["overall"]["dflash"] if bench_file.exists() else {}
    layers = json.loads((folder / variant / "config.json").read_text()).get("num_hidden_layers")
    tau = results.get("tau")
    params = (folder / variant / "model.safetensors").stat().st_size / 4 / 1e6  # fp32 weights
    return (f"| {VARIANTS[variant]} | {results['steps']} | {heldout['loss']:.3f} | {first:.3f} | "
            f"{heldout['acceptance_length']:.3f} | {tau:.3f} | {bench.get('tau', float('nan')):.3f} | "
            f"{bench.get('speedup', float('nan')):.2f}x | {layers} | {params:.2f}M |"
            if tau is not None else None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path)
    folder = parser.parse_args().folder
    print("| variant | steps | held-out loss | held-out acc. k=1 | held-out expected tau | generate tau (held-out "
          "prompts) | bench tau | bench speedup | layers | parameters |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for variant in VARIANTS:
        line = row(folder, variant)
        if line:
            print(line)


if __name__ == "__main__":
    main()
