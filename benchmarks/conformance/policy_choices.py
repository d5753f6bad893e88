"""Every draft policy's choices on the real SmolLM2 target and the shipped drafter, with costs held fixed: a
fingerprint (tokens, tau, each cycle's draft count) that two versions of the code can compare.

The cost-aware policy's choices depend on measured time, which no two runs share; here its cost table is installed
by hand (one thread's SmolLM2 costs, rounded) and never updated, and the CPU's 9-15-row padding is fixed, so its
choices depend only on acceptance, and every run of one version of the code gives the same fingerprint. A change
that only moves code (a refactor of the policy, the loop or the tree) must leave the fingerprint unchanged:

    python benchmarks/conformance/policy_choices.py --json after.json
    git worktree add ../before <commit> && PYTHONPATH=../before python benchmarks/conformance/policy_choices.py \
        --json before.json
    python -c "import json,sys; a,b=(json.load(open(f))['methods'] for f in sys.argv[1:]); print(a==b)" \
        before.json after.json

Methods: full blocks, transformers' heuristic schedule, the cost-aware default (with its prompt lookups; with CPU
costs, where this drafter seldom pays, and with a verify as cheap as a step, where it does), trees of 16 under full
blocks and under the default, and full blocks and the default sampled (seeded). Prompts: 2 each of MT-Bench, GSM8K,
HumanEval and the code-edit workload, 48 new tokens, one thread, fp32.
"""

from __future__ import annotations

import argparse
import hashlib
import json

import torch

import hf_dflash
from hf_dflash.data import chat_input_ids
from hf_dflash.evaluation.machine import load_average, run_stamp
from hf_dflash.evaluation.prompts import load_eval_prompts
from hf_dflash.models import load_drafter, load_target

METHODS = {
    "full": dict(dflash_policy="full"),
    "heuristic": dict(num_assistant_tokens=4, num_assistant_tokens_schedule="heuristic"),
    "default": dict(dflash_policy="cost"),
    "default_cheap_verify": dict(dflash_policy="cost"),
    "full_tree16": dict(dflash_policy="full", dflash_tree_budget=16),
    "default_tree16": dict(dflash_policy="cost", dflash_tree_budget=16),
    "full_sampled": dict(dflash_policy="full", do_sample=True, temperature=0.7),
    "default_sampled": dict(dflash_policy="cost", do_sample=True, temperature=0.7),
}
# seconds of SmolLM2-135M's verify forward by width and of a drafter forward, one thread (rounded); "cheap verify":
# every width costs one step, as on a GPU, so the default drafts where this drafter's acceptance allows it
COSTS = {"cpu": ({1: 0.0100, 2: 0.0145, 4: 0.0160, 8: 0.0180, 16: 0.0220}, 0.006),
         "cheap_verify": ({1: 0.0100, 2: 0.0100, 4: 0.0101, 8: 0.0102, 16: 0.0104}, 0.002)}


def freeze_costs(target, costs_name: str) -> None:
    """Install COSTS[costs_name] as the target's table for short prompts, stop every update, fix the row padding
    (none)."""
    from hf_dflash import costs_dflash as costs

    verify, draft = COSTS[costs_name]
    table = costs.CostTable()
    for _ in range(table.WINDOW):  # full windows: no width is ever due for a re-measurement (none would come)
        for width, seconds in verify.items():
            table.observe_verify(width, seconds)
        table.observe_draft(draft)
    table.observe_verify = lambda width, seconds: None
    table.observe_draft = lambda seconds: None
    for bucket in range(4):
        costs.cost_tables(target)[("cpu", str(target.dtype), 1, bucket)] = table
    hf_dflash.timing_dflash.rows_slower_than_sixteen = lambda: frozenset()


def fingerprint(target, drafter, prompts: list[torch.Tensor], settings: dict, max_new_tokens: int) -> dict:
    """Tokens (a hash), tau and each call's draft counts for `prompts`, in order (the policy's memory of the
    drafter carries from one call to the next, as in the bench)."""
    digest, accepted, verifications, counts = hashlib.sha256(), 0, 0, []
    for i, ids in enumerate(prompts):
        torch.manual_seed(i)
        out = target.generate(ids, assistant_model=drafter, max_new_tokens=max_new_tokens,
                              **{"do_sample": False, **settings})
        digest.update(json.dumps(out[0].tolist()).encode())
        stats = drafter.last_stats
        accepted += sum(stats.acceptance_lengths)
        verifications += len(stats.acceptance_lengths)
        counts.append(list(stats.drafts_per_cycle))
    return {"tokens_sha256": digest.hexdigest()[:16], "tau": round(accepted / max(verifications, 1), 4),
            "verifications": verifications, "drafts_per_cycle": counts}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--json", default=None, help="write the fingerprints to this file")
    args = parser.parse_args()
    torch.set_num_threads(1)
    load_before = load_average()
    target, tokenizer = load_target()
    drafter = load_drafter(None, target)
    prompts = [chat_input_ids(tokenizer, prompt) for dataset in ("mtbench", "gsm8k", "humaneval", "code_edit")
               for prompt in load_eval_prompts(dataset, limit=2)]
    rows = {}
    for name, settings in METHODS.items():
        freeze_costs(target, "cheap_verify" if "cheap_verify" in name else "cpu")
        rows[name] = fingerprint(target, drafter, prompts, settings, args.max_new_tokens)
        print(name, rows[name]["tokens_sha256"], "tau", rows[name]["tau"], flush=True)
    if args.json:  # the fingerprints under "methods", the run's stamp under "machine" (it differs between runs)
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"machine": run_stamp("cpu", load_before), "methods": rows}, f, indent=1)


if __name__ == "__main__":
    main()
