# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""Draft policies: how many drafts each cycle verifies, and from which source (the drafter's block, a prompt lookup,
or none: a plain target step).

The decoding loop owns one :class:`DraftPolicy` per ``generate()`` call: it asks :meth:`~DraftPolicy.choose` before
each cycle and hands it what the cycle measured (costs, acceptance, the lookup on offer); the tree verifier asks it
for a tree's size (the interface and the two fixed schedules are schedules_dflash.py's). :func:`draft_policy` builds
it by name (:data:`POLICIES`: a new policy is its class and one line):
  - :class:`FullBlocks` (``dflash_policy="full"``, or a constant ``num_assistant_tokens``): the same count each cycle;
  - :class:`HeuristicSchedule` (``num_assistant_tokens_schedule="heuristic"``): transformers' +2/-1 rule;
  - :class:`CostAwarePolicy` (the default): the count and source that maximise expected tokens per second, from
    measured costs and acceptance.
Output never depends on the policy: every choice is lossless.

Costs are kept with the objects they describe (weakly keyed by the target, acceptance by the drafter), measured with
the package's one clock (timing_dflash.py); the arithmetic of expected speed is speed_dflash.py's. Part of the
remote-code payload: imports only torch and those siblings.
"""
import copy
import functools
import math
import weakref
from collections.abc import Sequence
from typing import NamedTuple

import torch

from .costs_dflash import CostTable, cost_table
from .options_dflash import DFlashCallOptions, drafts_that_fit
from .schedules_dflash import Draft, DraftPolicy, FullBlocks, HeuristicSchedule, most_drafts
from .speed_dflash import best_draft_count, chain_speed, decay, rates_by_depth
from .timing_dflash import gemm_friendly_rows, verify_rows


# ----------------------------------------------------------------------------------------------------------------------
# the cost-aware draft length
# drafter -> what the cost-aware policy learned of its acceptance (gone with the drafter)
_POLICY_MEMORY: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def policy_memory(drafter) -> dict:
    """What the cost-aware policy learned of `drafter`'s acceptance in earlier calls (a dict it keeps up to date).

    Shared by every call with `drafter`, whichever thread runs it: each call starts from it and updates it as it goes,
    without a lock (tokens never depend on it, only the draft counts chosen)."""
    return _POLICY_MEMORY.setdefault(drafter, {})


class _Weighed(NamedTuple):
    """The cost-aware policy's weighing of one cycle: the best `draft` of either source and its expected tokens per
    second on doubted rates (`speed`), and a plain step's (`plain_speed`)."""

    draft: Draft
    speed: float
    plain_speed: float


