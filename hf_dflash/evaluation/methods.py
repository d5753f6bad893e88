# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""The bench's methods (see :mod:`hf_dflash.evaluation.bench`) and one timed ``generate`` call of a method: its
arguments, new tokens, wall-clock seconds, counted target forwards and prefill time.
"""

import contextlib
from dataclasses import dataclass

import torch

from ..generation_dflash import builtin_generation
from ..models import pad_token_id
from ..stats_dflash import DFlashStats
from ..timing_dflash import synchronized_clock


METHODS: tuple[str, ...] = (
    "plain", "pld", "early_exit", "builtin_dflash", "dflash", "dflash_heuristic", "dflash_default", "dflash_tree",
    "dflash_tree_ngram", "dflash_default_tree", "dflash_default_kernel",
)
TREE_BUDGET = 16  # draft nodes per verification of the ``dflash_tree`` method


METHOD_LABELS = {
    "plain": "plain generate",
    "pld": "prompt lookup (10)",
    "early_exit": "early exit",
    "builtin_dflash": "transformers DFlash",
    "dflash": "hf-dflash, full blocks",
    "dflash_heuristic": "hf-dflash, heuristic draft length",
    "dflash_default": "hf-dflash default (cost-aware)",
    "dflash_tree": f"hf-dflash, tree ({TREE_BUDGET} nodes)",
    "dflash_tree_ngram": f"hf-dflash, tree ({TREE_BUDGET}) + n-gram branch",
    "dflash_default_tree": f"hf-dflash default + tree (up to {TREE_BUDGET})",
    "dflash_default_kernel": "hf-dflash default + few-row CPU kernel",
}


PROMPT_LOOKUP_TOKENS = 10


@dataclass(frozen=True)
class Sampling:
    """How the bench decodes: greedily (``temperature`` 0, the default: every output must equal plain's, token for
    token) or by sampling at ``temperature`` and ``top_p``, each prompt's calls seeded alike from ``seed`` (sampled
    outputs differ from method to method as two draws do: their law is what the tests prove; the bench times them).

    Example:
        >>> Sampling().generate_kwargs(), Sampling(0.7, top_p=0.9).generate_kwargs()
        ({'do_sample': False}, {'do_sample': True, 'temperature': 0.7, 'top_p': 0.9})
    """

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self):
        if self.temperature < 0 or not 0 < self.top_p <= 1:
            raise ValueError(f"Sampling needs temperature >= 0 (0: greedy) and 0 < top_p <= 1; got temperature="
                             f"{self.temperature}, top_p={self.top_p}.")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def generate_kwargs(self) -> dict:
        if self.greedy:
            return {"do_sample": False}
        return {"do_sample": True, "temperature": self.temperature, "top_p": self.top_p}


GREEDY = Sampling()


@dataclass
class Run:
    """One ``generate`` call: the new tokens, wall-clock seconds, target forwards and (ours) the drafter stats."""

    new_tokens: list[int]
    seconds: float
    target_forwards: int
    stats: DFlashStats | None = None
    prefill_seconds: float | None = None  # the first target forward: the prompt (None: not counted)

    @property
    def tokens_per_second(self) -> float:
        return len(self.new_tokens) / self.seconds if self.seconds > 0 else 0.0

    @property
    def ttft_seconds(self) -> float | None:
        """Time to first token: the call's first target forward, which reads the prompt and yields the first token
        (None: not timed). The same forward with or without drafts: speculative decoding cannot change it."""
        return self.prefill_seconds

    @property
    def tpot_seconds(self) -> float | None:
        """Time per output token after the first: (seconds - TTFT) / (new tokens - 1), what drafting changes (None:
        no TTFT timed, or a single new token).

        Example:
            >>> Run([7, 8, 9, 10, 11], seconds=1.0, target_forwards=5, prefill_seconds=0.2).tpot_seconds
            0.2
        """
        if self.ttft_seconds is None or len(self.new_tokens) < 2:
            return None
        return (self.seconds - self.ttft_seconds) / (len(self.new_tokens) - 1)


class ForwardCounter:
    """Counts forward calls of a module (the target's verification passes, prefill included) and times the first
    one since :meth:`reset` (a generate call's prefill).

    Example:
        >>> counter = ForwardCounter(target)  # doctest: +SKIP
        >>> counter.reset(); target.generate(ids, max_new_tokens=8)  # doctest: +SKIP
        >>> counter.calls, counter.first_seconds > 0  # doctest: +SKIP
        (8, True)
    """

    def __init__(self, module: torch.nn.Module):
        self.calls, self.first_seconds, self._started = 0, None, None
        self.device = next(module.parameters()).device
        self.handles = [module.register_forward_pre_hook(self._start), module.register_forward_hook(self._count)]

    def _start(self, *args) -> None:
        if self.calls == 0:
            self._started = synchronized_clock(self.device)

    def _count(self, *args) -> None:
        if self.calls == 0 and self._started is not None:
            self.first_seconds = synchronized_clock(self.device) - self._started
        self.calls += 1

    def reset(self) -> None:
        self.calls, self.first_seconds, self._started = 0, None, None

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first new token where two outputs differ (a shorter output differs where it ends), else None.

    Example:
        >>> first_difference([1, 2, 3], [1, 5, 3]), first_difference([1, 2], [1, 2, 3]), first_difference([1], [1])
        (1, 2, None)
    """
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def default_early_exit_layer(target) -> int:
    """The early-exit depth used for the ``early_exit`` method: a third of the target's layers (at least 1).

    Example:
        >>> default_early_exit_layer(target)  # SmolLM2: 30 layers  # doctest: +SKIP
        10
    """
    return max(1, target.config.get_text_config().num_hidden_layers // 3)


def method_kwargs(method: str, drafter=None, early_exit_layer: int | None = None) -> dict:
    """Extra ``generate`` arguments of a method.

    Example:
        >>> method_kwargs("pld")
        {'prompt_lookup_num_tokens': 10}
    """
    if method == "plain":
        return {}
    if method == "pld":
        return {"prompt_lookup_num_tokens": PROMPT_LOOKUP_TOKENS}
    if method == "early_exit":
        return {"assistant_early_exit": early_exit_layer}
    if method == "builtin_dflash":
        return {"assistant_model": drafter, "speculation_type": "dflash"}
    if method == "dflash":
        return {"assistant_model": drafter, "dflash_policy": "full"}
    if method == "dflash_default":
        return {"assistant_model": drafter}
    if method == "dflash_default_kernel":
        return {"assistant_model": drafter, "dflash_cpu_kernels": True}
    if method == "dflash_heuristic":
        return {"assistant_model": drafter, "num_assistant_tokens_schedule": "heuristic"}
    if method == "dflash_tree":
        return {"assistant_model": drafter, "dflash_tree_budget": TREE_BUDGET, "dflash_policy": "full"}
    if method == "dflash_tree_ngram":
        return {"assistant_model": drafter, "dflash_tree_budget": TREE_BUDGET, "dflash_policy": "full",
                "prompt_lookup_num_tokens": PROMPT_LOOKUP_TOKENS}
    if method == "dflash_default_tree":
        return {"assistant_model": drafter, "dflash_tree_budget": TREE_BUDGET,
                "prompt_lookup_num_tokens": PROMPT_LOOKUP_TOKENS}
    raise ValueError(f"Unknown method {method!r}; choose from {list(METHODS)}.")


def timed_generation(
    target,
    input_ids: torch.Tensor,
    max_new_tokens: int,
    method: str = "plain",
    drafter=None,
    early_exit_layer: int | None = None,
    counter: ForwardCounter | None = None,
    sampling: Sampling = GREEDY,
    seed: int = 0,
) -> Run:
    """``generate`` with one method, greedy or as `sampling` says (torch seeded with `seed` first); returns the new
    tokens, the time taken and the counted forwards.

    Example:
        >>> run = timed_generation(target, ids, 64, "dflash", drafter)  # doctest: +SKIP
        >>> run.stats.mean_acceptance_length  # doctest: +SKIP
        3.4
    """
    kwargs = method_kwargs(method, drafter, early_exit_layer)
    context = builtin_generation() if method == "builtin_dflash" else contextlib.nullcontext()
    if counter is not None:
        counter.reset()
    if not sampling.greedy:
        torch.manual_seed(seed)
    start = synchronized_clock(input_ids.device)
    with context, torch.inference_mode():
        output = target.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            max_new_tokens=max_new_tokens,
            **sampling.generate_kwargs(),
            pad_token_id=pad_token_id(target),
            **kwargs,
        )
    seconds = synchronized_clock(input_ids.device) - start
    stats = drafter.last_stats if method.startswith("dflash") else None
    forwards, prefill = (counter.calls, counter.first_seconds) if counter is not None else (0, None)
    return Run(output[0, input_ids.shape[1] :].tolist(), seconds, forwards, stats, prefill)

