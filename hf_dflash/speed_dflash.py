# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""The arithmetic the cost-aware draft policy (policy_dflash.py) weighs with: acceptance counts aged and turned into
rates by depth, and the expected tokens per second of a chain of k drafts accepted at those rates, with the best k.

Part of the remote-code payload: imports only the standard library.
"""

import itertools
import math
import operator


def decay(counts: list[float], factor: float) -> None:
    """Age observation counts in place: old cycles weigh less, so estimates follow a drifting text.

    Example:
        >>> counts = [10.0, 4.0]; decay(counts, 0.5); counts
        [5.0, 2.0]
    """
    counts[:] = [factor * c for c in counts]


def rates_by_depth(accepted: list[float], reached: list[float], prior: float = 0.5, doubt: float = 0.0) -> list[float]:
    """Acceptance rate by depth: each depth's counts shrunk towards the rate of the depth before it (the first
    towards `prior`), so a depth rarely reached lately (cycles verified fewer drafts) keeps the rate its neighbours
    show instead of falling back to an arbitrary prior that would stop longer chains from ever being tried. With
    `doubt` z, each rate is lowered by z standard errors of its estimate (sqrt(p (1 - p) / (n + 3)), n its count,
    the prior's 2 included): what to bet on when a wrong bet costs more than a missed one.

    Example:
        >>> [round(r, 2) for r in rates_by_depth([90.0, 0.0], [100.0, 0.0])]
        [0.89, 0.89]
        >>> [round(r, 2) for r in rates_by_depth([9.0, 0.0], [10.0, 0.0], doubt=1.0)]  # 10 counts: lowered by 0.11
        [0.73, 0.62]
    """
    rates, previous = [], prior
    for a, r in zip(accepted, reached):
        previous = (a + 2.0 * previous) / (r + 2.0)
        rates.append(max(0.0, previous - doubt * math.sqrt(previous * (1.0 - previous) / (r + 3.0))))
    return rates


def best_draft_count(rates: list[float], seconds) -> tuple[int, float]:
    """(k, expected tokens per second) of the best draft count k >= 1 for acceptance `rates` by depth and the
    `seconds(k)` a cycle of k drafts costs.

    Example:
        >>> k, speed = best_draft_count([0.9, 0.9, 0.1], lambda k: 1.0 + 0.1 * k)
        >>> k, round(speed, 3)
        (2, 2.258)
    """
    # one pass (the policy asks every cycle): the expected tokens of k drafts grow by the chance to reach depth k
    best, expected, reach = (0, 0.0), 1.0, 1.0
    for k, rate in enumerate(rates, 1):
        reach *= rate
        expected += reach
        speed = expected / seconds(k)
        if speed > best[1]:
            best = (k, speed)
    return best


def chain_speed(rates: list[float], k: int, seconds) -> float:
    """Expected tokens per second of a cycle verifying k drafts accepted at `rates` by depth (1 + the expected
    accepted drafts, over `seconds(k)`).

    Example:
        >>> round(chain_speed([0.5, 0.5, 0.1], 2, lambda k: 1.0 + 0.1 * k), 3)
        1.458
    """
    return (1.0 + sum(itertools.accumulate(rates[:k], operator.mul))) / seconds(k)