class CostAwarePolicy:
    """Chooses each cycle's draft source and count k (0 = a plain target step) to maximise expected committed tokens
    per second.

    Two sources compete: the drafter's chain (seconds(k) = t(draft) + t(verify of k + 1 rows)) and, at batch size 1,
    the prompt-lookup continuation of the text so far (transformers' prompt lookup: no drafter forward, so
    seconds(k) = t(verify of k + 1 rows)); a plain step costs t(verify of 1 row). expected tokens(k) = 1 +
    sum_{j<=k} prod_{i<=j} a_i, with a_i the acceptance rate at depth i given every earlier draft was accepted,
    counted per source as generation goes (the lookup's per matched n-gram size), decaying, from a 1/2 prior.

    Probing keeps every estimate honest, in both directions:
      - the first cycle with a drafter verifies a full block (the drafter's cost, a wide verify, the acceptance at
        every depth), the second takes a plain step (t(1) cannot be read off wider verifies);
      - while drafting wins, a plain step every ``REFRESH`` cycles re-measures t(1) (a machine that got faster would
        otherwise keep a drafter that no longer pays), and a full block every ``REFRESH`` cycles the far end of the
        cost curve and the deep acceptance (one slow first sample must not keep long chains out for good);
      - while plain steps win, the drafter is probed after 4 plain steps, then 8, 16, ... up to 64 (a drafter that
        improves, or a costlier target, is noticed); where only the doubt of few counts keeps the drafter out
        (choices bet on rates ``DOUBT`` standard errors below their estimates), every ``PROMISING_PROBE`` steps until
        more counts settle it (a bet expected to pay: verified). Greedy at batch size 1 a backoff probe is scored,
        not verified: the drafter proposes a whole block, the target takes its plain step, and the drafts are scored
        depth by depth against the tokens committed after them (exactly what verifying them would have accepted), so
        it costs one drafter forward (a verified 2-draft probe cost ~2.3 plain steps on a CPU: SmolLM2-135M on
        MT-Bench, where probes were all the drafter got, ran at 0.93x of plain). Sampling, or in a batch, a backoff
        probe verifies few drafts (``PROBE_DRAFTS``); a verified probe accepted in full is followed at once by one
        twice as deep;
      - the lookup source needs no probing: every cycle's offer, taken or not, is scored against the tokens
        committed after it (:meth:`observe_offers`), so copy-heavy text is found from its first cycles and a
        lookup that stops holding is dropped, at no cost.
    Costs are robust to noise (:class:`CostTable`: the lower median of the recent samples, t(1) their least) and kept
    with the target they describe, per length of context (:func:`~costs_dflash.context_bucket`); acceptance
    statistics and the probing schedule carry over to the drafter's next calls. Output never depends on the choice.
    """

    # A cycle off the chosen width (a plain step to re-measure t(1), a full block for the far end of the cost curve)
    # costs up to one cycle's gain: one in 64 keeps that near 2% while a machine whose speed changed is still
    # noticed within a long call.
    REFRESH = 64
    # Each drafter verification ages its counts by this factor, so about the last 100 count: enough to pin a rate to
    # ~0.05, few enough to follow a text whose difficulty changes.
    MEMORY = 0.99
    # Lookup offers are scored every cycle at no cost, so the last ~10 suffice, and a copied passage that ends stops
    # being verified within a few cycles.
    LOOKUP_MEMORY = 0.9
    # Acceptance depends on the text as much as on the drafter: what earlier calls learned counts as at most this
    # many verifications in a new call, which its own first cycles then outvote.
    CALL_PRIOR = 2.0
    # A new call probes the drafter within this many plain steps: a backoff grown on an earlier text must not keep a
    # short call on a new one from drafting (a probe accepted in full is followed by a deeper one at once).
    CALL_PROBE = 8
    # The fewest drafts that measure acceptance past the first depth; a failing 2-draft probe costs ~1.9 plain steps
    # on a CPU, a 7-draft one ~2.3. A promising probe verifies at least this many.
    PROBE_DRAFTS = 2
    # Plain steps between two probes of a drafter whose estimated rates say it pays but whose doubt says not: more
    # counts settle the question at no expected loss.
    PROMISING_PROBE = 2
    # Choices bet on acceptance rates this many standard errors below their estimates: a cycle that drafts and loses
    # costs ~1.5-2 plain steps on a CPU, one that steps plainly and should have drafted, less.
    DOUBT = 0.5

    REMEMBERED = ("reached", "accepted", "plain_streak", "probe_after", "cycles", "lookup_reached",
                  "lookup_accepted", "tree_expected", "tree_accepted")

    def __init__(self, target, most: int, memory: dict | None = None, captured: tuple[int, ...] = (),
                 scored_probes: bool = True, max_length: int | None = None):
        self.target, self.most = target, most
        self.max_length = max_length  # the call's limit on the text's length (None: none): probes it cannot use
        self.scored_probes = scored_probes  # greedy calls: probes are scored against the text, not verified
        self.captured = captured  # the widths the call's verify forward is captured at (none: eager)
        self.reached = [0.0] * most
        self.accepted = [0.0] * most
        self.lookup_reached: dict[int, list[float]] = {}  # matched n-gram size -> counts by depth
        self.lookup_accepted: dict[int, list[float]] = {}
        self.plain_streak, self.probe_after = 0, 4
        self.probe_drafts, self.follow_up = 0, 0  # drafts of the probe in flight; of the deeper one to follow it
        self.cycles = 0
        self.tree_expected, self.tree_accepted = 0.0, 0.0  # trees: drafts the drafter expected vs those accepted
        # offers not scored to their end yet: (text length, drafts, n-gram size or None for the drafter's, scored)
        self.offers: list[tuple[int, Sequence[int], int | None, int]] = []
        self.context = 0  # tokens of text this cycle's forwards attend to (the costs of its length are used)
        # what earlier calls with this drafter learned (acceptance by depth, probing): a new call goes on from it
        self.memory = memory if memory is not None else {}
        if self.memory.get("most") == most:
            self.__dict__.update(copy.deepcopy(self.memory["state"]))
            self._start_call()

    def _start_call(self) -> None:
        # What earlier calls learned of the drafter's acceptance is a prior for this one, worth at most CALL_PRIOR
        # verifications: acceptance is a property of the text as much as of the drafter (the SmolLM2 drafter's
        # tau is ~1.5 on GSM8K, ~1.15 on MT-Bench), and ~100 remembered cycles took most of a short call to outvote.
        # Plain steps probe again after CALL_PROBE (a backoff grown to 64 on one text kept a short call on the next
        # from ever drafting). Lookup counts stay: they age with every offer scored (LOOKUP_MEMORY), so a new text
        # re-rates them within ~10 cycles anyway, and shrinking them delayed lookups on AIME, where they pay.
        scale = min(1.0, self.CALL_PRIOR / max(self.reached[0], 1e-9))
        decay(self.reached, scale)
        decay(self.accepted, scale)
        self.plain_streak, self.probe_after = 0, min(self.probe_after, self.CALL_PROBE)

    def _remember(self) -> None:
        self.memory.update(most=self.most, state={name: getattr(self, name) for name in self.REMEMBERED})

    def table(self, batch: int, device) -> CostTable:
        return cost_table(self.target, device, batch, self.context, captured=bool(self.captured))

    def acceptance_rates(self, doubt: float = 0.0) -> list[float]:
        return rates_by_depth(self.accepted, self.reached, doubt=doubt)

    def lookup_rates(self, size: int, length: int, doubt: float = 0.0) -> list[float]:
        """Acceptance rates by depth of lookup continuations found by an n-gram of `size`, for `length` depths, from
        a sceptical 1/4 prior (most text does not repeat; a drafter that has been right must not lose its cycles to
        a lookup). Depths never reached yet take the deepest measured one's rate, as
        :func:`~speed_dflash.rates_by_depth` does (a copied passage that held for 4 tokens tends to hold on; a 1/4
        there kept lookups short for good)."""
        reached = self.lookup_reached.get(size, [])
        rates = rates_by_depth(self.lookup_accepted.get(size, []), reached, prior=0.25, doubt=doubt)[:length] or [0.25]
        return rates + rates[-1:] * (length - len(rates))

    def observe_offers(self, history: torch.Tensor, offer: list[int], size: int) -> None:
        """Rate the prompt-lookup source from every cycle's offer, verified or not, and the drafter from its scored
        probes: `history` [L] is the committed text, `offer` this cycle's lookup drafts after its last token (found by
        an n-gram of `size` tokens; [] for none). Each offer is scored depth by depth as the tokens committed after it
        show whether the target takes each draft (the first that differs ends it). Greedy: exactly what verifying
        the offer would accept. Sampling: committed tokens follow the target's law, so a draft is repeated with the
        probability that speculative sampling accepts it (a point-mass draft is accepted with p(draft)). So lookups
        need no trials: a text that copies itself shows within a few cycles (plain steps included), and a lookup that
        stops holding is dropped, whatever the policy chose.

        Example:
            >>> policy = CostAwarePolicy(None, most=7)
            >>> policy.observe_offers(torch.tensor([5, 6, 7, 5, 6]), [7, 5, 6], size=2)
            >>> policy.observe_offers(torch.tensor([5, 6, 7, 5, 6, 7, 9]), [], size=0)  # 7 taken, then 9
            >>> policy.lookup_accepted[2], policy.lookup_reached[2]
            ([1.0, 0.0, 0.0], [1.0, 1.0, 0.0])
        """
        if offer:
            for counts in (self.lookup_reached, self.lookup_accepted):
                depths = counts.setdefault(size, [])
                depths.extend([0.0] * (len(offer) - len(depths)))
        self._score_offers(history, (len(history), list(offer), size, 0) if offer else None)

    def observe_drafter_offer(self, history: torch.Tensor, drafts: Sequence[int]) -> None:
        """The drafts of a scored probe (:class:`Draft` ``scored_only``), proposed after the committed text `history`
        and not verified: :meth:`observe_offers` scores them as the next cycles commit tokens, into the drafter's
        acceptance counts (one verification's worth, as if they had been verified).

        Example:
            >>> policy = CostAwarePolicy(None, most=3)
            >>> policy.observe_drafter_offer(torch.tensor([5, 6]), [7, 8, 9])
            >>> policy.observe_offers(torch.tensor([5, 6, 7]), [], size=0)  # a plain step commits 7
            >>> policy.observe_offers(torch.tensor([5, 6, 7, 8, 4]), [], size=0)  # then 8, and 4 for 9
            >>> policy.accepted, policy.reached
            ([1.0, 1.0, 0.0], [1.0, 1.0, 1.0])
        """
        drafts = drafts if len(drafts) <= self.most else list(drafts[: self.most])  # (read lazily: GreedyDrafts)
        self._score_offers(history, (len(history), drafts, None, 0))

    def _score_offers(self, history: torch.Tensor, new: tuple | None) -> None:
        pending = []
        for start, drafts, size, scored in self.offers:
            reached, hits, memory = ((self.reached, self.accepted, self.MEMORY) if size is None else
                                     (self.lookup_reached[size], self.lookup_accepted[size], self.LOOKUP_MEMORY))
            committed = history[start + scored : start + len(drafts)].tolist()
            if scored == 0 and committed:  # a new verification-equivalent: older ones weigh less
                decay(reached, memory)
                decay(hits, memory)
            held = True
            for depth, token in enumerate(committed, scored):
                held = token == drafts[depth]
                reached[depth] += 1.0
                hits[depth] += float(held)
                scored += 1
                if not held:
                    break
            if held and scored < len(drafts):
                pending.append((start, drafts, size, scored))
        self.offers = pending + ([new] if new is not None else [])
        self._remember()

    def observe_acceptance(self, num_drafts: int, accepted: list[int]) -> None:
        """Count one verification of `num_drafts` drafter drafts per row (`accepted`: accepted drafts per row). A
        plain step (no drafts) counts nothing and ages nothing: what was learned of the drafter fades only as it is
        observed again, so a weak drafter's record does not drift back to the prior during plain steps and the
        probing backoff holds."""
        if num_drafts == 0:
            return
        # a probe accepted in full asks for a deeper one next (a drafter that got good shows in a few cycles)
        held = self.probe_drafts == num_drafts and all(n == num_drafts for n in accepted)
        self.follow_up, self.probe_drafts = (min(self.most, 2 * num_drafts) if held else 0), 0
        decay(self.reached, self.MEMORY)
        decay(self.accepted, self.MEMORY)
        for n in accepted:
            for depth in range(min(n + 1, num_drafts)):
                self.reached[depth] += 1.0
                self.accepted[depth] += float(depth < n)
        self._remember()

    def choose(self, batch: int, device, lookup_length: int = 0, lookup_size: int = 0, context: int = 0) -> Draft:
        """The next cycle's :class:`Draft`; `lookup_length` tokens of lookup continuation are on offer (0: none),
        found by an n-gram of `lookup_size` tokens; `context` tokens of text so far (the cycle's costs, and those it
        observes, are those of that length: :func:`~costs_dflash.context_bucket`). Its steps: measure what is not
        measured yet; weigh the best chain of each source against a plain step; draft, refreshing a stale end of the
        cost curve now and then, or step plainly, probing the drafter now and then."""
        self.context = context
        self.cycles += 1
        self._remember()
        table = self.table(batch, device)
        width = functools.partial(verify_rows, device=torch.device(device), batch=batch, captured=self.captured)
        unmeasured = self._measure_first(table, width)
        if unmeasured is not None:
            return unmeasured
        best = self._best_chain(table, width, lookup_length, lookup_size)
        if best.speed > best.plain_speed:
            return self._padded(self._draft(best.draft, table, width), table, width)
        return self._padded(self._plain_step_or_probe(best.plain_speed, table, width, batch), table, width)

    def _measure_first(self, table: CostTable, width) -> Draft | None:
        """A call starts with a full block: the drafter's cost, a wide verify and the acceptance at every depth (once:
        widths forgotten since are re-measured only when chosen, else every short call would pay for one); then one
        plain step, whose cost cannot be read off wider verifies. None once both are measured. Near the call's end
        the block is cut to the drafts that fit (:meth:`_fitting`), and so is the width it must measure: a text that
        entered a new length of context 10 tokens before its end verified a cut block every cycle to the end, each
        failing to measure the full width (SmolLM2-135M, 2K-token documents: 0.93x of plain)."""
        widest = width(self._fitting() + 1)
        if self.cycles == 1 or table.draft is None or max(table.verify_samples, default=0) < widest:
            return Draft(self.most)
        if table.age(1) is None:
            return Draft(0)
        return None

    def _best_chain(self, table: CostTable, width, lookup_length: int, lookup_size: int) -> "_Weighed":
        """The best draft of either source against a plain step: the count is chosen on the estimated rates, whether
        it beats a plain step on rates lowered by their doubt (:attr:`DOUBT`)."""
        verify, draft_seconds = verify_costs(table, width, max(self.most, lookup_length)), table.draft
        seconds = {False: lambda k: draft_seconds + verify[k],  # the drafter's chain
                   True: verify.__getitem__}  # a lookup's: no drafter forward
        drafts, _ = best_draft_count(self.acceptance_rates(), seconds[False])
        draft, speed = Draft(drafts), chain_speed(self.acceptance_rates(self.DOUBT), drafts, seconds[False])
        if lookup_length:
            k, _ = best_draft_count(self.lookup_rates(lookup_size, lookup_length), seconds[True])
            lookup_speed = chain_speed(self.lookup_rates(lookup_size, lookup_length, self.DOUBT), k, seconds[True])
            if lookup_speed > speed:
                draft, speed = Draft(k, from_lookup=True), lookup_speed
        return _Weighed(draft, speed, 1.0 / table.verify_seconds(1))

    def _hopeful(self, table: CostTable, width) -> tuple[int, float]:
        """The drafter's best count and its expected tokens per second on its estimated rates (no doubt) and the chord
        between measured widths (:meth:`CostTable.verify_seconds` ``optimistic``): a width not measured lately may
        cost less than the concave estimate says, and a probe measures it (a full block that met a load spike priced
        every width near it out of the choice for good)."""
        verify, draft_seconds = verify_costs(table, width, self.most, optimistic=True), table.draft
        return best_draft_count(self.acceptance_rates(), lambda k: draft_seconds + verify[k])

    def _draft(self, draft: Draft, table: CostTable, width) -> Draft:
        """Drafting pays: the drafter's probing starts over when it is the drafter that pays (a lookup that wins says
        nothing of it); a stale t(1) is re-measured by a plain step, a stale far end of the curve by a full block."""
        if not draft.from_lookup:
            self.plain_streak, self.probe_after = 0, 4
        if table.stale(1, self.REFRESH):
            return Draft(0)
        if table.stale(width(self._fitting() + 1), self.REFRESH) and not draft.from_lookup:
            return Draft(self.most)
        return draft

    def _fitting(self) -> int:
        """The most drafts this cycle's verify can hold: the block, fewer within a block of the call's `max_length`
        (the drafter's proposal is cut to what fits: :func:`drafts_that_fit`)."""
        room = drafts_that_fit(self.max_length, self.context)
        return self.most if room is None else max(0, min(self.most, room))

    def _padded(self, draft: Draft, table: CostTable, width, nodes: int = 0) -> Draft:
        """`draft`, its verify padded to the cheapest wider width measured (:meth:`CostTable.cheaper_wider`) up to
        the widest verify (a block, or a tree of `nodes`): the costs it was chosen on already count it at that width's
        cost. A drafter chain's count is chosen on those costs, so it takes the wider width's drafts itself; what pads
        is a prompt lookup's short continuation, a probe's few drafts, or a tree's budget."""
        if not draft.count or draft.scored_only:
            return draft
        own = width(draft.count + 1)
        rows = table.cheaper_wider(own, most=width(max(nodes, self.most) + 1))
        return draft if rows == own else draft._replace(rows=rows)

    def _plain_step_or_probe(self, plain_speed: float, table: CostTable, width, batch: int) -> Draft:
        """A plain step, probing the drafter now and then (lookups need none: their offers are scored anyway). A probe
        accepted in full is followed at once by one twice as deep. Where the estimated rates say the drafter pays and
        only their doubt (or a width's concave estimate: :meth:`_hopeful`) says not, a probe every
        :attr:`PROMISING_PROBE` steps with the count they favour; else after a backoff doubling from 4 to 64 plain
        steps, with the fewest drafts that tell (:attr:`PROBE_DRAFTS`), unless the call has fewer tokens left than
        the steps waited; where the policy can score a backoff probe (greedy, batch size 1), it proposes the whole
        block and verifies none of it (a promising probe is a bet expected to pay, so it is verified)."""
        if self.follow_up:
            drafts, self.follow_up = self.follow_up, 0
            return self._probe(drafts)
        hopeful_drafts, hopeful_speed = self._hopeful(table, width)
        promising = hopeful_speed > plain_speed
        self.plain_streak += 1
        if self.plain_streak < (self.PROMISING_PROBE if promising else self.probe_after):
            return Draft(0)
        if promising:
            self.plain_streak = 0
            return self._probe(max(hopeful_drafts, self.PROBE_DRAFTS))
        if self.max_length is not None and self.max_length - self.context < self.probe_after:
            return Draft(0)  # the call ends before as many tokens as this probe waited for: its answer would idle
        self.plain_streak = 0
        self.probe_after = min(64, 2 * self.probe_after)
        if self.scored_probes and batch == 1:  # the whole block for one drafter forward: no verify row added
            return Draft(self.most, scored_only=True)
        return self._probe(self.PROBE_DRAFTS)

    def _probe(self, drafts: int) -> Draft:
        self.probe_drafts = drafts
        return Draft(drafts)

    def observe_costs(self, batch: int, device, width: int, target_seconds: float,
                      draft_seconds: float | None = None) -> None:
        """A cycle's measured costs: the target's seconds for a verify of `width` rows (with any re-advance) and the
        drafter's (None: it did not run)."""
        table = self.table(batch, device)
        table.observe_verify(width, target_seconds)
        if draft_seconds is not None:
            table.observe_draft(draft_seconds)

    def tree_budget(self, log_probs: list[float], batch: int, device) -> Draft:
        """Drafts to verify from a best-first tree whose nodes have the drafter's joint path log-probabilities
        `log_probs` (node 0: the anchor): the b maximising (1 + c * sum of the first b path probabilities) /
        t(verify of b + 1 rows), c the measured ratio of accepted to expected drafts (the drafter's calibration),
        its verify padded as a chain's is (:meth:`CostTable.cheaper_wider`: t counted it at the wider width's cost).
        The drafter has run already, so its cost does not count here; the whole tree until verify costs are known."""
        table = self.table(batch, device)
        nodes = len(log_probs) - 1
        if len(table.verify) < 2:
            return Draft(nodes)
        width = functools.partial(gemm_friendly_rows, device=torch.device(device), batch=batch)
        scale = (self.tree_accepted + 1.0) / (self.tree_expected + 1.0)
        best, best_speed, mass = nodes, 0.0, 0.0
        for b in range(1, nodes + 1):
            mass += math.exp(log_probs[b])
            speed = (1.0 + scale * mass) / table.verify_seconds(width(b + 1))
            if speed > best_speed:
                best, best_speed = b, speed
        return self._padded(Draft(best), table, width, nodes)

    def observe_tree(self, expected: float, accepted: int) -> None:
        """One tree verification: the drafter expected `expected` accepted drafts (its path probabilities summed), the
        target accepted `accepted`. Also counted as a chain of that acceptance (the draft-or-not choice)."""
        self.tree_expected = 0.97 * self.tree_expected + expected
        self.tree_accepted = 0.97 * self.tree_accepted + accepted
        self.observe_acceptance(self.most, [accepted])


