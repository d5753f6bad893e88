# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""The draft policy's interface (:class:`DraftPolicy`, the :class:`Draft` it chooses) and the two fixed schedules:
:class:`FullBlocks` (``dflash_policy="full"``, or a constant ``num_assistant_tokens``) and :class:`HeuristicSchedule`
(transformers' ``num_assistant_tokens_schedule="heuristic"``). The cost-aware default is policy_dflash.py's.

Part of the remote-code payload: imports only torch.
"""

from typing import NamedTuple, Protocol

import torch


class Draft(NamedTuple):
    """One cycle's choice: verify `count` drafts (0: a plain target step), from the prompt lookup or the drafter, in a
    target forward of at least `rows` rows (0: the anchor and the drafts; more: padded, where the policy measured a
    wider forward cheaper); or, `scored_only`, a probe: the drafter proposes `count` drafts that are not verified (the
    target takes a plain step) and the policy scores them against the tokens committed after them
    (:meth:`DraftPolicy.observe_drafter_offer`)."""

    count: int
    from_lookup: bool = False
    scored_only: bool = False
    rows: int = 0


def most_drafts(block_size: int, num_assistant_tokens: int | None) -> int:
    """The most drafts a cycle verifies: ``num_assistant_tokens`` when set, never more than the drafter's block holds
    (``block_size - 1``: the anchor takes the block's first slot)."""
    block = block_size - 1
    return min(block, num_assistant_tokens or block)


class DraftPolicy(Protocol):
    """What the decoding loop and the tree verifier ask of a draft policy, and what they tell it.

    `most` is the most drafts a cycle verifies (a tree is built from that many block positions).
    """

    most: int

    def choose(self, batch: int, device, lookup_length: int = 0, lookup_size: int = 0, context: int = 0) -> Draft:
        """The next cycle's draft: `lookup_length` tokens of prompt-lookup continuation are on offer (0: none), found
        by an n-gram of `lookup_size` tokens; `context` tokens of text so far (the longest row)."""

    def observe_offers(self, history: torch.Tensor, offer: list[int], size: int) -> None:
        """Every cycle at batch size 1: the committed text `history`, against which earlier offers are scored, and this
        cycle's lookup offer, verified or not (found by an n-gram of `size` tokens; [] for none)."""

    def observe_drafter_offer(self, history: torch.Tensor, drafts: list[int]) -> None:
        """The drafts of a ``scored_only`` probe after the committed text `history`: not verified, scored later."""

    def observe_costs(self, batch: int, device, width: int, target_seconds: float,
                      draft_seconds: float | None = None) -> None:
        """A cycle's measured seconds: the target's verify of `width` rows, the drafter's forward (None: none ran)."""

    def observe_acceptance(self, num_drafts: int, accepted: list[int]) -> None:
        """A verification of `num_drafts` drafter drafts per row; `accepted`: the drafts each row accepted."""

    def tree_budget(self, log_probs: list[float], batch: int, device) -> Draft:
        """Drafts to verify from a best-first tree whose nodes have the drafter's path log-probabilities
        `log_probs` (node 0: the anchor): their count, and the rows to pad its verify to (0: none)."""

    def observe_tree(self, expected: float, accepted: int) -> None:
        """A tree verification: the drafter expected `expected` accepted drafts, the target accepted `accepted`."""


class FullBlocks(DraftPolicy):
    """Every cycle verifies `drafts` drafts of the drafter, and a tree all its nodes: ``dflash_policy="full"`` (the
    whole block) or a constant ``num_assistant_tokens``; it observes nothing (the protocol's observers are no-ops).

    Example:
        >>> policy = FullBlocks(15)
        >>> policy.choose(1, "cpu"), policy.tree_budget([0.0, -0.1, -0.5], 1, "cpu").count
        (Draft(count=15, from_lookup=False, scored_only=False, rows=0), 2)
    """

    def __init__(self, drafts: int):
        self.most = drafts

    def choose(self, batch: int, device, lookup_length: int = 0, lookup_size: int = 0, context: int = 0) -> Draft:
        return Draft(self.most)

    def tree_budget(self, log_probs: list[float], batch: int, device) -> Draft:
        return Draft(len(log_probs) - 1)


class HeuristicSchedule(FullBlocks):
    """transformers' ``num_assistant_tokens_schedule="heuristic"`` (or ``"heuristic_transient"``: the same, as a
    policy lives for one call): start at `start` drafts; +2 after a cycle where every row accepted every draft, -1
    otherwise, within [1, `most`].

    Example:
        >>> schedule = HeuristicSchedule(start=5, most=15)
        >>> schedule.observe_acceptance(5, [5]); schedule.choose(1, "cpu").count
        7
        >>> schedule.observe_acceptance(7, [7, 2]); schedule.choose(2, "cpu").count  # one row fell short
        6
    """

    def __init__(self, start: int, most: int):
        super().__init__(most)
        self.drafts = start

    def choose(self, batch: int, device, lookup_length: int = 0, lookup_size: int = 0, context: int = 0) -> Draft:
        return Draft(self.drafts)

    def observe_acceptance(self, num_drafts: int, accepted: list[int]) -> None:
        if num_drafts == 0:
            return
        if all(n == num_drafts for n in accepted):
            self.drafts = min(self.most, self.drafts + 2)
        else:
            self.drafts = max(1, self.drafts - 1)
