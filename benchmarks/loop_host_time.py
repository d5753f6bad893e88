# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""What the decoding loop costs outside the models: per new token, the wall-clock time of a ``generate()`` call less
the time spent inside the target's and the drafter's forwards, for plain ``generate()`` and for the default policy.

Where the drafter rarely helps (chat), the default policy takes plain steps, and each one must cost what plain
``generate()``'s step costs: a step's forward is the same, so what the loop does around it (the policy's choice, the
acceptance, the commit, the drafter's context) is the difference. End to end that difference (~1-4% of a step of
SmolLM2-135M on a CPU) hides in a shared machine's noise; measured outside the forwards it does not.

Methods, interleaved per prompt (median of `--repeats`): ``plain``; ``ours`` (the default policy); ``ours_fc_per_step``
(the default with each verify's target states fused through the drafter's ``fc`` at its commit, as before 2026-12-07;
now they wait until the drafter reads them); ``ours_probe_block`` (the default with each scored probe's drafts all
scored by the LM head at once, over the whole block, as the loop did until late 2026-12-07; now each is scored
when the policy reads it). Every output is checked identical to plain's.

    python benchmarks/loop_host_time.py --threads 1 --repeats 5
"""

import argparse
import collections
import contextlib
import json
import statistics
import time

import torch

from hf_dflash.data.chat import chat_input_ids
from hf_dflash.candidates_dflash import DFlashCandidateGenerator
from hf_dflash.evaluation.demo import default_prompts
from hf_dflash.evaluation.machine import load_average, run_stamp
from hf_dflash.evaluation.prompts import load_eval_prompts
from hf_dflash.models import load_drafter, load_target
from hf_dflash.rows_dflash import Rows

METHODS = ("plain", "ours", "ours_fc_per_step", "ours_probe_block")


class ForwardClock:
    """Seconds spent inside the forwards of `models` (their outermost calls), while installed."""

    def __init__(self, *models):
        self.models, self.seconds, self.depth = models, 0.0, 0

    def _timed(self, forward):
        def timed(*args, **kwargs):
            self.depth += 1
            start = time.perf_counter()
            try:
                return forward(*args, **kwargs)
            finally:
                self.depth -= 1
                if self.depth == 0:
                    self.seconds += time.perf_counter() - start
        return timed

    @contextlib.contextmanager
    def installed(self):
        for model in self.models:
            model.forward = self._timed(model.forward)
        try:
            yield self
        finally:
            for model in self.models:
                del model.forward  # back to the class's forward


@contextlib.contextmanager
def fc_per_step():
    """Each commit's states fused at once, as the loop did before they waited for the drafter to read them."""
    commit = Rows.commit

    def eager_commit(self, *args, **kwargs):
        result = commit(self, *args, **kwargs)
        self.unread()
        return result

    Rows.commit = eager_commit
    try:
        yield
    finally:
        Rows.commit = commit


@contextlib.contextmanager
def probe_block():
    """Each scored probe's drafts scored by the LM head at once, over the whole block, as the loop did before (the
    path probes with logits processors still take)."""
    lazy = DFlashCandidateGenerator.__dict__["lazy_probes"]  # the property itself
    DFlashCandidateGenerator.lazy_probes = False
    try:
        yield
    finally:
        DFlashCandidateGenerator.lazy_probes = lazy


METHOD_CONTEXTS = {"ours_fc_per_step": fc_per_step, "ours_probe_block": probe_block}


def run(target, drafter, ids, method: str, max_new_tokens: int, clock: ForwardClock) -> tuple[float, float, int, list]:
    """(seconds outside the forwards, seconds in all, new tokens, the output ids) of one call."""
    kwargs = dict(attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False)
    if method != "plain":
        kwargs["assistant_model"] = drafter
    with METHOD_CONTEXTS.get(method, contextlib.nullcontext)():
        clock.seconds = 0.0
        start = time.perf_counter()
        out = target.generate(ids, **kwargs)
        total = time.perf_counter() - start
    return total - clock.seconds, total, out.shape[1] - ids.shape[1], out[0].tolist()


def prompts(dataset: str | None, tokenizer) -> list[tuple[str, object]]:
    """(name, prompt) pairs: the demo's, or the first 3 of a bench `dataset`."""
    if dataset is None:
        return list(default_prompts())
    return [(f"{dataset} #{i}", prompt) for i, prompt in enumerate(load_eval_prompts(dataset, 3, tokenizer))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated, of {', '.join(METHODS)}")
    parser.add_argument("--dataset", default=None, help="the first 3 prompts of a bench dataset (default: the demo's)")
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    methods = args.methods.split(",")
    if not set(methods) <= set(METHODS) or "plain" not in methods:
        parser.error(f"--methods {args.methods}: choose among {', '.join(METHODS)}, plain included")
    target, tokenizer = load_target(None)
    drafter = load_drafter(None, target)
    clock = ForwardClock(target, drafter)
    rows, load_before = [], load_average()
    with clock.installed():
        for name, prompt in prompts(args.dataset, tokenizer):
            ids = chat_input_ids(tokenizer, prompt)
            host, whole = collections.defaultdict(list), collections.defaultdict(list)
            outputs = {}
            for _ in range(args.repeats):
                for method in methods:
                    seconds, total, tokens, out = run(target, drafter, ids, method, args.max_new_tokens, clock)
                    host[method].append(1e3 * seconds / tokens)
                    whole[method].append(1e3 * total / tokens)
                    outputs.setdefault(method, out)
            assert all(out == outputs["plain"] for out in outputs.values()), f"{name}: outputs differ"
            rows.append({"prompt": name, **{m: round(statistics.median(v), 3) for m, v in host.items()},
                         "whole call": {m: round(statistics.median(v), 2) for m, v in whole.items()}})
    print(f"ms per new token outside the target's and drafter's forwards (median of {args.repeats}, "
          f"{args.threads} thread(s), load average {load_before} -> {load_average()})\n")
    print("| prompt | " + " | ".join(methods) + " |\n" + "|---" * (len(methods) + 1) + "|")
    for row in rows:
        print(f"| {row['prompt']} | " + " | ".join(f"{row[m]:.2f}" for m in methods) + " |")
    print("\nms per new token, the whole call\n\n| prompt | " + " | ".join(methods) + " |\n"
          + "|---" * (len(methods) + 1) + "|")
    for row in rows:
        print(f"| {row['prompt']} | " + " | ".join(f"{row['whole call'][m]:.1f}" for m in methods) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"stamp": run_stamp(target.device, load_before), "threads": args.threads,
                       "repeats": args.repeats, "methods": methods, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
