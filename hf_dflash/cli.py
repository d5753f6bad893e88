# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""The ``hf-dflash`` command line (also ``python -m hf_dflash``): ``demo``, ``bench``, ``regenerate``, ``train``.

Every subcommand is declared here and calls the package's Python API; nothing in the package imports this module.
``regenerate`` and ``train`` take one flag per field of their arguments dataclass. A user error (a ``ValueError``:
a bad value, a missing file, a drafter that does not fit its target) prints one line on stderr and exits with code
2; ``--verbose`` shows the traceback instead.

Example:
    >>> build_parser().parse_args(["demo", "--max-new-tokens", "32"]).max_new_tokens
    32
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging as std_logging
import sys
from pathlib import Path
from typing import Any

import torch
from transformers.utils import logging

from .data.regenerate import RegenerationArguments, regenerate
from .evaluation.batch import run_batch_benchmark
from .evaluation.bench import DEFAULT_PRESET, METHODS, PRESETS, Sampling, all_identical, run_benchmark
from .evaluation.demo import demo_dtype, demo_exit_code, run_demo, summary_line
from .evaluation.prompts import ALL_DATASETS, check_dataset_names, load_eval_prompts
from .evaluation.report import batch_markdown, markdown_report, save_plot
from .models import load_drafter, load_target, resolve_device
from .training import DFlashTrainingArguments, train


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions as written; every option's help ends with its default (unless it states one, or is a switch)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.default is argparse.SUPPRESS or action.nargs == 0 or "default" in text or not action.option_strings:
            return text
        if action.required:
            return f"{text} (required)"
        return f"{text} (default: {'none' if action.default is None else '%(default)s'})"


# ----------------------------------------------------------------------------------------------------------------------
# dataclass -> flags
def add_dataclass_arguments(parser: argparse.ArgumentParser, cls) -> None:
    """One `--flag` per dataclass field (underscores -> dashes, or `metadata["flag"]`), help from the metadata."""
    for f in dataclasses.fields(cls):
        meta = f.metadata
        flag = meta.get("flag", "--" + f.name.replace("_", "-"))
        kwargs: dict[str, Any] = {"dest": f.name, "help": meta.get("help")}
        if f.type in (bool, "bool"):
            kwargs["action"] = "store_false" if f.default is True else "store_true"
        else:
            kwargs["type"] = meta.get("type", _scalar_type(f.type))
            if meta.get("required"):
                kwargs["required"] = True
            else:
                kwargs["default"] = f.default
            if "choices" in meta:
                kwargs["choices"] = meta["choices"]
            for key in ("nargs", "metavar"):
                if key in meta:
                    kwargs[key] = meta[key]
        parser.add_argument(flag, *meta.get("aliases", ()), **kwargs)


def _scalar_type(annotation) -> type:
    text = str(annotation)
    for name, kind in (("int", int), ("float", float)):
        if text.startswith(name):
            return kind
    return str


def dataclass_from_namespace(cls, namespace: argparse.Namespace):
    """The dataclass instance whose fields are read from the parsed command line."""
    return cls(**{f.name: getattr(namespace, f.name) for f in dataclasses.fields(cls) if hasattr(namespace, f.name)})


def add_dataclass_command(subparsers, name: str, cls, run, help: str, description: str) -> None:
    """Register `hf-dflash NAME`: one flag per field of dataclass `cls`; prints `run(instance)` as JSON."""
    parser = subparsers.add_parser(name, help=help, description=description, formatter_class=HelpFormatter)
    add_dataclass_arguments(parser, cls)
    parser.add_argument("--verbose", action="store_true", help="Log progress details; show tracebacks of errors.")

    def command(namespace: argparse.Namespace) -> int:
        print(json.dumps(run(dataclass_from_namespace(cls, namespace))))
        return 0

    parser.set_defaults(func=command)


