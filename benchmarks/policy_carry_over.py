# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""Does a copy-heavy call steer the next, unrelated one? The default policy keeps what it learned of the drafter's
acceptance and of prompt lookup's (per matched n-gram size) from one ``generate()`` call to the next; after a code
edit (the answer copies the prompt: lookups accepted), a chat call may start out offering lookups that fail.

Side by side, in one process, on SmolLM2-135M-Instruct (fp32) and the shipped drafter, greedy: each chat prompt
(MT-Bench) generated with the policy's memory cleared ("first"), and again right after a code-edit call from the same
cleared state ("after a code edit"), alternating, `--repeats` rounds (each case's fastest counts). Reported per chat
prompt: seconds, tau, the cycles that verified prompt-lookup drafts and plain steps, and whether both outputs are the
same (they must be: the policy only chooses draft counts).

    python benchmarks/policy_carry_over.py --threads 1 --limit 5 --json carry_over.json
"""

import argparse
import json
import statistics
import time

import torch

from hf_dflash.data.chat import chat_input_ids
from hf_dflash.evaluation.machine import load_average, run_stamp
from hf_dflash.evaluation.prompts import load_eval_prompts
from hf_dflash.models import load_drafter, load_target
from hf_dflash.policy_dflash import policy_memory


def timed_call(target, drafter, ids: torch.Tensor, max_new_tokens: int) -> dict:
    """One generate() with the drafter: seconds, tokens, tau, lookup cycles, plain steps."""
    start = time.perf_counter()
    with torch.inference_mode():
        out = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                              do_sample=False, assistant_model=drafter)
    seconds = time.perf_counter() - start
    stats = drafter.last_stats
    return {"seconds": seconds, "tokens": out[0, ids.shape[1]:].tolist(), "tau": stats.mean_acceptance_length,
            "lookup_cycles": stats.lookup_cycles, "plain_steps": stats.drafts_per_cycle.count(0),
            "cycles": len(stats.drafts_per_cycle)}


def chat_call(target, drafter, chat: torch.Tensor, edit: torch.Tensor | None, max_new_tokens: int) -> dict:
    """The chat call from a cleared policy memory, after the code-edit call `edit` when given."""
    policy_memory(drafter).clear()
    if edit is not None:
        timed_call(target, drafter, edit, max_new_tokens)
    return timed_call(target, drafter, chat, max_new_tokens)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--limit", type=int, default=5, help="chat prompts (each paired with a code edit)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    before = load_average()
    target, tokenizer = load_target(None, device="cpu", dtype=torch.float32)
    drafter = load_drafter(None, target)
    chats = [chat_input_ids(tokenizer, p) for p in load_eval_prompts("mtbench", args.limit, tokenizer)]
    edits = [chat_input_ids(tokenizer, p) for p in load_eval_prompts("code_edit", args.limit, tokenizer)]
    chat_call(target, drafter, chats[0], edits[0], args.max_new_tokens)  # warm-up
    rows = []
    for i, (chat, edit) in enumerate(zip(chats, edits)):
        runs = {"first": [], "after a code edit": []}
        for repeat in range(args.repeats):
            order = ("first", "after a code edit") if (i + repeat) % 2 == 0 else ("after a code edit", "first")
            for case in order:
                runs[case].append(chat_call(target, drafter, chat, edit if case != "first" else None,
                                            args.max_new_tokens))
        best = {case: min(r, key=lambda run: run["seconds"]) for case, r in runs.items()}
        first, after = best["first"], best["after a code edit"]
        rows.append({"prompt": i, "identical": first["tokens"] == after["tokens"],
                     "ratio_after_over_first": after["seconds"] / first["seconds"],
                     **{case: {k: v for k, v in run.items() if k != "tokens"} for case, run in best.items()}})
        print(json.dumps(rows[-1]), flush=True)
    ratios = [r["ratio_after_over_first"] for r in rows]
    print("\n| chat prompt | s first | s after a code edit | ratio | lookup cycles first / after | plain steps "
          "first / after | tau first / after | identical |\n|---|---|---|---|---|---|---|---|")
    for r in rows:
        f, a = r["first"], r["after a code edit"]
        print(f"| {r['prompt']} | {f['seconds']:.2f} | {a['seconds']:.2f} | {r['ratio_after_over_first']:.3f} | "
              f"{f['lookup_cycles']} / {a['lookup_cycles']} | {f['plain_steps']} / {a['plain_steps']} | "
              f"{f['tau']:.2f} / {a['tau']:.2f} | {'yes' if r['identical'] else 'NO'} |")
    print(f"\nmedian time ratio after / first: {statistics.median(ratios):.3f}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"machine": run_stamp("cpu", before), "args": vars(args), "rows": rows,
                       "median_ratio": statistics.median(ratios)}, f, indent=2)


if __name__ == "__main__":
    main()
