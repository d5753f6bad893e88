"""Chain tau of SmolLM2 drafters with real ``generate()`` on 11 prompts that neither training nor the bench sees
(BENCHMARKS.md, issue 23: how the shipped drafter is chosen).

The prompts: the real-model test's 3 (tests/evaluation/test_smollm2.py), HumanEval and GSM8K prompts 3-6 (the
bench's ``--limit`` 2-3 takes 0-2; the training prompts are built with the evaluation sets kept out). Greedy, fp32,
full blocks (``dflash_policy="full"``: every cycle drafts the whole block, so tau is the drafter's, not the policy's).

    python benchmarks/heldout_generate_tau.py hf_dflash/assets/smollm2-dflash ~/.cache/hf_dflash/train/run/final
"""

from __future__ import annotations

import argparse
import json

import torch

from hf_dflash.data import chat_input_ids
from hf_dflash.evaluation.bench import timed_generation
from hf_dflash.evaluation.prompts import load_eval_prompts
from hf_dflash.models import load_drafter, load_target

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


def acceptance_lengths(target, tokenizer, drafter, prompts: list[str], max_new_tokens: int) -> list[int]:
    """Every verification's acceptance length over `prompts` (full-block chains)."""
    lengths = []
    for prompt in prompts:
        run = timed_generation(target, chat_input_ids(tokenizer, prompt), max_new_tokens, "dflash", drafter)
        lengths += run.stats.acceptance_lengths
    return lengths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("drafters", nargs="+", help="drafter folders")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    target, tokenizer = load_target()
    groups = heldout_prompts()
    for path in args.drafters:
        drafter = load_drafter(path, target)
        row, everything = {"drafter": path}, []
        for name, prompts in groups.items():  # tau over all verifications of a group (accepted drafts + 1 each)
            lengths = acceptance_lengths(target, tokenizer, drafter, prompts, args.max_new_tokens)
            row[name] = round(sum(lengths) / len(lengths), 3)
            everything += lengths
        row["all"] = round(sum(everything) / len(everything), 3)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
