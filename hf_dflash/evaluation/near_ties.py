# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""The near-tie rule: what "the same output as plain ``generate``" promises where rounding can differ.

In fp32 on a CPU, greedy output with a drafter is token-identical to plain greedy (``tests/test_numerics.py``). Where
the verify forward (up to 16 rows at once) and plain decoding (one row) may round differently, that is in bf16 and
fp16 anywhere, and in fp32 on CUDA (a 16-row and a 1-row GEMM may run different kernels that sum in another order),
the promise is: **the output is identical to plain ``generate``, or, in each row, the first new token where it
differs is a near-tie of plain's own logits at that step**: the logit plain gave its own token exceeds the logit
plain gave the token the assisted run committed by at most ``ulps`` units in the last place (ulp) of the larger of
the two logits' magnitudes, in the target's dtype (:func:`near_tie_tolerance`). After that token the two runs
continue from different text, so nothing past the first difference is compared.

Default tolerances (:data:`DEFAULT_ULPS`): bf16 and fp16 4 ulps (bf16 keeps 8 significant bits: a logit of 16-32 is
a multiple of 0.125, so 4 ulps is 0.5 there; SmolLM2-135M in bf16 on a CPU differed at gaps of at most 2 ulps,
``benchmarks/bf16_near_ties.py``); fp32 1024 ulps (about 1.2e-4 of the logit: summation order across a whole
network, far above the ~1e-6 a 16-row and a 1-row forward differ by on a CPU, far below the gap of a wrong token).
A fault that commits a token the target did not choose shows a gap of many ulps and is flagged.

Example:
    >>> import torch
    >>> near_tie_tolerance(20.0, torch.bfloat16)  # 4 bf16 ulps at a logit of 16-32 (ulp 0.125)
    0.5
    >>> logit_ulp(1.5, torch.float32) == 2.0**-23
    True
