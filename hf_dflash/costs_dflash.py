# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""Measured costs of a target's verify forwards by width, and of a drafter forward: what the cost-aware draft policy
(policy_dflash.py) weighs. One :class:`CostTable` per target, device, dtype, batch size and length of context, kept
with the target (weakly keyed) and refined by every ``generate()`` call of the process.

Part of the remote-code payload: imports only the standard library.
"""

import bisect
import collections
import contextvars
import math
import statistics
import weakref


class CostTable:
    """Measured seconds of the target's verify forward by width, and of one drafter forward.

    Each cost comes from its last ``WINDOW`` samples: timing noise on a shared machine mostly adds time (a load spike,
    another process's burst, a page fault), so one or two bad samples cannot move the estimate, while a machine that
    really got slower (or faster) shows in every sample and moves it within ``WINDOW`` samples. The widths that
    drafting cycles measure count at their lower median (what a machine under steady load typically pays, not its
    luckiest cycle), t(1) at its least sample (see :attr:`verify`). ``age(width)``
    counts the verify observations since that width was last measured (the policy refreshes a stale t(1)). A width not
    measured lately is forgotten, estimated from its neighbours until the policy chooses it again: after 16
    observations when one sample backs it (it may have met a spike), 64 after two, ``FORGET`` after more. The widest
    width measured is kept as its ratio to t(1) (``far_end``): forgotten, it is priced in today's t(1) at the square
    root of that ratio (see :meth:`_points`).

    Example:
        >>> table = CostTable()
        >>> table.observe_verify(1, 0.010); table.observe_verify(16, 0.030); table.observe_verify(1, 0.050)  # a spike
        >>> table.verify[1], round(table.verify_seconds(6), 4), table.verify_seconds(32) > 0.030, table.age(1)
        (0.01, 0.0229, True, 0)
    """

    WINDOW = 5
    FORGET = 256

    def __init__(self):
        self.verify_samples: dict[int, collections.deque] = {}
        self.draft_samples: collections.deque = collections.deque(maxlen=self.WINDOW)
        self.observations = 0
        self.last_observed: dict[int, int] = {}
        # (observations, envelope, its widths) of the last ask
        self._envelope: tuple[int, list[tuple[int, float]], list[int]] = (-1, [], [])
        # (the widest width measured, its cost over t(1)) when last measured: the far end of the curve, which the
        # policy re-measures only while drafting. Without it, once forgotten, every verify wider than the widest width
        # left was priced as that one, often t(1) itself: after 16 plain steps a 10-token prompt lookup that held
        # 1 time in 20 looked as cheap as a plain step, and was verified (SmolLM2-135M on MT-Bench, AMD EPYC).
        self.far_end: tuple[int, float] | None = None

    @property
    def verify(self) -> dict[int, float]:
        """{width: seconds} of the widths measured lately, widths ascending: t(1), re-measured only every REFRESH
        cycles while drafting, by its least sample (one fresh sample corrects a table a loaded machine left); the
        widths a drafting cycle measures, by their lower median (robust to two spikes in five samples, and
        what a machine under steady load typically pays: its least sample there is ~10% below a verify of 4-16 rows
        next to another inference job on this 2-core CPU, 3% for one row, which made drafting look cheaper)."""
        return {width: (min if width == 1 else statistics.median_low)(samples)
                for width, samples in sorted(self.verify_samples.items())
                if self.age(width) < min(self.FORGET, 4 ** (len(samples) + 1))}

    @property
    def draft(self) -> float | None:
        return statistics.median_low(self.draft_samples) if self.draft_samples else None

    def observe_verify(self, width: int, seconds: float) -> None:
        self.verify_samples.setdefault(width, collections.deque(maxlen=self.WINDOW)).append(seconds)
        self.last_observed[width] = self.observations
        self.observations += 1
        # the far end's ratio is taken when the widest width is measured, or at the first t(1) after it (a call
        # measures its full block first); plain steps otherwise leave it, and the verify costs, alone
        widest = max(self.verify_samples)
        if widest > 1 and (width == widest or (width == 1 and self.far_end is None)):
            one_row = self.verify.get(1)
            if one_row:
                self.far_end = (widest, statistics.median_low(self.verify_samples[widest]) / one_row)

    def observe_draft(self, seconds: float) -> None:
        self.draft_samples.append(seconds)

    def age(self, width: int) -> int | None:
        """Verify observations since `width` was last measured (None: never)."""
        seen = self.last_observed.get(width)
        return None if seen is None else self.observations - 1 - seen

    def stale(self, width: int, refresh: int) -> bool:
        """Whether `width` is due for a new measurement: `refresh` observations after the last one, sooner while few
        samples back its estimate (4 after the first, 16 after the second...: a lone first sample may have met a
        spike, or the cold start of a call).

        Example:
            >>> table = CostTable()
            >>> table.observe_verify(16, 0.03); [table.observe_verify(1, 0.01) for _ in range(4)] and None
            >>> table.stale(16, refresh=64), table.stale(1, refresh=64)
            (True, False)
        """
        age = self.age(width)
        return age is not None and age >= min(refresh, 4 * len(self.verify_samples[width]) ** 2)

    def cheaper_wider(self, width: int, most: int) -> int:
        """The width a verify of `width` rows is best run at: the cheapest width in (`width`, `most`] measured lately,
        where it costs at least 3% less than `width`'s own measurement, else `width` (also where `width` is not
        measured lately: it is measured when run). A CPU's matrix product runs some row counts slower than more rows
        (SmolLM2-135M, one thread of an Intel Xeon: 9 to 15 rows cost 1.07-1.45x 16 rows), and
        :meth:`verify_seconds` already counts the narrower width at the wider one's cost: padding the verify makes the
        loop pay what the policy expects.

        Example:
            >>> table = CostTable()
            >>> for width, seconds in [(1, 1.0), (3, 2.0), (4, 1.6), (8, 2.4)]:
            ...     table.observe_verify(width, seconds)
            >>> table.cheaper_wider(3, most=16), table.cheaper_wider(2, most=16), table.cheaper_wider(3, most=3)
            (4, 2, 3)
        """
        costs = self.verify
        if width not in costs:
            return width
        cheapest = min((wider for wider in costs if width < wider <= most), key=costs.get, default=width)
        return cheapest if costs[cheapest] < 0.97 * costs[width] else width

    def verify_seconds(self, width: int, optimistic: bool = False) -> float | None:
        """Seconds of a verify of `width` rows: on the non-decreasing lower envelope of the measured widths, between
        two of them on a straight line in the logarithm of the width (`optimistic`: in the width itself, the chord),
        past the ends along the nearest segment; None if none is measured.

        A wider verify never costs less (it does all the narrower one's work), so a width measured above a wider one
        met a load spike and counts at the wider one's cost. Between measured widths the curve is priced concave: on a
        CPU most of a wide verify's extra cost comes at 2 rows, where the GEMM kernel replaces the matrix-vector one
        (SmolLM2-135M, one thread: t(2) ~ 1.45 t(1) and t(16) ~ 2.2 t(1) on an Intel Xeon, 1.8 and 2.9 on an AMD
        EPYC), so the chord from t(1) to t(16) priced 2 rows at ~1.1 t(1) and a 1-draft prompt lookup that held 1
        time in 6 looked worth verifying. Interior widths are measured when chosen; the policy looks at the chord only
        to decide whether an unmeasured width is worth a probe (a spiked far end must not keep drafting out for good).

        Example:
            >>> table = CostTable()
            >>> for width, seconds in [(1, 1.0), (2, 1.45), (2, 1.5), (4, 9.0), (16, 2.2), (16, 2.3)]:  # 4: a spike
            ...     table.observe_verify(width, seconds)
            >>> [round(table.verify_seconds(w), 2) for w in (2, 4, 9)]
            [1.45, 2.2, 2.2]
            >>> for _ in range(16):  # 16 observations later, the lone (spiked) sample of width 4 is forgotten
            ...     table.observe_verify(1, 1.0)
            >>> [round(table.verify_seconds(w), 2) for w in (2, 4, 9)], round(table.verify_seconds(4, True), 2)
            ([1.45, 1.7, 1.99], 1.56)
        """
        # the policy asks ~30 widths per cycle; the envelope changes only with a new observation
        if self._envelope[0] != self.observations:
            points = _monotone_envelope(self._points())
            self._envelope = (self.observations, points, [x for x, _ in points])
        _, points, widths = self._envelope
        if len(points) == 1:
            return points[0][1]
        if not points:
            return None
        # the segment whose right end is the first width above `width` (the last segment past the end)
        right = min(bisect.bisect_left(widths, width), len(points) - 1)
        (x0, y0), (x1, y1) = points[max(0, right - 1)], points[max(1, right)]
        if x0 < width < x1 and not optimistic:
            return y0 + (y1 - y0) * math.log(width / x0) / math.log(x1 / x0)
        return max(1e-9, y0 + (width - x0) * (y1 - y0) / (x1 - x0))

    def _points(self) -> list[tuple[int, float]]:
        """The (width, seconds) the curve goes through: the widths measured lately and, where the widest measured was
        forgotten, that far end at t(1) x sqrt(its ratio to t(1) when measured), never below a cost measured lately.

        Kept whole, a ratio measured during a load spike (a lone sample) priced full blocks out until the policy
        happened to re-measure one; dropped, wide verifies were priced as the widest width left. Shrunk in log space
        halfway towards 1, it stays optimistic enough that a drafter which pays is tried again (and re-measured) and
        dear enough that what rarely holds is not verified; below a cost measured lately it would pull that
        measurement down (the curve never falls with width)."""
        costs = self.verify
        if self.far_end and 1 in costs and self.far_end[0] > max(costs):
            costs[self.far_end[0]] = max(math.sqrt(self.far_end[1]) * costs[1], max(costs.values()))
        return list(costs.items())


def _monotone_envelope(points: list[tuple[int, float]]) -> list[tuple[int, float]]:
    """`points` sorted by x with each y lowered to the least y at that x or beyond (a running minimum from the
    right): the highest non-decreasing curve under them.

    Example:
        >>> _monotone_envelope([(1, 1.0), (4, 9.0), (8, 1.5), (16, 3.0)])  # (4, 9.0) was measured during a spike
        [(1, 1.0), (4, 1.5), (8, 1.5), (16, 3.0)]
    """
    envelope, least = [], math.inf
    for x, y in reversed(points):
        least = min(least, y)
        envelope.append((x, least))
    return envelope[::-1]


# target -> {(device, dtype, batch, context bucket): CostTable}: measured once, refined by every generate() call;
# weakly keyed, so the tables go with the target (a new model never inherits a collected one's costs, as an id() key
# could)
_COST_TABLES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
def cost_tables(target) -> dict:
    """{(device, dtype, batch, context bucket[, "captured"][, kernel]): CostTable} measured for `target` in this
    process (a new, empty dict the first time; captured forwards, and forwards with another matrix kernel, have their
    own tables). Shared by every call on `target`, whichever
    thread runs it: calls running at once slow each other down, and their measurements say so."""
    return _COST_TABLES.setdefault(target, {})


def context_bucket(tokens: int) -> int:
    """The cost table's bucket for a cached context of `tokens`: 0 below 1,024 tokens, then one per doubling.

    Costs change with the context a forward attends to: a one-row step reads the whole cache once, a verify of k rows
    reads it once too but attends k rows to all of it, so t(k)/t(1) moves with the context (SmolLM2-135M, one CPU
    thread, t(16)/t(1): 2.0 after 114 tokens, 2.2 after 4K; 3.3 there with transformers' masked attention, which copies
    the cache per query head; on GPUs it tends to fall). Costs measured on short prompts must not decide for long ones,
    nor the reverse: a user
    switching between a chat and a long document gets each one's own costs (a new bucket costs one full block and one
    plain step to measure, once per process).

    Example:
        >>> [context_bucket(n) for n in (0, 1023, 1024, 2047, 2048, 4096, 8000, 32768)]
        [0, 0, 1, 1, 2, 3, 3, 6]
    """
    return (tokens // 1024).bit_length()


# the matrix kernel the forwards of this thread (or asyncio task) run with, when not torch's own: set inside the
# installed package's few-row kernel context (kernels_cpu.few_row_kernels, which also reads it to route layers only
# in this context); their costs are a table of their own
FORWARD_KERNEL: contextvars.ContextVar[str | None] = contextvars.ContextVar("hf_dflash_forward_kernel", default=None)


def cost_table(target, device, batch: int, context: int = 0, captured: bool = False) -> CostTable:
    """The :class:`CostTable` of `target` on `device` at batch size `batch` with about `context` tokens cached, for
    its eager forwards or its `captured` ones (compiled: capture_dflash.py), and for the matrix kernel the forwards
    run with (:data:`FORWARD_KERNEL`)."""
    key = (str(device), str(target.dtype), batch, context_bucket(context)) + (("captured",) if captured else ())
    kernel = FORWARD_KERNEL.get()
    return cost_tables(target).setdefault(key + ((kernel,) if kernel else ()), CostTable())
