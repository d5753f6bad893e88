# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""What writing the target's cache in place is worth on a CPU: time per output token after long prompts, side by side.

On a CPU the loop's dynamic target cache writes each forward's keys and values in place (``GrowingLayer``,
hf_dflash/cache_dflash.py); transformers' ``DynamicLayer`` concatenates the whole cache into new memory at every
forward. Methods, interleaved per prompt (each method's faster of `--rounds`): ``plain`` (plain ``generate()``),
``ours`` (the default policy), ``ours_concatenating`` (the same with transformers' layers). With ``--plain-steps`` our
loop takes plain steps only (the policy still runs, its choice is discarded), so the cache is all that differs from
plain ``generate()``. Time per output token (TPOT) is timed after the first new token, end to end in brackets;
every output is checked identical to plain's.

    taskset -c 0 python benchmarks/growing_cache.py --datasets context_2k,context_4k,context_8k --plain-steps
    taskset -c 0 python benchmarks/growing_cache.py --datasets context_4k --max-new-tokens 256
"""

import argparse
import contextlib
import json
import time

import torch

from hf_dflash import cache_dflash, policy_dflash
from hf_dflash.data.chat import chat_input_ids
from hf_dflash.evaluation.machine import load_average, run_stamp
from hf_dflash.evaluation.prompts import load_eval_prompts
from hf_dflash.models import load_drafter, load_target
from hf_dflash.schedules_dflash import Draft

METHODS = ("plain", "ours", "ours_concatenating")


class FirstTokenClock:
    """A streamer that notes when each put arrives (generate puts the prompt first, then each new token)."""

    def __init__(self):
        self.times = []

    def put(self, value):
        self.times.append(time.perf_counter())

    def end(self):
        pass


@contextlib.contextmanager
def concatenating(method: str):
    """transformers' own layers for ``ours_concatenating`` (the loop's swap undone), the loop's otherwise."""
    grow = cache_dflash.grow_in_place
    if method == "ours_concatenating":
        cache_dflash.grow_in_place = lambda cache, most_slots=None: None
    try:
        yield
    finally:
        cache_dflash.grow_in_place = grow


@contextlib.contextmanager
def plain_steps_only(enabled: bool):
    choose = policy_dflash.CostAwarePolicy.choose

    def choose_then_step(self, *args, **kwargs):
        choose(self, *args, **kwargs)  # the policy's own bookkeeping stays in the time
        return Draft(0)

    if enabled:
        policy_dflash.CostAwarePolicy.choose = choose_then_step
    try:
        yield
    finally:
        policy_dflash.CostAwarePolicy.choose = choose


def timed(target, drafter, ids, method: str, max_new_tokens: int) -> tuple[float, float, list[int]]:
    """(seconds of the call, seconds per output token after the first, the output ids)."""
    clock = FirstTokenClock()
    kwargs = dict(attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False, streamer=clock)
    if method != "plain":
        kwargs["assistant_model"] = drafter
    start = time.perf_counter()
    with torch.inference_mode(), concatenating(method):
        out = target.generate(ids, **kwargs)
    end = time.perf_counter()
    tokens = out.shape[1] - ids.shape[1]
    return end - start, (end - clock.times[1]) / max(tokens - 1, 1), out[0].tolist()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--datasets", default="context_2k,context_4k")
    parser.add_argument("--limit", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--plain-steps", action="store_true", help="our loop takes plain steps only")
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target, tokenizer = load_target(None, device="cpu", dtype=torch.float32)
    drafter = load_drafter(None, target)
    rows, load_before = [], load_average()
    print(f"\n{'plain steps only' if args.plain_steps else 'the default policy'}, {args.max_new_tokens} new tokens, "
          f"each method's faster of {args.rounds}: TPOT ms (over plain's), end to end s\n")
    print("| prompt | tokens | " + " | ".join(METHODS) + " | identical |\n" + "|---" * (len(METHODS) + 3) + "|")
    with plain_steps_only(args.plain_steps):
        for dataset in args.datasets.split(","):
            for i, prompt in enumerate(load_eval_prompts(dataset, args.limit, tokenizer)):
                ids = chat_input_ids(tokenizer, prompt)
                best, outputs = {m: (float("inf"), float("inf")) for m in METHODS}, {}
                for round_ in range(args.rounds):
                    for method in METHODS if round_ % 2 == 0 else METHODS[::-1]:
                        whole, tpot, outputs[method] = timed(target, drafter, ids, method, args.max_new_tokens)
                        best[method] = (min(best[method][0], whole), min(best[method][1], tpot))
                same = all(out == outputs["plain"] for out in outputs.values())
                rows.append({"prompt": f"{dataset} #{i}", "tokens": ids.shape[1], "identical": same,
                             **{m: {"tpot_ms": round(1e3 * best[m][1], 1), "seconds": round(best[m][0], 2)}
                                for m in METHODS}})
                cells = " | ".join(f"{1e3 * best[m][1]:.1f} ({best['plain'][1] / best[m][1]:.2f}x), {best[m][0]:.1f} s"
                                   for m in METHODS)
                print(f"| {dataset} #{i} | {ids.shape[1]} | {cells} | {'yes' if same else 'NO'} |", flush=True)
    stamp = run_stamp("cpu", load_before)
    print(f"\n{json.dumps(stamp)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"stamp": stamp, "plain_steps": args.plain_steps, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