# ----------------------------------------------------------------------------------------------------------------------
# demo and bench: a target, a drafter, a device
def add_model_arguments(parser: argparse.ArgumentParser, tokens_help: str = "new tokens per prompt") -> None:
    """The target/drafter/device options shared by ``hf-dflash demo`` and ``hf-dflash bench`` (`tokens_help`: the
    help of --max-new-tokens, whose default each command sets)."""
    parser.add_argument("--target", default=None, help="Hub id or folder (default: offline SmolLM2-135M-Instruct)")
    parser.add_argument("--drafter", default=None, help="Hub id or folder (default: the shipped demo drafter)")
    parser.add_argument("--device", default="auto", help="auto (a GPU when there is one, else the CPU), cpu, cuda...")
    parser.add_argument("--dtype", default="auto", help="auto (float32 on CPU, bfloat16 on GPUs), float32, bfloat16...")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--max-new-tokens", type=int, default=None, help=tokens_help)
    parser.add_argument("--verbose", action="store_true", help="log progress details; show tracebacks of errors")


def load_models_from_args(args: argparse.Namespace, with_drafter: bool = True):
    """(target, tokenizer, drafter or None, device) from the options of :func:`add_model_arguments`."""
    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    target, tokenizer = load_target(args.target, dtype=args.dtype, device=device)
    drafter = load_drafter(args.drafter, target) if with_drafter else None
    return target, tokenizer, drafter, device


def comma_list(value: str) -> list[str]:
    """``"a, b,c"`` -> ``["a", "b", "c"]``."""
    return [item.strip() for item in value.split(",") if item.strip()]


def add_demo_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "demo", help="answer a few prompts with and without a DFlash drafter", formatter_class=HelpFormatter,
        description="Answer a few prompts with and without the drafter, check that the outputs are identical, show\n"
        "tau and the speedup. Offline by default: SmolLM2-135M-Instruct from PyPI (in float32 on a GPU too, for the\n"
        "identity check) and the shipped drafter. Exit code 1 when an output with the drafter differs from plain\n"
        "generate (in bf16, or fp32 on a GPU: unless it first differs at a near-tie of plain's own logits).",
    )
    add_model_arguments(parser)
    parser.add_argument("--prompt", dest="prompts", nargs="+", default=None,
                        help="one or more prompts (default: a chat question, a code edit, a question about a long document)")
    parser.set_defaults(func=demo_command, max_new_tokens=128)


def layers(count: int) -> str:
    """"1 layer", "30 layers"."""
    return f"{count} layer{'' if count == 1 else 's'}"


def demo_command(args: argparse.Namespace) -> int:
    asked, args.dtype = args.dtype, demo_dtype(args.target, args.dtype)
    target, tokenizer, drafter, device = load_models_from_args(args)
    name = getattr(target.config, "_name_or_path", "") or type(target).__name__
    print(
        f"target {name} ({layers(target.config.get_text_config().num_hidden_layers)}) on {device}/"
        f"{str(target.dtype).removeprefix('torch.')}, {torch.get_num_threads()} threads | drafter "
        f"{getattr(drafter.config, '_name_or_path', '') or 'untrained'} ({layers(drafter.config.num_hidden_layers)}, "
        f"block {drafter.config.block_size})"
        + ("" if device.type == "cpu" or asked == args.dtype else
           "\nfloat32 on this GPU too, for the identity check (bf16 may break near-ties); --dtype bfloat16 times bf16")
    )
    comparisons = run_demo(target, tokenizer, drafter, args.prompts, args.max_new_tokens)
    print("\n" + summary_line(comparisons, device))
    return demo_exit_code(comparisons)


