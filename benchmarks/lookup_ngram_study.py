# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""How well prompt-lookup offers predict the text, by the n-gram size that found them: offline, no timing.

SmolLM2-135M-Instruct (fp32) answers each prompt greedily once; at every position of the answer the lookup offer
(up to 10 tokens) is found from the text so far, as the loop would find it, for the longest n-gram tried
(`--max-ngrams`, transformers' ``max_matching_ngram_size``) and for the first (leftmost, transformers' choice) or the
latest earlier occurrence, and scored against the answer. Per dataset and variant, per matched size n: offers, the
share whose first draft holds, the mean drafts held.

    python benchmarks/lookup_ngram_study.py --datasets summarize,doc_qa,code_edit,mtbench --limit 3
"""

import argparse
import collections

import torch

from hf_dflash.data.chat import chat_input_ids
from hf_dflash.evaluation.prompts import load_eval_prompts
from hf_dflash.models import load_target

OFFER = 10


def offer(history: list[int], max_ngram: int, latest: bool) -> tuple[list[int], int]:
    """(the continuation on offer after `history`, the n-gram size that found it; ([], 0): none): with `latest` False
    exactly ``lookup_dflash.prompt_lookup_match`` (the loop's), on lists, with the latest occurrence as a variant."""
    for size in range(min(max_ngram, len(history) - 1), 0, -1):
        tail = history[-size:]
        starts = [s + size for s in range(len(history) - size) if history[s : s + size] == tail]
        if starts:
            start = starts[-1] if latest else starts[0]
            return history[start : start + OFFER], size
    return [], 0


def held(drafts: list[int], text: list[int]) -> int:
    """How many of `drafts` the text repeats before the first that differs."""
    return next((i for i, (a, b) in enumerate(zip(drafts, text)) if a != b), min(len(drafts), len(text)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", default="summarize,doc_qa,code_edit,multi_turn,aime2025,gsm8k,mtbench")
    parser.add_argument("--limit", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--max-ngrams", default="2,3,4")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target, tokenizer = load_target(None, device="cpu", dtype=torch.float32)
    variants = [(n, latest) for n in map(int, args.max_ngrams.split(",")) for latest in (False, True)]
    print("| dataset | longest n-gram | occurrence | per matched size n: offers / first draft held / drafts held |")
    print("|---|---|---|---|")
    for dataset in args.datasets.split(","):
        answers = []
        for prompt in load_eval_prompts(dataset, args.limit, tokenizer):
            ids = chat_input_ids(tokenizer, prompt)
            with torch.inference_mode():
                out = target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                      max_new_tokens=args.max_new_tokens)
            answers.append((ids[0].tolist(), out[0, ids.shape[1]:].tolist()))
        for max_ngram, latest in variants:
            by_size = collections.defaultdict(lambda: [0, 0, 0])  # size -> offers, first held, drafts held
            for prompt, answer in answers:
                for i in range(len(answer) - 1):
                    drafts, size = offer(prompt + answer[:i], max_ngram, latest)
                    if drafts:
                        count = held(drafts, answer[i:])
                        by_size[size][0] += 1
                        by_size[size][1] += count > 0
                        by_size[size][2] += count
            cells = ", ".join(f"n{n}: {c} / {first / c:.2f} / {drafts / c:.1f}"
                              for n, (c, first, drafts) in sorted(by_size.items(), reverse=True))
            print(f"| {dataset} | {max_ngram} | {'latest' if latest else 'first'} | {cells} |", flush=True)


if __name__ == "__main__":
    main()
