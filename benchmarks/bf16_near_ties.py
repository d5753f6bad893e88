# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""Where a bf16 target's greedy output with an assistant first differs from its own plain ``generate``, is it a
near-tie (docs/generation.md, Numerics)? For the bench's prompts (``--limit`` per short-question set), each method's
output is compared with plain bf16 greedy; at the first difference the two tokens taken, their logits in a bf16
forward over the common prefix, the gap, and the gap the same bf16 weights give in fp32 are recorded. A near-tie: the
two tokens are the target's top two, and their gap is within a few bf16 rounding steps of the logits (bf16 keeps 8
significant bits: a logit of 16-32 is rounded to a multiple of 0.125).

    OMP_NUM_THREADS=1 python benchmarks/bf16_near_ties.py --limit 2 --max-new-tokens 64 --threads 1 \
        --json benchmarks/results/2026-12-03-bf16-int8/bf16_near_ties.json
"""

import argparse
import json
import math
from pathlib import Path

import torch

from hf_dflash.data import chat_input_ids
from hf_dflash.evaluation.bench import first_difference, timed_generation
from hf_dflash.evaluation.machine import load_average, run_stamp
from hf_dflash.evaluation.prompts import DATASETS, load_eval_prompts
from hf_dflash.models import load_drafter, load_target


def bf16_step(value: float) -> float:
    """The spacing of bf16 numbers around `value` (8 significant bits)."""
    return 2.0 ** (math.floor(math.log2(abs(value))) - 7) if value else 0.0


@torch.no_grad()
def tie_at(target, target_fp32, ids: list[int], taken: int, plain: int) -> dict:
    """The logits of the token `taken` (with the assistant) and `plain` (plain generate) after `ids`."""
    prefix = torch.tensor([ids])
    logits = target(prefix).logits[0, -1].float()
    exact = target_fp32(prefix).logits[0, -1]
    top2 = logits.topk(2).indices.tolist()
    return {"tokens": [taken, plain], "top2_bf16": top2, "are_top2": sorted(top2) == sorted([taken, plain]),
            "gap_bf16": round(abs(float(logits[taken] - logits[plain])), 4),
            "gap_fp32_of_bf16_weights": round(abs(float(exact[taken] - exact[plain])), 4),
            "bf16_step_at_logit": bf16_step(float(logits[plain]))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--methods", default="pld,dflash,dflash_default")
    parser.add_argument("--json", required=True)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    load_before = load_average()
    target, tokenizer = load_target(dtype="bfloat16", device="cpu")
    drafter = load_drafter(None, target)  # the shipped drafter, cast to bf16 as load_drafter does
    target_fp32 = load_target(dtype="bfloat16", device="cpu")[0].float()  # the same bf16-rounded weights, in fp32
    rows = []
    for dataset in DATASETS:
        for index, prompt in enumerate(load_eval_prompts(dataset, args.limit, tokenizer)):
            ids = chat_input_ids(tokenizer, prompt)
            plain = timed_generation(target, ids, args.max_new_tokens).new_tokens
            for method in args.methods.split(","):
                got = timed_generation(target, ids, args.max_new_tokens, method, drafter).new_tokens
                at = first_difference(got, plain)
                row = {"dataset": dataset, "index": index, "method": method, "first_difference": at}
                if at is not None and at < min(len(got), len(plain)):
                    row.update(tie_at(target, target_fp32, ids[0].tolist() + plain[:at], got[at], plain[at]))
                print(json.dumps(row), flush=True)
                rows.append(row)
    differing = [r for r in rows if r["first_difference"] is not None]
    summary = {"runs": len(rows), "differ": len(differing),
               "differ_at_top2_near_tie": sum(1 for r in differing if r.get("are_top2")),
               "largest_gap_fp32": max((r.get("gap_fp32_of_bf16_weights", 0) for r in differing), default=None)}
    report = {"machine": run_stamp("cpu", load_before), "summary": summary, "rows": rows,
              "config": {"limit": args.limit, "max_new_tokens": args.max_new_tokens, "datasets": list(DATASETS)}}
    Path(args.json).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