def add_bench_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "bench", formatter_class=HelpFormatter,
        help="benchmark DFlash against plain decoding, prompt lookup, early exit and transformers' DFlash",
        description="DFlash against plain decoding and the other lossless accelerators, side by side: every method\n"
        "runs on every prompt in one process (interleaved), outputs are checked against plain generate, and tau,\n"
        "tokens/s, speedup (end to end), TTFT, TPOT and its speedup, and DFlash's per-cycle costs are reported.\n"
        "Exit code 1 when any output differs (greedy; --temperature samples instead: timed, not compared).\n"
        "Presets (--preset; --datasets and --max-new-tokens override them):\n"
        + "\n".join(f"  {name}: {', '.join(p.datasets)}, {p.max_new_tokens} tokens ({p.summary})"
                    for name, p in PRESETS.items()),
    )
    add_model_arguments(parser, f"new tokens per prompt (default: {DEFAULT_PRESET.max_new_tokens}, or the preset's)")
    parser.add_argument("--preset", choices=list(PRESETS), default=None,
                        help="a named set of datasets and max_new_tokens (listed above)")
    parser.add_argument("--datasets", type=comma_list, default=None,
                        help=f"comma list of {','.join(ALL_DATASETS)} (default: the short-question sets "
                        f"{','.join(DEFAULT_PRESET.datasets)}, or the preset's)")
    parser.add_argument("--limit", type=int, default=10, help="prompts per dataset")
    parser.add_argument("--repeats", type=int, default=1,
                        help="rounds over each dataset; each method's faster run of a prompt counts (a noisy machine)")
    parser.add_argument("--methods", type=comma_list, default=",".join(METHODS),
                        help=f"comma list of {','.join(METHODS)}; plain always runs")
    parser.add_argument("--early-exit-layer", type=int, default=None, help="default: a third of the target's depth")
    parser.add_argument("--temperature", type=float, default=0.0,
                        help="0: greedy, every output checked against plain generate's; above 0: sampled (with "
                        "--top-p), every method of a prompt seeded alike from --seed, timed side by side, not compared")
    parser.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling's top_p (with --temperature)")
    parser.add_argument("--seed", type=int, default=0, help="the first seed of sampled runs")
    parser.add_argument("--json", default=None,
                        help="write the report as JSON to this file; until then each finished prompt is kept in "
                        "FILE.progress.jsonl, and rerunning the same command after a kill resumes from it")
    parser.add_argument("--markdown", default=None, help="write the tables as Markdown to this file")
    parser.add_argument("--plot", default=None, help="write a PNG plot to this file (needs matplotlib)")
    parser.add_argument("--batch-sizes", type=comma_list, default=None,
                        help="instead of the method comparison: plain vs DFlash tokens/s at these batch sizes, "
                        "e.g. 1,4,8,16")
    parser.set_defaults(func=bench_command)


def with_preset(args: argparse.Namespace) -> argparse.Namespace:
    """The bench's arguments with ``datasets`` and ``max_new_tokens`` filled: each explicit flag, else the preset's
    (``--preset``), else the default's (``DEFAULT_PRESET``: the short-question sets, 256 tokens).

    Example:
        >>> args = with_preset(build_parser().parse_args(["bench", "--preset", "long-documents"]))
        >>> args.datasets, args.max_new_tokens
        (['context_2k', 'context_4k', 'context_8k'], 256)
    """
    preset = PRESETS.get(args.preset, DEFAULT_PRESET)
    datasets = list(preset.datasets) if args.datasets is None else args.datasets
    max_new_tokens = preset.max_new_tokens if args.max_new_tokens is None else args.max_new_tokens
    return argparse.Namespace(**{**vars(args), "datasets": datasets, "max_new_tokens": max_new_tokens})


def write_outputs(args: argparse.Namespace, report, text: str) -> None:
    """Print the Markdown; write it and the JSON report where --markdown / --json ask."""
    print(text)
    if args.json:
        partial = Path(args.json + ".tmp")
        partial.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        partial.replace(args.json)  # atomic: a kill leaves the old report or the new one, never half of one
    if args.markdown:
        Path(args.markdown).write_text(text, encoding="utf-8")


