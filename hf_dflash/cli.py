# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""The ``hf-dflash`` command line (also ``python -m hf_dflash``).

Each subcommand lives with the code it drives: a module exposing ``add_parser(subparsers)`` that registers its
arguments and sets ``func`` (called with the parsed namespace, returns an exit code).
"""

import argparse
import importlib
import logging as std_logging
import sys

from transformers.utils import logging

COMMAND_MODULES = ("hf_dflash.demo", "hf_dflash.bench", "hf_dflash.data", "hf_dflash.training")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hf-dflash", description="Lossless block-diffusion speculative decoding.")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as error:
            if error.name != name:
                raise
            continue
        module.add_parser(subparsers)
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
    args = build_parser().parse_args(argv)
    configure_logging(getattr(args, "verbose", False))
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
