# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""What one ``generate()`` call with a DFlash drafter measured (``drafter.last_stats``).

Part of the remote-code payload: imports only torch, transformers and sibling modules.
"""

from dataclasses import dataclass, field

import torch


@dataclass
class DFlashStats:
    """Statistics of one ``generate()`` call with a DFlash drafter (``drafter.last_stats``).

    ``acceptance_lengths`` has one entry per verification: accepted drafts + 1 (the target's own token), so the
    mean is the paper's tau; ``drafts_per_cycle`` how many drafts each cycle verified (0: a plain target step, which
    the cost-aware policy takes when speculation does not pay), ``lookup_cycles`` how many of those cycles verified
    prompt-lookup drafts instead of the drafter's. Times are wall-clock seconds, the device
    synchronised around each timed step (so CUDA times are the work's, not its launch's).

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
        for row, n in zip(rows, accepted.tolist()):
            self.acceptance_lengths.append(n + 1)
            self.row_acceptance_lengths[row].append(n + 1)
        if num_drafts is not None:
            self.drafts_per_cycle.append(num_drafts)


def acceptance_by_position(acceptance_lengths: list[int], block_size: int) -> list[float]:
    """Fraction of verifications whose draft at block position k (1 .. block_size-1) was accepted.

    Example:
        >>> acceptance_by_position([1, 4, 2, 1], block_size=4)
        [0.5, 0.25, 0.25]
    """
    n = max(1, len(acceptance_lengths))
    return [sum(a > k for a in acceptance_lengths) / n for k in range(1, block_size)]