def bench_command(args: argparse.Namespace) -> int:
    """Exit code 0 when every method's output equals plain generate on every prompt, else 1."""
    args = with_preset(args)
    unknown = [m for m in args.methods if m not in METHODS]
    if unknown:
        raise ValueError(f"--methods: unknown {unknown}; choose from {list(METHODS)}.")
    check_dataset_names(args.datasets)
    sampling = Sampling(args.temperature, args.top_p, args.seed)  # bad values raise before any model loads
    if args.batch_sizes and not sampling.greedy:
        raise ValueError("--temperature applies to the method comparison; --batch-sizes decodes greedily (drop one "
                         "of them).")
    with_drafter = bool(args.batch_sizes) or any("dflash" in m for m in args.methods)
    args.dtype = demo_dtype(args.target, args.dtype)  # the offline SmolLM2 in float32 on a GPU too, as the demo
    target, tokenizer, drafter, _ = load_models_from_args(args, with_drafter)
    prompts = {name: load_eval_prompts(name, args.limit, tokenizer) for name in args.datasets}
    if args.batch_sizes:
        sizes = [int(b) for b in args.batch_sizes]
        pool = [p for texts in prompts.values() for p in texts]
        rows = run_batch_benchmark(target, tokenizer, drafter, pool, sizes, args.max_new_tokens)
        write_outputs(args, rows, batch_markdown(rows))
        return 0 if all(r["identical"] for r in rows) else 1
    progress = Path(args.json + ".progress.jsonl") if args.json else None
    report = run_benchmark(
        target, tokenizer, drafter, prompts, args.methods, args.max_new_tokens, args.early_exit_layer,
        repeats=args.repeats, progress=progress, sampling=sampling,
    )
    write_outputs(args, report, markdown_report(report))
    if progress is not None:
        progress.unlink(missing_ok=True)  # the report holds it all now
    if args.plot:
        save_plot(report, args.plot)
    if not all_identical(report):
        print("Some outputs differ from plain generate (see the 'identical' column).")
        return 1
    return 0


# ----------------------------------------------------------------------------------------------------------------------
# the parser
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hf-dflash", description="Lossless block-diffusion speculative decoding.")
    subparsers = parser.add_subparsers(dest="command", required=True)
    add_demo_parser(subparsers)
    add_bench_parser(subparsers)
    add_dataclass_command(
        subparsers, "regenerate", RegenerationArguments, regenerate,
        help="regenerate training responses with the target, in-process or on servers (resumable JSONL)",
        description="Generate the target's own responses to a prompt set, as DFlash training data. Resumable: rerun\n"
        "the same command after a kill. In-process, or with --server URL [URL ...] on OpenAI-compatible servers\n"
        "that already serve the target (vLLM, SGLang, `transformers serve`).",
    )
    add_dataclass_command(
        subparsers, "train", DFlashTrainingArguments,
        lambda args: {k: v for k, v in train(args).items() if k != "generate"},
        help="train a DFlash drafter on regenerated data (runs under `accelerate launch` on N GPUs)",
        description="Train a DFlash drafter against its frozen target. N GPUs: accelerate launch -m hf_dflash train.",
    )
    return parser


def configure_logging(verbose: bool) -> None:
    """Our loggers (`hf_dflash.*`) follow transformers' verbosity and print through a handler of their own:
    they are not children of the `transformers` logger, so `set_verbosity_*` alone would not reach them."""
    level = std_logging.INFO if verbose else std_logging.WARNING
    logging.set_verbosity(level)
    package_logger = std_logging.getLogger("hf_dflash")
    package_logger.setLevel(level)
    if not package_logger.handlers:
        handler = std_logging.StreamHandler()
        handler.setFormatter(std_logging.Formatter("[%(name)s] %(message)s"))
        package_logger.addHandler(handler)
        package_logger.propagate = False


def main(argv: list[str] | None = None) -> int:
    """Run one subcommand; returns its exit code (2 with a one-line message for a ValueError)."""
    args = build_parser().parse_args(argv)
    verbose = getattr(args, "verbose", False)
    configure_logging(verbose)
    try:
        return int(args.func(args) or 0)
    except ValueError as error:
        if verbose:
            raise
        print(f"hf-dflash {args.command}: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
