# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""The cost-aware draft policy (``dflash_policy="cost"``, the default): how many drafts to verify each cycle, from
which source (the drafter's block or a prompt lookup), or a plain target step, from measured costs and acceptance.

Costs are kept with the objects they describe (weakly keyed by the target, acceptance by the drafter), measured with
the package's one clock (timing_dflash.py). Part of the remote-code payload: imports only torch and that sibling.
"""

import collections
import copy
import functools
import itertools
import math
import operator
import statistics
import weakref

import torch

from .timing_dflash import gemm_friendly_rows


# ----------------------------------------------------------------------------------------------------------------------
# the cost-aware draft length
class CostTable:
    """Measured seconds of the target's verify forward by width, and of one drafter forward.

    Each cost comes from its last ``WINDOW`` samples: timing noise on a shared machine mostly adds time (a load spike,
    another process's burst, a page fault), so one or two bad samples cannot move the estimate, while a machine that
    really got slower (or faster) shows in every sample and moves it within ``WINDOW`` samples. The widths that
    drafting cycles measure count at their lower median (what a machine under steady load typically pays, not its
    luckiest cycle), t(1) at its least sample (see :attr:`verify`). ``age(width)``
    counts the verify observations since that width was last measured (the policy refreshes a stale t(1)). A width not
    measured lately is forgotten, estimated from its neighbours until the policy chooses it again: after 16
    observations when one sample backs it (it may have met a spike), 64 after two, ``FORGET`` after more.

    Example:
        >>> table = CostTable()
        >>> table.observe_verify(1, 0.010); table.observe_verify(16, 0.030); table.observe_verify(1, 0.050)  # a spike
        >>> table.verify[1], round(table.verify_seconds(6), 4), table.verify_seconds(32) > 0.030, table.age(1)
        (0.01, 0.0167, True, 0)
    """

    WINDOW = 5
    FORGET = 256

    def __init__(self):
        self.verify_samples: dict[int, collections.deque] = {}
        self.draft_samples: collections.deque = collections.deque(maxlen=self.WINDOW)
        self.observations = 0
        self.last_observed: dict[int, int] = {}
        self._envelope: tuple[int, list[tuple[int, float]]] = (-1, [])  # (observations, envelope) of the last ask

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

    def verify_seconds(self, width: int) -> float | None:
        """Seconds of a verify of `width` rows: on the non-decreasing lower envelope of the measured widths (linear
        between them, extended past the ends); None if none is measured.

        A wider verify never costs less (it does all the narrower one's work), so a width measured above a wider one
        met a load spike and counts at the wider one's cost. Nothing else is assumed of the curve's shape: on a CPU
        it is concave (SmolLM2-135M, one thread: t(2) ~ 1.45 t(1) as the GEMM kernel replaces the matrix-vector one,
        t(16) ~ 2.2 t(1)), so interior widths must be measured, not read off a convex fit.

        Example:
            >>> table = CostTable()
            >>> for width, seconds in [(1, 1.0), (2, 1.45), (2, 1.5), (4, 9.0), (16, 2.2), (16, 2.3)]:  # 4: a spike
            ...     table.observe_verify(width, seconds)
            >>> [round(table.verify_seconds(w), 2) for w in (2, 4, 9)]
            [1.45, 2.2, 2.2]
            >>> for _ in range(16):  # 16 observations later, the lone (spiked) sample of width 4 is forgotten
            ...     table.observe_verify(1, 1.0)
            >>> [round(table.verify_seconds(w), 2) for w in (2, 4, 9)]
            [1.45, 1.56, 1.83]
        """
        # the policy asks ~30 widths per cycle; the envelope changes only with a new observation
        if self._envelope[0] != self.observations:
            self._envelope = (self.observations, _monotone_envelope(list(self.verify.items())))
        points = self._envelope[1]
        if len(points) == 1:
            return points[0][1]
        if not points:
            return None
        # the segment whose right end is the first width above `width` (the last segment past the end)
        right = next((i for i, (x, _) in enumerate(points) if x >= width), len(points) - 1)
        (x0, y0), (x1, y1) = points[max(0, right - 1)], points[max(1, right)]
        return max(1e-9, y0 + (width - x0) * (y1 - y0) / (x1 - x0))


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
# drafter -> what the cost-aware policy learned of its acceptance (gone with the drafter)
_POLICY_MEMORY: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def cost_tables(target) -> dict:
    """{(device, dtype, batch, context bucket): CostTable} measured for `target` in this process (a new, empty dict
    the first time)."""
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


def cost_table(target, device, batch: int, context: int = 0) -> CostTable:
    """The :class:`CostTable` of `target` on `device` at batch size `batch` with about `context` tokens cached."""
    key = (str(device), str(target.dtype), batch, context_bucket(context))
    return cost_tables(target).setdefault(key, CostTable())


def policy_memory(drafter) -> dict:
    """What the cost-aware policy learned of `drafter`'s acceptance in earlier calls (a dict it keeps up to date)."""
    return _POLICY_MEMORY.setdefault(drafter, {})


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
      - while plain steps win, a drafter cycle is tried after 4 plain steps, then 8, 16, ... up to 64 (a drafter that
        improves, or a costlier target, is noticed); a probe accepted in full is followed at once by one twice as
        deep; where only the doubt of few counts keeps the drafter out (choices bet on rates ``DOUBT`` standard
        errors below their estimates), it is probed every ``PROMISING_PROBE`` steps until more counts settle it;
      - the lookup source needs no probing: every cycle's offer, taken or not, is scored against the tokens
        committed after it (:meth:`observe_lookup_offer`), so copy-heavy text is found from its first cycles and a
        lookup that stops holding is dropped, at no cost.
    Costs are robust to noise (:class:`CostTable`: the lower median of the recent samples, t(1) their least) and kept
    with the target they describe, per length of context (:func:`context_bucket`); acceptance statistics and the
    probing schedule carry over to the drafter's next calls. Output never depends on the choice.
    """

    REFRESH = 64  # drafting cycles between two measurements of each end of the cost curve (t(1), a full block)
    MEMORY = 0.99  # each verification ages the drafter's counts by this factor (about the last 100 count)
    LOOKUP_MEMORY = 0.9  # each scored offer ages the lookup's (one per cycle, free: the last ~10 count)
    CALL_PRIOR = 2.0  # the most verifications what earlier calls learned of acceptance counts as in a new call
    CALL_PROBE = 8  # a new call probes the drafter after this many plain steps at most (4 cost MT-Bench a probe per
    # 64-token call more; the follow-ups of a probe accepted in full make up for a drafter that got good)
    PROBE_DRAFTS = 2  # drafts of a backoff probe (the least a promising one verifies)
    PROMISING_PROBE = 2  # plain steps between two probes of a drafter whose estimated rates say it pays
    DOUBT = 0.5  # choices bet on acceptance rates this many standard errors below their estimates (a cycle that
    # drafts and loses costs ~1.5-2 plain steps on a CPU; one that steps plainly and should have drafted, less)

    REMEMBERED = ("reached", "accepted", "plain_streak", "probe_after", "cycles", "lookup_reached",
                  "lookup_accepted", "tree_expected", "tree_accepted")

    def __init__(self, target, most: int, memory: dict | None = None):
        self.target, self.most = target, most
        self.reached = [0.0] * most
        self.accepted = [0.0] * most
        self.lookup_reached: dict[int, list[float]] = {}  # matched n-gram size -> counts by depth
        self.lookup_accepted: dict[int, list[float]] = {}
        self.plain_streak, self.probe_after = 0, 4
        self.probe_drafts, self.follow_up = 0, 0  # drafts of the probe in flight; of the deeper one to follow it
        self.cycles = 0
        self.tree_expected, self.tree_accepted = 0.0, 0.0  # trees: drafts the drafter expected vs those accepted
        self.lookup_offers: list[tuple[int, list[int], int]] = []  # (text length, drafts, n-gram size) not scored yet
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
        _decay(self.reached, scale)
        _decay(self.accepted, scale)
        self.plain_streak, self.probe_after = 0, min(self.probe_after, self.CALL_PROBE)

    def _remember(self) -> None:
        self.memory.update(most=self.most, state={name: getattr(self, name) for name in self.REMEMBERED})

    def table(self, batch: int, device) -> CostTable:
        return cost_table(self.target, device, batch, self.context)

    def acceptance_rates(self, doubt: float = 0.0) -> list[float]:
        return _rates(self.accepted, self.reached, doubt=doubt)

    def lookup_rates(self, size: int, length: int, doubt: float = 0.0) -> list[float]:
        """Acceptance rates by depth of lookup continuations found by an n-gram of `size`, for `length` depths, from
        a sceptical 1/4 prior (most text does not repeat; a drafter that has been right must not lose its cycles to
        a lookup). Depths never reached yet take the deepest measured one's rate, as :func:`_rates` does (a copied
        passage that held for 4 tokens tends to hold on; a 1/4 there kept lookups short for good)."""
        reached = self.lookup_reached.get(size, [])
        rates = _rates(self.lookup_accepted.get(size, []), reached, prior=0.25, doubt=doubt)[:length] or [0.25]
        return rates + rates[-1:] * (length - len(rates))

    def observe_lookup_offer(self, history: torch.Tensor, offer: list[int], size: int) -> None:
        """Rate the prompt-lookup source from every cycle's offer, verified or not: `offer` (drafts after the last
        token of `history` [L], the committed text; found by an n-gram of `size` tokens; [] for none) is scored
        depth by depth as the tokens committed after it show whether the target takes each draft (the first that
        differs ends it). Greedy: exactly what verifying the offer would accept. Sampling: committed tokens follow the
        target's law, so a draft is repeated with the probability that speculative sampling accepts it (a point-mass
        draft is accepted with p(draft)). So lookups need no trials: a text that copies itself shows within a few
        cycles (plain steps included), and a lookup that stops holding is dropped, whatever the policy chose.

        Example:
            >>> policy = CostAwarePolicy(None, most=7)
            >>> policy.observe_lookup_offer(torch.tensor([5, 6, 7, 5, 6]), [7, 5, 6], size=2)
            >>> policy.observe_lookup_offer(torch.tensor([5, 6, 7, 5, 6, 7, 9]), [], size=0)  # 7 taken, then 9
            >>> policy.lookup_accepted[2], policy.lookup_reached[2]
            ([1.0, 0.0, 0.0], [1.0, 1.0, 0.0])
        """
        pending = []
        for start, drafts, drafts_size, scored in self.lookup_offers:
            reached, hits = self.lookup_reached[drafts_size], self.lookup_accepted[drafts_size]
            committed = history[start + scored : start + len(drafts)].tolist()
            if scored == 0 and committed:  # a new verification-equivalent: older ones weigh less
                _decay(reached, self.LOOKUP_MEMORY)
                _decay(hits, self.LOOKUP_MEMORY)
            held = True
            for depth, token in enumerate(committed, scored):
                held = token == drafts[depth]
                reached[depth] += 1.0
                hits[depth] += float(held)
                scored += 1
                if not held:
                    break
            if held and scored < len(drafts):
                pending.append((start, drafts, drafts_size, scored))
        if offer:
            for counts in (self.lookup_reached, self.lookup_accepted):
                depths = counts.setdefault(size, [])
                depths.extend([0.0] * (len(offer) - len(depths)))
            pending.append((len(history), list(offer), size, 0))
        self.lookup_offers = pending
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
        _decay(self.reached, self.MEMORY)
        _decay(self.accepted, self.MEMORY)
        for n in accepted:
            for depth in range(min(n + 1, num_drafts)):
                self.reached[depth] += 1.0
                self.accepted[depth] += float(depth < n)
        self._remember()

    def choose(self, batch: int, device, lookup_length: int = 0, lookup_size: int = 0,
               context: int = 0) -> tuple[int, bool]:
        """(draft count k, whether the drafts come from the prompt lookup) for the next cycle; `lookup_length`
        tokens of lookup continuation are on offer (0: none), found by an n-gram of `lookup_size` tokens; `context`
        tokens of text so far (the cycle's costs, and those it observes, are those of that length:
        :func:`context_bucket`)."""
        self.context = context
        table = self.table(batch, device)
        width = functools.partial(gemm_friendly_rows, device=torch.device(device), batch=batch)
        self.cycles += 1
        self._remember()
        # a call starts with a full block: its costs (once: widths forgotten since are re-measured only when chosen,
        # else every short call would pay for one) and this drafter's acceptance
        if self.cycles == 1 or table.draft is None or max(table.verify_samples, default=0) < width(self.most + 1):
            return self.most, False
        if table.age(1) is None:
            return 0, False  # measure a plain step once: one token at plain speed
        # k is chosen on the estimated rates; whether it beats a plain step, on rates lowered by their doubt
        seconds = {False: lambda k: table.draft + table.verify_seconds(width(k + 1)),  # the drafter's chain
                   True: lambda k: table.verify_seconds(width(k + 1))}  # a lookup's: no drafter forward
        drafts, hopeful = best_draft_count(self.acceptance_rates(), seconds[False])
        choice, speed = (drafts, False), chain_speed(self.acceptance_rates(self.DOUBT), drafts, seconds[False])
        if lookup_length:
            k, _ = best_draft_count(self.lookup_rates(lookup_size, lookup_length), seconds[True])
            lookup_speed = chain_speed(self.lookup_rates(lookup_size, lookup_length, self.DOUBT), k, seconds[True])
            if lookup_speed > speed:
                choice, speed = (k, True), lookup_speed
        plain = 1.0 / table.verify_seconds(1)
        if speed > plain:
            if not choice[1]:  # the drafter pays: its probing starts over (a lookup that wins says nothing of it)
                self.plain_streak, self.probe_after = 0, 4
            if table.stale(1, self.REFRESH):
                return 0, False
            if table.stale(width(self.most + 1), self.REFRESH) and not choice[1]:
                return self.most, False  # and a full block now and then: the far end of the cost curve, deep drafts
            return choice
        if self.follow_up:  # the last probe's drafts were all accepted: probe again at once, twice as deep
            drafts, self.follow_up = self.follow_up, 0
            return self._probe(drafts)
        # A plain step, probing the drafter now and then (lookups need none: their offers are scored anyway). Where
        # its estimated rates say it pays and only their doubt says not, every PROMISING_PROBE steps (more counts
        # settle it, at no expected loss), with the count they favour; else after a growing backoff, with the fewest
        # drafts that tell (a 7-draft probe of a drafter that fails costs ~2.3 plain steps here, a 2-draft one ~1.9).
        promising = hopeful > plain
        self.plain_streak += 1
        if self.plain_streak < (self.PROMISING_PROBE if promising else self.probe_after):
            return 0, False
        self.plain_streak = 0
        if promising:
            return self._probe(max(drafts, self.PROBE_DRAFTS))
        self.probe_after = min(64, 2 * self.probe_after)
        return self._probe(self.PROBE_DRAFTS)

    def _probe(self, drafts: int) -> tuple[int, bool]:
        self.probe_drafts = drafts
        return drafts, False

    def observe_costs(self, batch: int, device, width: int, target_seconds: float,
                      draft_seconds: float | None = None) -> None:
        """A cycle's measured costs: the target's seconds for a verify of `width` rows (with any re-advance) and the
        drafter's (None: it did not run)."""
        table = self.table(batch, device)
        table.observe_verify(width, target_seconds)
        if draft_seconds is not None:
            table.observe_draft(draft_seconds)

    def tree_budget(self, log_probs: list[float], batch: int, device) -> int:
        """Drafts to verify from a best-first tree whose nodes have the drafter's joint path log-probabilities
        `log_probs` (node 0: the anchor): the b maximising (1 + c * sum of the first b path probabilities) /
        t(verify of b + 1 rows), c the measured ratio of accepted to expected drafts (the drafter's calibration).
        The drafter has run already, so its cost does not count here; the whole tree until verify costs are known."""
        table = self.table(batch, device)
        nodes = len(log_probs) - 1
        if len(table.verify) < 2:
            return nodes
        width = functools.partial(gemm_friendly_rows, device=torch.device(device), batch=batch)
        scale = (self.tree_accepted + 1.0) / (self.tree_expected + 1.0)
        best, best_speed, mass = nodes, 0.0, 0.0
        for b in range(1, nodes + 1):
            mass += math.exp(log_probs[b])
            speed = (1.0 + scale * mass) / table.verify_seconds(width(b + 1))
            if speed > best_speed:
                best, best_speed = b, speed
        return best

    def observe_tree(self, expected: float, accepted: int) -> None:
        """One tree verification: the drafter expected `expected` accepted drafts (its path probabilities summed), the
        target accepted `accepted`. Also counted as a chain of that acceptance (the draft-or-not choice)."""
        self.tree_expected = 0.97 * self.tree_expected + expected
        self.tree_accepted = 0.97 * self.tree_accepted + accepted
        self.observe_acceptance(self.most, [accepted])


def _decay(counts: list[float], factor: float) -> None:
    """Age observation counts in place: old cycles weigh less, so estimates follow a drifting text."""
    counts[:] = [factor * c for c in counts]


def _rates(accepted: list[float], reached: list[float], prior: float = 0.5, doubt: float = 0.0) -> list[float]:
    """Acceptance rate by depth: each depth's counts shrunk towards the rate of the depth before it (the first
    towards `prior`), so a depth rarely reached lately (cycles verified fewer drafts) keeps the rate its neighbours
    show instead of falling back to an arbitrary prior that would stop longer chains from ever being tried. With
    `doubt` z, each rate is lowered by z standard errors of its estimate (sqrt(p (1 - p) / (n + 3)), n its count,
    the prior's 2 included): what to bet on when a wrong bet costs more than a missed one.

    Example:
        >>> [round(r, 2) for r in _rates([90.0, 0.0], [100.0, 0.0])]
        [0.89, 0.89]
        >>> [round(r, 2) for r in _rates([9.0, 0.0], [10.0, 0.0], doubt=1.0)]  # 10 counts: lowered by 0.11
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
