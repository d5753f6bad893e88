# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""The shipped drafter next to a quantized or bf16 target: ``hf-dflash bench``'s comparison on a
target whose linear layers are quantized to int8 weights by torchao (weight-only: activations stay in the target's
dtype), or in another dtype, with the drafter in the target's dtype (as ``load_drafter`` casts it) or in its own
(``--drafter-dtype``). Every output is checked against that same target's own plain ``generate``.

    OMP_NUM_THREADS=1 python benchmarks/bench_quantized_target.py --quantization int8 --limit 2 \
        --max-new-tokens 64 --threads 1 --methods plain,pld,dflash,dflash_default --json int8.json

torchao is not a dependency of hf-dflash: ``pip install --no-deps torchao`` (it declares no torch requirement; pip
must not replace the torch installed).
"""

import argparse
import json
import sys
from pathlib import Path

import torch

from hf_dflash.evaluation.bench import METHODS, all_identical, run_benchmark
from hf_dflash.evaluation.prompts import DATASETS, load_eval_prompts
from hf_dflash.evaluation.report import markdown_report
from hf_dflash.models import load_drafter, load_target


def int8_weight_only(model: torch.nn.Module) -> torch.nn.Module:
    """`model` with every nn.Linear's weight quantized to int8 per output channel by torchao, in place (as
    transformers' ``TorchAoConfig(Int8WeightOnlyConfig())`` does at load time)."""
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    quantize_(model, Int8WeightOnlyConfig())
    return model


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default=None, help="default: the offline SmolLM2-135M-Instruct")
    parser.add_argument("--drafter", default=None, help="default: the shipped demo drafter")
    parser.add_argument("--dtype", default="float32", help="the target's dtype (default: float32)")
    parser.add_argument("--drafter-dtype", default=None, help="default: the target's dtype (as load_drafter casts)")
    parser.add_argument("--quantization", choices=("none", "int8"), default="int8")
    parser.add_argument("--datasets", default=",".join(DATASETS))
    parser.add_argument("--limit", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--methods", default="plain,pld,dflash,dflash_default")
    parser.add_argument("--json", required=True)
    parser.add_argument("--markdown", default=None)
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    methods = [m for m in args.methods.split(",") if m]
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise ValueError(f"--methods: unknown {unknown}; choose from {list(METHODS)}.")
    target, tokenizer = load_target(args.target, dtype=args.dtype, device="cpu")
    drafter = load_drafter(args.drafter, target)
    if args.drafter_dtype:
        drafter = drafter.to(getattr(torch, args.drafter_dtype))
    if args.quantization == "int8":
        target = int8_weight_only(target)
    prompts = {name: load_eval_prompts(name, args.limit, tokenizer) for name in args.datasets.split(",")}
    report = run_benchmark(target, tokenizer, drafter, prompts, methods, args.max_new_tokens)
    report["config"]["target_quantization"] = args.quantization
    report["config"]["drafter_dtype"] = str(next(drafter.parameters()).dtype).removeprefix("torch.")
    Path(args.json).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    markdown = markdown_report(report)
    print(markdown)
    if args.markdown:
        Path(args.markdown).write_text(markdown, encoding="utf-8")
    return 0 if all_identical(report) else 1


if __name__ == "__main__":
    sys.exit(main())