"""

import dataclasses
import math

import torch

from .methods import first_difference

MANTISSA_BITS = {torch.float32: 23, torch.bfloat16: 7, torch.float16: 10, torch.float64: 52}
DEFAULT_ULPS = {torch.float32: 1024, torch.bfloat16: 4, torch.float16: 4, torch.float64: 1024}


def logit_ulp(value: float, dtype: torch.dtype) -> float:
    """The spacing of `dtype` numbers at `value` (its unit in the last place; the smallest normal's at 0).

    Example:
        >>> logit_ulp(20.0, torch.bfloat16), logit_ulp(-3.0, torch.float16)
        (0.125, 0.001953125)
    """
    if dtype not in MANTISSA_BITS:
        raise ValueError(f"dtype={dtype} has no near-tie rule; use one of {sorted(map(str, MANTISSA_BITS))}.")
    magnitude = max(abs(float(value)), float(torch.finfo(dtype).tiny))
    return 2.0 ** (math.floor(math.log2(magnitude)) - MANTISSA_BITS[dtype])


def near_tie_tolerance(value: float, dtype: torch.dtype, ulps: float | None = None) -> float:
    """The largest logit gap that counts as a near-tie at a logit of `value` in `dtype`: `ulps` (default
    :data:`DEFAULT_ULPS` of `dtype`) ulps of `value`.

    Example:
        >>> near_tie_tolerance(20.0, torch.bfloat16, ulps=2)
        0.25
    """
    ulps = DEFAULT_ULPS.get(dtype, 0) if ulps is None else ulps
    return ulps * logit_ulp(value, dtype)


@dataclasses.dataclass(frozen=True)
class Divergence:
    """Where one row of an assisted output first differs from plain ``generate``, judged by plain's logits there.

    Attributes:
        row: the batch row.
        step: the index among the new tokens.
        taken: the token the assisted run committed there (None: its output ended there).
        plain: plain's token there (None: plain's output ended there).
        gap: plain's logit of its own token minus its logit of `taken` (inf when either run ended there).
        tolerance: the largest gap that counts as a near-tie there (:func:`near_tie_tolerance`).
        rank: `taken`'s rank in plain's logits (0: plain's argmax; 1: the runner-up); -1 when a run ended.
    """

    row: int
    step: int
    taken: int | None
    plain: int | None
    gap: float
    tolerance: float
    rank: int

    @property
    def near_tie(self) -> bool:
        """Whether the difference is allowed: the gap is within the tolerance."""
        return self.gap <= self.tolerance

    def describe(self) -> str:
        """One line: where, which tokens, the gap against the tolerance, and the verdict.

        Example:
            >>> print(Divergence(0, 7, 5, 9, 0.125, 0.5, 1).describe())
            row 0, new token 7: took 5 where plain took 9 (rank 1 in plain's logits), gap 0.125 <= 0.5: near-tie
        """
        verdict = "near-tie" if self.near_tie else "NOT a near-tie"
        sign = "<=" if self.near_tie else ">"
        return (f"row {self.row}, new token {self.step}: took {self.taken} where plain took {self.plain} "
                f"(rank {self.rank} in plain's logits), gap {self.gap:.4g} {sign} {self.tolerance:.4g}: {verdict}")


def _sequences(output) -> torch.Tensor:
    return output.sequences if hasattr(output, "sequences") else output


def first_divergences(assisted, plain, prompt_length: int, dtype: torch.dtype,
                      ulps: float | None = None) -> list[Divergence]:
    """Each row's first difference between an assisted ``generate`` output and plain's, judged by plain's logits.

    Args:
        assisted: the assisted run's output (a tensor of ids or a ``GenerateOutput``).
        plain: plain ``generate``'s output with its logits (``return_dict_in_generate=True, output_logits=True``).
        prompt_length: the prompt's length (new tokens start there).
        dtype: the target's dtype (sets the ulp; :func:`near_tie_tolerance`).
        ulps: the tolerance in ulps (default :data:`DEFAULT_ULPS` of `dtype`).

    Returns:
        One :class:`Divergence` per row that differs (identical rows give none).

    Example (a vocabulary of 3: at the second new token plain's logits are 2.0 and 1.99 for tokens 0 and 1):
        >>> import types
        >>> logits = (torch.tensor([[0.0, 0.0, 5.0]]), torch.tensor([[2.0, 1.99, -1.0]]))
        >>> plain = types.SimpleNamespace(sequences=torch.tensor([[7, 2, 0]]), logits=logits)
        >>> [d.near_tie for d in first_divergences(torch.tensor([[7, 2, 1]]), plain, 1, torch.bfloat16)]
        [True]
        >>> [d.near_tie for d in first_divergences(torch.tensor([[7, 2, 2]]), plain, 1, torch.bfloat16)]
        [False]
    """
    if getattr(plain, "logits", None) is None:
        raise ValueError("plain has no logits: call plain generate with return_dict_in_generate=True and "
                         "output_logits=True, then pass its output.")
    got, expected = _sequences(assisted)[:, prompt_length:].tolist(), _sequences(plain)[:, prompt_length:].tolist()
    divergences = []
    for row, (a, b) in enumerate(zip(got, expected)):
        step = first_difference(a, b)
        if step is None:
            continue
        taken = a[step] if step < len(a) else None
        own = b[step] if step < len(b) else None
        if taken is None or own is None or step >= len(plain.logits):
            divergences.append(Divergence(row, step, taken, own, math.inf, 0.0, -1))
            continue
        logits = plain.logits[step][row].float()
        gap = float(logits[own] - logits[taken])
        magnitude = max(abs(float(logits[own])), abs(float(logits[taken])))
        rank = int((logits > logits[taken]).sum())
        divergences.append(Divergence(row, step, taken, own, gap, near_tie_tolerance(magnitude, dtype, ulps), rank))
    return divergences


def assert_identical_or_near_tie(assisted, plain, prompt_length: int, dtype: torch.dtype,
                                 ulps: float | None = None, what: str = "") -> list[Divergence]:
    """Raises AssertionError unless every row of `assisted` equals plain's or first differs at a near-tie of plain's
    logits (:func:`first_divergences`); returns the near-tie divergences (empty: identical).

    Example (plain's logits at the second new token tie tokens 0 and 1 within 4 bf16 ulps):
        >>> import types
        >>> logits = (torch.tensor([[0.0, 0.0, 5.0]]), torch.tensor([[2.0, 1.99, -1.0]]))
        >>> plain = types.SimpleNamespace(sequences=torch.tensor([[7, 2, 0]]), logits=logits)
        >>> assert_identical_or_near_tie(plain.sequences, plain, 1, torch.bfloat16)
        []
        >>> len(assert_identical_or_near_tie(torch.tensor([[7, 2, 1]]), plain, 1, torch.bfloat16))
        1
    """
    divergences = first_divergences(assisted, plain, prompt_length, dtype, ulps)
    faults = [d for d in divergences if not d.near_tie]
    if faults:
        raise AssertionError(f"{what}output differs from plain generate beyond a near-tie ({dtype}):\n"
                             + "\n".join(d.describe() for d in faults))
    return divergences
