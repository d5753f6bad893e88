"""Chain tau of SmolLM2 drafters with real ``generate()`` on 11 prompts that neither training nor the bench sees
(BENCHMARKS.md: the shipped drafter's one tau, and how drafters are compared before one is shipped).

The prompts: the real-model test's 3 (tests/evaluation/test_smollm2.py), HumanEval and GSM8K prompts 3-6 (the
bench's ``--limit`` 2-3 takes 0-2; the training prompts are built with the evaluation sets kept out). Greedy, fp32,
full blocks (``dflash_policy="full"``: every cycle drafts the whole block, so tau is the drafter's, not the policy's).

    python benchmarks/heldout_generate_tau.py hf_dflash/assets/smollm2-dflash ~/.cache/hf_dflash/train/run/final
    python benchmarks/heldout_generate_tau.py hf_dflash/assets/smollm2-dflash --json tau.json   # rows + machine stamp
    python benchmarks/heldout_generate_tau.py hf_dflash/assets/smollm2-dflash --workloads 4     # + the bench's kinds
    python benchmarks/heldout_generate_tau.py hf_dflash/assets/smollm2-dflash --device cuda --dtype bfloat16

``--workloads N`` also measures the first N prompts of each of the bench's workloads (code_edit, doc_qa,
multi_turn: prompts the training data is kept apart from, but that the bench reads), as columns of their own that
"all" leaves out.

A JSON line per drafter on stdout; with ``--json FILE`` also the rows with the run's stamp (date, commit, versions,
CPU, threads, load average before and after).
"""

from __future__ import annotations

import argparse
import json

import torch

from hf_dflash.data import chat_input_ids
from hf_dflash.evaluation.acceptance import measure_acceptance_length
from hf_dflash.evaluation.machine import load_average, run_stamp
from hf_dflash.evaluation.prompts import load_eval_prompts
from hf_dflash.models import load_drafter, load_target, portable_name

TEST_PROMPTS = (  # tests/evaluation/test_smollm2.py's PROMPTS
    "What is the capital of France?",
    "Write a Python function that checks whether a number is prime.",
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?",
)


def heldout_prompts() -> dict[str, list[str]]:
    """The 11 prompts by group."""
    return {
        "test": list(TEST_PROMPTS),
        "humaneval": load_eval_prompts("humaneval", limit=7)[3:],
        "gsm8k": load_eval_prompts("gsm8k", limit=7)[3:],
    }


WORKLOADS = ("code_edit", "doc_qa", "multi_turn")


def group_tau(target, tokenizer, drafter, prompts: list[str], max_new_tokens: int) -> dict:
    """:func:`~hf_dflash.evaluation.acceptance.measure_acceptance_length` of `prompts` in the chat template: tau
    over all their verifications (full-block chains) and how many there were."""
    ids = [chat_input_ids(tokenizer, prompt)[0].tolist() for prompt in prompts]
    return measure_acceptance_length(target, drafter, ids, max_new_tokens)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("drafters", nargs="+", help="drafter folders")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", default=None, help="also write the rows and the run's stamp to this file")
    parser.add_argument("--workloads", type=int, default=0, metavar="N",
                        help="also tau on the first N prompts of each of the bench's workloads (default 0)")
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda or auto")
    parser.add_argument("--dtype", default="float32",
                        help="the target's dtype (default float32, where greedy output is exact); the drafter follows")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    load_before = load_average()

    target, tokenizer = load_target(dtype=args.dtype, device=args.device)
    groups = heldout_prompts()
    workloads = {name: load_eval_prompts(name, limit=args.workloads) for name in WORKLOADS if args.workloads}
    rows = []
    for path in args.drafters:
        drafter = load_drafter(path, target)
        measured = {name: group_tau(target, tokenizer, drafter, prompts, args.max_new_tokens)
                    for name, prompts in groups.items()}
        row = {"drafter": portable_name(path), **{name: round(m["tau"], 3) for name, m in measured.items()}}
        verifications = sum(m["num_verifications"] for m in measured.values())  # "all": tau over every verification
        row["all"] = round(sum(m["tau"] * m["num_verifications"] for m in measured.values()) / verifications, 3)
        row.update({name: round(group_tau(target, tokenizer, drafter, prompts, args.max_new_tokens)["tau"], 3)
                    for name, prompts in workloads.items()})
        print(json.dumps(row), flush=True)
        rows.append(row)
    if args.json:
        report = {"machine": run_stamp(str(target.device), load_before), "dtype": str(target.dtype),
                  "max_new_tokens": args.max_new_tokens,
                  "prompts": {name: len(prompts) for name, prompts in {**groups, **workloads}.items()},
                  "policy": "full blocks, greedy", "rows": rows}
        with open(args.json, "w", encoding="utf-8") as f:
            f.write(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
