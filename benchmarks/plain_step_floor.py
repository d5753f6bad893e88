# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""Where a call of the default policy loses time to plain ``generate()`` when the drafter rarely helps (chat).

Side by side, in one process, on SmolLM2-135M-Instruct (fp32) and the shipped drafter, greedy, per prompt (best of
`--repeats` interleaved runs, each method's seconds over plain's): plain ``generate()``; our loop forced to plain
steps (the policy still runs, its choice is discarded: the loop's own floor); the default policy; the default without
prompt lookups; on request (``--methods``), the default with every verify run at its own width (``ours_unpadded``: not
padded to a wider width the policy measured cheaper); the default with prompt lookups matching n-grams of up to 3 or 4
tokens (``ours_ngram3``, ``ours_ngram4``: ``max_matching_ngram_size``; the default matches up to 2); the default with
the cost table's far end forgotten as before 2026-12-07 (``ours_far_end_forgotten``: once the widest verify measured
is forgotten, wider verifies are priced as the widest one left); the default with a width not measured lately priced on
the straight line between its measured neighbours, as before 2026-12-07 (``ours_chord``; the default prices it on a
line in the logarithm of the width, as a CPU's verify costs grow). Each method keeps its own policy memory (what the
policy learns carries over between calls, as it would for a user of that setting), and its own cost tables (measured
in its own cycles); with ``--fresh``, every call starts from none (a process that makes one call); the default
probing its drafter up to the call's last tokens, as before 2026-12-07 (``ours_probes_to_the_end``; the default skips
a probe when fewer tokens are left than the plain steps it waited for); the default asking for a full block to measure
a new length of context (or refresh the cost curve's far end) even where the call's end cuts the block, as before
2026-12-07 (``ours_cut_blocks``: every cycle to the end was such a block). Outputs must be identical.

    python benchmarks/plain_step_floor.py --threads 1 --datasets gsm8k,mtbench
    python benchmarks/plain_step_floor.py --threads 1 --datasets code_edit,aime2025 \
        --methods plain,ours_default,ours_unpadded
    python benchmarks/plain_step_floor.py --threads 1 --datasets summarize,doc_qa \
        --methods plain,ours_default,ours_ngram3,ours_ngram4
    python benchmarks/plain_step_floor.py --threads 1 --datasets mtbench,gsm8k --fresh \
        --methods plain,ours_default,ours_chord
    python benchmarks/plain_step_floor.py --threads 1 --datasets context_2k --limit 2 \
        --methods plain,ours_default,ours_cut_blocks
"""

import argparse
import dataclasses
import time

import torch

from hf_dflash import costs_dflash, policy_dflash
from hf_dflash.data.chat import chat_input_ids
from hf_dflash.evaluation.prompts import load_eval_prompts
from hf_dflash.models import load_drafter, load_target
from hf_dflash.schedules_dflash import Draft

METHODS = ("plain", "ours_plain_steps", "ours_default", "ours_no_lookup", "ours_unpadded", "ours_ngram3", "ours_ngram4",
           "ours_far_end_forgotten", "ours_chord", "ours_probes_to_the_end", "ours_cut_blocks")


def plain_steps_only(choose):
    def choose_then_step(self, *args, **kwargs):
        choose(self, *args, **kwargs)  # the policy's own bookkeeping is part of the floor
        return Draft(0)

    return choose_then_step


def timed(target, drafter, ids: torch.Tensor, method: str, max_new_tokens: int) -> tuple[float, list[int]]:
    kwargs = dict(attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False)
    if method != "plain":
        kwargs["assistant_model"] = drafter
    if method == "ours_no_lookup":
        kwargs["dflash_lookup"] = False
    if method.startswith("ours_ngram"):
        kwargs["max_matching_ngram_size"] = int(method.removeprefix("ours_ngram"))
    start = time.perf_counter()
    with torch.inference_mode():
        out = target.generate(ids, **kwargs)
    return time.perf_counter() - start, out[0, ids.shape[1]:].tolist()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--datasets", default="gsm8k,mtbench")
    parser.add_argument("--limit", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--fresh", action="store_true", help="every call starts without policy memory or costs")
    parser.add_argument("--methods", default=",".join(METHODS[:4]), help=f"comma list of {','.join(METHODS)}")
    args = parser.parse_args()
    methods = tuple(dict.fromkeys(["plain", *args.methods.split(",")]))
    torch.set_num_threads(args.threads)
    target, tokenizer = load_target(None, device="cpu", dtype=torch.float32)
    drafter = load_drafter(None, target)
    choose, cheaper_wider = policy_dflash.CostAwarePolicy.choose, costs_dflash.CostTable.cheaper_wider
    fitting = policy_dflash.CostAwarePolicy._fitting
    points, verify_seconds = costs_dflash.CostTable._points, costs_dflash.CostTable.verify_seconds
    cost_aware = policy_dflash.POLICIES["cost"]
    memories, tables = {method: {} for method in methods}, {method: {} for method in methods}

    def run(ids, method):
        policy_dflash._POLICY_MEMORY[drafter] = {} if args.fresh else memories[method]
        costs_dflash._COST_TABLES[target] = {} if args.fresh else tables[method]
        forced = method == "ours_plain_steps"
        policy_dflash.CostAwarePolicy.choose = plain_steps_only(choose) if forced else choose
        unpadded = method == "ours_unpadded"
        costs_dflash.CostTable.cheaper_wider = (lambda self, width, most: width) if unpadded else cheaper_wider
        forgotten = method == "ours_far_end_forgotten"
        costs_dflash.CostTable._points = (lambda self: list(self.verify.items())) if forgotten else points
        policy_dflash.POLICIES["cost"] = cost_aware
        if method == "ours_probes_to_the_end":  # the call's length unknown to the policy
            policy_dflash.POLICIES["cost"] = lambda options, *rest: cost_aware(
                dataclasses.replace(options, max_length=None), *rest)
        policy_dflash.CostAwarePolicy._fitting = (lambda self: self.most) if method == "ours_cut_blocks" else fitting
        chord = method == "ours_chord"
        costs_dflash.CostTable.verify_seconds = (lambda self, width, optimistic=False: verify_seconds(
            self, width, optimistic=True)) if chord else verify_seconds
        return timed(target, drafter, ids, method, args.max_new_tokens)

    print("| dataset | prompt | " + " | ".join(f"{m} / plain" for m in methods) + " | identical |")
    print("|---" * (len(methods) + 3) + "|")
    for dataset in args.datasets.split(","):
        prompts = [chat_input_ids(tokenizer, p) for p in load_eval_prompts(dataset, args.limit, tokenizer)]
        for method in methods:  # warm-up: every method's policy has seen a call before the timed ones
            run(prompts[0], method)
        for i, ids in enumerate(prompts):
            best, tokens = dict.fromkeys(methods, float("inf")), {}
            for repeat in range(args.repeats):
                for method in methods if (i + repeat) % 2 == 0 else methods[::-1]:
                    seconds, tokens[method] = run(ids, method)
                    best[method] = min(best[method], seconds)
            same = all(tokens[m] == tokens["plain"] for m in methods)
            ratios = " | ".join(f"{best[m] / best['plain']:.3f}" for m in methods)
            print(f"| {dataset} | {i} | {ratios} | {'yes' if same else 'NO'} |", flush=True)


if __name__ == "__main__":
    main()