def verify_costs(table: CostTable, width, most: int, optimistic: bool = False) -> list[float]:
    """[seconds of the verify of k drafts (``width(k + 1)`` rows) for k = 0..`most`]: what a cycle's choice weighs,
    asked once per width (the chains of both sources read each one several times)."""
    return [table.verify_seconds(width(k + 1), optimistic) for k in range(most + 1)]


# ----------------------------------------------------------------------------------------------------------------------
# the call's policy, by name: options.policy -> the policy of a call (its options, target, drafter, most drafts)
POLICIES = {
    "cost": lambda options, target, drafter, most, captured: CostAwarePolicy(
        target, most, policy_memory(drafter), captured, scored_probes=not options.do_sample,
        max_length=options.max_length),
    "full": lambda options, target, drafter, most, captured: FullBlocks(most),
    "heuristic": lambda options, target, drafter, most, captured: HeuristicSchedule(most,
                                                                                    drafter.config.block_size - 1),
}


def draft_policy(options: DFlashCallOptions, target, drafter, captured: tuple[int, ...] = ()) -> DraftPolicy:
    """The call's draft policy, ``POLICIES[options.policy]``, verifying at most ``num_assistant_tokens`` drafts a
    cycle (default: the whole block of ``block_size - 1``; the heuristic schedule starts there, within the block);
    `captured`: the widths the call's verify forward is captured at (the cost-aware policy weighs their costs).

    Example:
        >>> from types import SimpleNamespace
        >>> drafter = SimpleNamespace(config=SimpleNamespace(block_size=16))
        >>> draft_policy(DFlashCallOptions(policy="heuristic", num_assistant_tokens=4), None, drafter).choose(1, "cpu")
        Draft(count=4, from_lookup=False, scored_only=False, rows=0)
    """
    most = most_drafts(drafter.config.block_size, options.num_assistant_tokens)
    return POLICIES[options.policy](options, target, drafter, most, captured)
