# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""What one ``generate()`` call with a DFlash drafter measured (``drafter.last_stats``).

Part of the remote-code payload: imports only torch, transformers and sibling modules.
"""

import math
from dataclasses import dataclass, field

import torch

# Zero acceptance is never silent: a drafter trained for its target accepts its first draft far more often
# than TRAINED_FLOOR (the shipped SmolLM2 drafter, ~5 CPU-hours of training: ~0.37; published ones more), an
# untrained one or one paired with the wrong target ~0. A pair is reported once its measured rate is at most
# ALMOST_NEVER and a drafter accepting at TRAINED_FLOOR would accept that few with probability below SURE: zero of
# 57 first drafts, 2 of 87, 5 of 123.
TRAINED_FLOOR = 0.15
ALMOST_NEVER = 0.05
SURE = 1e-4


@dataclass
class DFlashStats:
    """Statistics of one ``generate()`` call with a DFlash drafter (``drafter.last_stats``).

    ``acceptance_lengths`` has one entry per verification: accepted drafts + 1 (the target's own token), so the
    mean is the paper's tau; ``drafts_per_cycle`` how many drafts each cycle verified (0: a plain target step, which
    the cost-aware policy takes when speculation does not pay), ``lookup_cycles`` how many of those cycles verified
    prompt-lookup drafts instead of the drafter's. Times are wall-clock seconds, the device
    synchronised around each timed step (so CUDA times are the work's, not its launch's); ``verify_seconds`` is the
    target's share of the cycles (its forward, the acceptance and the commit, for chains and trees alike: the span
    the draft policy's cost table learns from). With captured forwards (``dflash_compile=True``), ``graphs_compiled``
    counts the graphs compiled during the call and ``compile_seconds`` the seconds of the cycles that compiled them
    (inside ``verify_seconds`` and ``total_seconds``: subtract them for the decoding's own time).

    Example:
        >>> stats = DFlashStats(block_size=4, row_acceptance_lengths=[[]])
        >>> stats.add_verification([0], torch.tensor([2])); stats.add_verification([0], torch.tensor([0]))
        >>> stats.mean_acceptance_length, stats.acceptance_by_position()
        (2.0, [0.5, 0.5, 0.0])
    """

    block_size: int
    acceptance_lengths: list[int] = field(default_factory=list)
    drafts_per_cycle: list[int] = field(default_factory=list)
    lookup_cycles: int = 0
    row_acceptance_lengths: list[list[int]] = field(default_factory=list)
    new_tokens: int = 0
    prefill_seconds: float = 0.0
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    total_seconds: float = 0.0
    graphs_compiled: int = 0
    compile_seconds: float = 0.0
    # verifications (per row) of at least one drafter draft, not a plain step or a prompt-lookup chain, and how many
    # of them accepted the first draft (the default policy's probes count as any other; a greedy call's probe scored
    # instead of verified counts as one, its first draft judged against the token the target chose)
    drafted_verifications: int = 0
    first_drafts_accepted: int = 0
    # set when the drafts of this drafter with this target are almost never accepted: the measured rate and the likely
    # causes (also logged, once per pair; see diagnostics_dflash.check_acceptance)
    low_acceptance: str | None = None
    _lookups_verified: int = field(default=0, repr=False)

    @property
    def mean_acceptance_length(self) -> float:
        return sum(self.acceptance_lengths) / len(self.acceptance_lengths) if self.acceptance_lengths else 0.0

    @property
    def num_verifications(self) -> int:
        return len(self.acceptance_lengths)

    def acceptance_by_position(self) -> list[float]:
        """Fraction of verifications whose draft at block position k (1 .. block_size-1) was accepted."""
        return acceptance_by_position(self.acceptance_lengths, self.block_size)

    def add_verification(self, rows: list[int], accepted: torch.Tensor, num_drafts: int | None = None) -> None:
        """One verification: original batch row `rows[r]` accepted `accepted[r]` drafts (of `num_drafts` verified,
        which, when given, is counted in ``drafts_per_cycle``)."""
        # the loop counts a prompt-lookup cycle just before verifying it: those drafts are not the drafter's
        from_lookup, self._lookups_verified = self.lookup_cycles > self._lookups_verified, self.lookup_cycles
        for row, n in zip(rows, accepted.tolist()):
            self.acceptance_lengths.append(n + 1)
            self.row_acceptance_lengths[row].append(n + 1)
            if num_drafts != 0 and not from_lookup:
                self.drafted_verifications += 1
                self.first_drafts_accepted += int(n > 0)
        if num_drafts is not None:
            self.drafts_per_cycle.append(num_drafts)

    def add_scored_probe(self, first_draft: int | None, tokens: torch.Tensor) -> None:
        """A probe scored instead of verified (batch size 1, greedy; None: this cycle was none): its `first_draft`
        would have been accepted exactly when the target chose it, ``tokens[0, 0]``. Counted as a verification, so a
        drafter whose drafts are never taken is noticed under the default policy too (its probes are what it gets)."""
        if first_draft is not None:
            self.drafted_verifications += 1
            self.first_drafts_accepted += int(int(tokens[0, 0]) == first_draft)

    @property
    def first_draft_acceptance(self) -> float | None:
        """Share of the drafter's verified blocks (and scored probes) whose first draft was accepted, or would have
        been (None: none judged)."""
        return self.first_drafts_accepted / self.drafted_verifications if self.drafted_verifications else None


def acceptance_by_position(acceptance_lengths: list[int], block_size: int) -> list[float]:
    """Fraction of verifications whose draft at block position k (1 .. block_size-1) was accepted.

    Example:
        >>> acceptance_by_position([1, 4, 2, 1], block_size=4)
        [0.5, 0.25, 0.25]
    """
    n = max(1, len(acceptance_lengths))
    return [sum(a > k for a in acceptance_lengths) / n for k in range(1, block_size)]


@dataclass
class AcceptanceEvidence:
    """First-draft acceptances of one (drafter, target) pair over all its generate() calls, and the finding once
    they show the drafts are almost never accepted.

    Example:
        >>> evidence = AcceptanceEvidence()
        >>> evidence.add(DFlashStats(block_size=4, drafted_verifications=56)); evidence.almost_never_accepted()
        False
        >>> evidence.add(DFlashStats(block_size=4, drafted_verifications=1)); evidence.almost_never_accepted()
        True
    """

    verified: int = 0
    accepted: int = 0
    calls: int = 0
    finding: str | None = None

    def add(self, stats: DFlashStats) -> None:
        self.verified += stats.drafted_verifications
        self.accepted += stats.first_drafts_accepted
        self.calls += 1

    @property
    def rate(self) -> float:
        return self.accepted / self.verified if self.verified else 0.0

    def almost_never_accepted(self) -> bool:
        """At most ALMOST_NEVER accepted, and too few for a drafter that accepts TRAINED_FLOOR of its first drafts."""
        if not self.verified or self.accepted > ALMOST_NEVER * self.verified:
            return False
        return binomial_cdf(self.accepted, self.verified, TRAINED_FLOOR) < SURE


def binomial_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k) for X ~ Binomial(n, p), summed in log space (n may be large).

    Example:
        >>> round(binomial_cdf(0, 57, 0.15), 6), round(binomial_cdf(1, 2, 0.5), 2)
        (9.5e-05, 0.75)
    """
    log_terms = [math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * math.log(p)
                 + (n - i) * math.log1p(-p) for i in range(k + 1)]
    top = max(log_terms)
    return math.exp(top) * sum(math.exp(t - top) for t in log_terms)
