# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""The package's one clock, and the widths verify forwards run at: those a CPU's matrix kernels run fastest, or those
a captured (compiled) forward exists for.

Generation, the draft policy, trees and the benchmarks all time work with :func:`synchronized_clock`; every verify
forward's row count goes through :func:`verify_rows` (a tree's through :func:`gemm_friendly_rows`: trees run eager).
Part of the remote-code payload: imports only torch.
"""

import functools
import math
import time

import torch


def synchronized_clock(device) -> float:
    """perf_counter after the device's queued work is done, so a difference of two covers the work, not its launch.

    Example:
        >>> synchronized_clock(torch.device("cpu")) > 0
        True
    """
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def captured_widths(widest: int) -> tuple[int, ...]:
    """The verify widths a captured forward is compiled for: 1 (a plain step), the powers of two below `widest` (the
    anchor and the drafter's whole block, or the longest prompt-lookup draft), and `widest`. Few widths, because each
    costs a compile (seconds on a GPU, a minute for SmolLM2 on one CPU thread); a verify rounded up to the next one
    costs little where the forward is bound by reading the weights, and is padded exactly as
    :func:`gemm_friendly_rows` pads (output never changes).

    Example:
        >>> captured_widths(16), captured_widths(10)
        ((1, 2, 4, 8, 16), (1, 2, 4, 8, 10))
    """
    return tuple(sorted({1 << k for k in range(widest.bit_length()) if 1 << k < widest} | {widest}))


def verify_rows(rows: int, device: torch.device, batch: int = 1, most: int | None = None,
                captured: tuple[int, ...] = ()) -> int:
    """The rows a verify forward of `rows` candidates runs: the smallest `captured` width (a compiled forward exists
    for it) that holds them and fits in `most` (a static cache's free slots; None: no end), else
    :func:`gemm_friendly_rows` (an eager forward).

    Example:
        >>> cpu = torch.device("cpu")
        >>> verify_rows(3, cpu, captured=(1, 2, 4, 8)), verify_rows(3, cpu, most=3, captured=(1, 2, 4, 8))
        (4, 3)
    """
    fitting = [width for width in captured if rows <= width and (most is None or width <= most)]
    return min(fitting) if fitting else gemm_friendly_rows(rows, device, batch, most)


def gemm_friendly_rows(rows: int, device: torch.device, batch: int = 1, most: int | None = None) -> int:
    """`rows` rounded up to 16 where this CPU's fp32 GEMM runs 16 rows faster than `rows` (see
    :func:`rows_slower_than_sixteen`) and 16 rows fit in `most` (a static cache's free slots; None: no end);
    unchanged elsewhere, on GPUs and in batches.

    Example:
        >>> cpu = torch.device("cpu")
        >>> gemm_friendly_rows(8, cpu), gemm_friendly_rows(9, cpu, batch=2), gemm_friendly_rows(9, torch.device("meta"))
        (8, 9, 9)
    """
    padded = device.type == "cpu" and batch == 1 and 9 <= rows < 16 and rows in rows_slower_than_sixteen()
    return 16 if padded and (most is None or most >= 16) else rows


@functools.cache
def rows_slower_than_sixteen() -> frozenset[int]:
    """The row counts 9..15 that this CPU's fp32 matrix product runs slower than 16 rows, measured once per process
    (~20 ms): a verify of that many rows is padded to 16. Some BLAS kernels start a faster path at 16 rows (seen on an
    AVX2 machine: 9..15 rows cost more than 16); on others, padding wastes time (an AVX-512 EPYC: 12 rows cost 0.72 of
    16, and a 10-draft prompt lookup then cost 16 rows instead of 11). Output never depends on it.

    Example:
        >>> rows_slower_than_sixteen() <= set(range(9, 16))
        True
    """
    weight = torch.full((576, 1536), 0.5)  # not torch.randn: a user's seeded sampling must not see this draw
    rows = {n: torch.full((n, 576), 0.5) for n in range(9, 17)}
    best = {n: math.inf for n in rows}
    for _ in range(15):  # interleaved, least of 15: a load spike on a shared machine must not decide
        for n, x in rows.items():
            start = time.perf_counter()
            x @ weight
            best[n] = min(best[n], time.perf_counter() - start)
    return frozenset(n for n in range(9, 16) if best[16] < 0.97 * best[n])
