# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""Is a call's prompt forward (its time to first token) slower with the drafter? Side by side in one process,
interleaved in rotating order: the target's prompt forward as plain ``generate()`` runs it, the same forward writing
the drafter's features through its ``fc`` (as the DFlash loop's prefill does), and a 1-token ``generate()`` call
without and with the drafter.

    taskset -c 0 python benchmarks/prompt_forward_time.py --dataset summarize --rounds 5
"""

import argparse
import statistics
import time

import torch
from transformers import DynamicCache

from hf_dflash.data.chat import chat_input_ids
from hf_dflash.evaluation.prompts import load_eval_prompts
from hf_dflash.features_dflash import PromptFeatureWriter
from hf_dflash.models import load_drafter, load_target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="summarize")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target, tokenizer = load_target(None)
    drafter = load_drafter(None, target)
    ids = chat_input_ids(tokenizer, load_eval_prompts(args.dataset, limit=1, tokenizer=tokenizer)[0])

    @torch.no_grad()
    def prompt_forward(writer=None):
        with writer or torch.no_grad():
            target(input_ids=ids, logits_to_keep=1, use_cache=True, past_key_values=DynamicCache(config=target.config))

    def one_token(**kwargs):
        target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=1, do_sample=False, **kwargs)

    arms = {
        "plain prompt forward": prompt_forward,
        "prompt forward writing the drafter's features": lambda: prompt_forward(
            PromptFeatureWriter.for_target(target, drafter.config.target_layer_ids, drafter.fc)),
        "generate 1 token, plain": one_token,
        "generate 1 token, with the drafter": lambda: one_token(assistant_model=drafter),
    }
    for arm in arms.values():  # first calls pay for lazy initialisation
        arm()
    names, seconds = list(arms), {name: [] for name in arms}
    for round_ in range(args.rounds):
        for name in names[round_ % len(names):] + names[: round_ % len(names)]:
            start = time.perf_counter()
            arms[name]()
            seconds[name].append(time.perf_counter() - start)
    print(f"{args.dataset}: {ids.shape[1]} prompt tokens, {args.threads} thread(s), {args.rounds} rounds")
    for name, values in seconds.items():
        print(f"- {name}: median {1e3 * statistics.median(values):.0f} ms, min {1e3 * min(values):.0f} ms")


if __name__ == "__main__":
    main()
