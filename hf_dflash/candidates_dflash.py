# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""The DFlash candidate generator: proposes a cycle's drafts (transformers' ``CandidateGenerator`` API) from the source
and count the draft policy chose: one drafter forward (a DFlash2 drafter's selector walk included), or a prompt-lookup
continuation. It proposes only: the decoding loop asks the policy, and hands it what each cycle measured.

Part of the remote-code payload: imports only torch, transformers and sibling modules.
"""

import dataclasses
import weakref
from collections.abc import Sequence

import torch
from transformers.cache_utils import DynamicCache
from transformers.generation import logits_process as lp
from transformers.generation.candidate_generator import CandidateGenerator

from .cache_dflash import cache_argument
from .checkpoint_dflash import plain_head_rows
from .lookup_dflash import prompt_lookup_match
from .options_dflash import DFlashCallOptions, call_options
from .policy_dflash import Draft, draft_policy
from .timing_dflash import gemm_friendly_rows
from .sampling_dflash import choose_drafts, select_tokens


class DFlashCandidateGenerator(CandidateGenerator):
    """Proposes candidate tokens per sequence: a block of drafts from one drafter forward, or a prompt-lookup
    continuation of the text so far.

    Holds the drafter's cache of context K/V (`cache`: the context of every token the target has verified, in
    the same slots as the target's own cache, so one padding mask serves both; the loop drops retired rows from it).
    The drafter always fills its whole block in one forward; verifying fewer drafts (the count the policy chose) makes
    the target's verify forward and the drafter's LM head cheaper. Every count is lossless: only the speed changes.

    It reads the call's `options` (:class:`~options_dflash.DFlashCallOptions`), which the decoding loop passes;
    transformers' candidate-generator API passes a `generation_config` instead, which is read once to build them.

    Example:
        >>> generator = DFlashCandidateGenerator(drafter, target, GenerationConfig())  # doctest: +SKIP
        >>> hidden = target(input_ids[:, :-1], output_hidden_states=True).hidden_states  # doctest: +SKIP
        >>> features = drafter.fused_features(hidden)  # doctest: +SKIP
        >>> candidates, scores = generator.get_candidates(input_ids, context_hidden_states=features,
        ...                                               draft=Draft(4))  # doctest: +SKIP
    """

    def __init__(self, drafter, target, generation_config=None, logits_processor=None,
                 options: DFlashCallOptions | None = None):
        if options is None and generation_config is None:
            raise ValueError("DFlashCandidateGenerator(options=None, generation_config=None): pass the call's "
                             "options (a DFlashCallOptions) or, as transformers' candidate-generator API does, a "
                             "GenerationConfig.")
        self.options = options if options is not None else call_options(generation_config)
        self.drafter = drafter
        # DFlash2: a selector walks the top-K candidates of each position (None: DFlash's per-position choice)
        self.selector = getattr(drafter, "candidate_selector", None)
        if self.selector is not None and self.options.tree_budget is not None:
            raise ValueError(
                f"dflash_tree_budget={self.options.tree_budget} with a DFlash2 drafter: its drafts are one path of its "
                "candidate selector, whose distribution at each position depends on the token before it, and trees "
                "are built from per-position distributions. Drop dflash_tree_budget (chains work with DFlash2)."
            )
        own_embeddings, own_head = getattr(drafter, "own_embeddings", lambda: (None, None))()
        self.input_embeddings = own_embeddings or target.get_input_embeddings()
        self.lm_head = own_head or target.get_output_embeddings()
        self.block_size = drafter.config.block_size
        self.logits_processor = logits_processor if logits_processor is not None else lp.LogitsProcessorList()
        # Full layers only (no config): sliding-window drafter layers apply their window by mask, over all context
        self.cache = DynamicCache()
        self.captured = None  # a CapturedDraft (capture_dflash.py): the drafter's forward captured, on its own cache
        self.cache_keyword = cache_argument(drafter)
        mask_ids = torch.full((1, self.block_size - 1), drafter.config.mask_token_id)
        self.mask_embeds = self._embed(mask_ids)
        # A draft vocabulary: the LM head's rows for those tokens (on a CPU the head is mostly the cost of reading its
        # weights), gathered at the first draft (draft_head_rows), not before: the target's prefill of a long prompt
        # is the call's memory peak
        self.draft_ids = drafter.draft_token_ids()
        if self.draft_ids is not None:
            self.draft_ids = self.draft_ids.to(self.lm_head.weight.device)

    def capture(self, captured) -> None:
        """Run the drafter's forwards through `captured` (a :class:`~capture_dflash.CapturedDraft`), whose static
        cache becomes the context cache."""
        self.captured, self.cache = captured, captured.cache

    @property
    def compiled(self) -> bool:
        """Whether the last drafter forward compiled a graph: its seconds are not the drafter's cost."""
        return self.captured is not None and self.captured.compiled

    def _embed(self, ids):
        weight = self.input_embeddings.weight
        return self.input_embeddings(ids.to(weight.device)).to(self.drafter.device)

    def lookup_offer(self, histories: list[torch.Tensor]) -> tuple[list[int], int] | None:
        """The prompt-lookup continuation on offer for a batch of one, and the size of the n-gram that found it
        (([], 0): none), cut to what fits under max_length; None when the call has no lookup source or several rows.

        Matches go down to one token, as transformers' prompt lookup: the cost-aware policy keeps acceptance per
        matched size, so on text where short matches do not hold they stop being verified.
        """
        if self.options.lookup_tokens is None or len(histories) != 1:
            return None
        offer, size = prompt_lookup_match(histories[0], self.options.lookup_tokens, self.options.lookup_ngram)
        room = self.options.room(len(histories[0]))
        return (offer if room is None else offer[: max(room, 0)]), size

    def get_candidates(
        self,
        input_ids,
        context_hidden_states=None,
        *,
        draft: Draft | None = None,
        lookup: list[int] = (),
        histories=None,
        context_positions=None,
        anchor_positions=None,
        slot_mask=None,
        **kwargs,
    ):
        """CandidateGenerator API: ``(input_ids + drafts, draft_scores)`` for the policy's `draft` (None:
        ``num_assistant_tokens`` drafts, or the whole block), none past max_length; ``(input_ids, None)`` when no draft
        fits, as transformers' generators answer.
        Lookup drafts (`draft.from_lookup`: the first `draft.count` tokens of `lookup`) come with no scores: they are
        proposed with certainty (q is a point mass on each, :func:`~sampling_dflash.accept`).

        One unpadded sequence: `input_ids` [1, L] ends with the anchor (the token the target has not read yet), and
        `context_hidden_states` [1, n, C] are the drafter's context for the positions after those already cached
        here, up to the anchor excluded: ``drafter.fused_features`` of the target's hidden states there.

        A batch (as :func:`dflash_decoding` calls it): `input_ids` [b, 1] holds each row's anchor, so the candidates
        are the verify block ``[anchor, drafts]``; `histories` each row's committed tokens (rows may differ in
        length), `context_positions` [b, n] and `anchor_positions` [b] the positions of the context and of the
        anchors, `slot_mask` [b, cache + n] which cache slots hold real tokens (None: all do).
        """
        if draft is None:  # transformers' API alone: what full blocks verify (num_assistant_tokens, or the block)
            full = dataclasses.replace(self.options, policy="full")
            draft = draft_policy(full, None, self.drafter).choose(len(input_ids), input_ids.device)
        if draft.from_lookup:
            return torch.cat([input_ids, input_ids.new_tensor(list(lookup[: draft.count]))[None]], dim=1), None
        if histories is None:
            histories = list(input_ids)
            cached, length = self.cache.get_seq_length(), input_ids.shape[1]
            context_positions = torch.arange(cached, length - 1, device=input_ids.device)[None]
            anchor_positions = torch.tensor([length - 1], device=input_ids.device)
        num_drafts = self._fitting(histories, draft.count)
        if num_drafts <= 0:
            return input_ids, None
        drafts, scores = self.propose(
            histories, context_hidden_states, context_positions, anchor_positions, slot_mask, num_drafts
        )
        return torch.cat([input_ids, drafts], dim=1), scores

    def _fitting(self, histories, count: int) -> int:
        """`count` drafts, cut to those that fit before max_length after the shortest row (0 or less: none)."""
        room = self.options.room(min(len(h) for h in histories))
        return count if room is None else min(count, room)

    def update_candidate_strategy(self, input_ids, scores, num_matches):
        """CandidateGenerator API. Nothing to adapt here: the draft policy (policy_dflash.py) chooses each cycle's
        count, and the decoding loop hands it every verification."""

    def propose(self, histories, context, context_positions, anchor_positions, slot_mask=None, num_drafts=None):
        """One drafter forward: `num_drafts` draft tokens for each row (what :meth:`get_candidates` calls).

        Args:
            histories: committed tokens per row (the last one is the anchor, not yet seen by the target).
            context: [b, n, C] the drafter's context (``fused_features``) of the slots the target verified since
                the last call.
            context_positions: [b, n] their positions; anchor_positions: [b] the anchors' positions.
            slot_mask: [b, cache + n] which cache slots hold real tokens (None: all do).
        Returns:
            drafts [b, num_drafts] and the processed drafter scores they were chosen from (q = softmax(scores)).
        """
        num_drafts = self.block_size - 1 if num_drafts is None else num_drafts
        hidden = self.drafter_states(histories, context, context_positions, anchor_positions, slot_mask)
        rows = gemm_friendly_rows(num_drafts + 1, self.drafter.device, len(histories))
        hidden = hidden[:, :rows]
        anchors_device = histories[0].device
        logits = self.draft_logits(hidden)[:, 1 : num_drafts + 1].float().to(anchors_device)
        if self.selector is None:
            return choose_drafts(self.logits_processor, histories, logits, self.options.do_sample)
        anchors = torch.stack([h[-1] for h in histories])
        candidate_ids, unary = self.drafter.candidate_scores(logits)
        edges = self.drafter.edge_scores(candidate_ids, unary, hidden[:, 1 : num_drafts + 1], anchors)
        return selector_walk(self.logits_processor, histories, candidate_ids, edges.to(anchors_device),
                             logits.shape[-1], self.options.do_sample)

    def drafter_states(self, histories, context, context_positions, anchor_positions, slot_mask=None):
        """The drafter's forward over each row's block ``[anchor, mask, ...]`` after its new `context` (arguments as
        :meth:`propose`'s): its last hidden states [b, block, H], on the LM head's device and in its dtype (the
        target's head scores them; the drafter may run in another dtype). Its context K/V stay cached."""
        device, batch = self.drafter.device, len(histories)
        anchors = torch.stack([h[-1:] for h in histories])
        block = torch.cat([self._embed(anchors), self.mask_embeds.expand(batch, -1, -1)], dim=1)
        offsets = torch.arange(self.block_size, device=device)
        positions = torch.cat([context_positions.to(device), anchor_positions.to(device)[:, None] + offsets], dim=1)
        if slot_mask is not None:
            slot_mask = torch.cat([slot_mask, slot_mask.new_ones(batch, self.block_size)], dim=1).to(device)
        if self.captured is not None:  # a batch of one
            hidden = self.captured(block, context.to(device), positions)
        else:
            hidden = self.drafter(
                noise_embeds=block,
                context_hidden_states=context.to(device),
                context_fused=True,
                position_ids=positions,
                attention_mask=slot_mask,
                **{self.cache_keyword: self.cache},
            ).last_hidden_state
            self.cache.crop(-self.block_size)  # keep the context K/V only
        return hidden.to(device=self.lm_head.weight.device, dtype=self.lm_head.weight.dtype)

    @property
    def lazy_probes(self) -> bool:
        """Whether a scored probe's drafts are :class:`GreedyDrafts`: greedy, with no logits processor (a draft's
        processed scores depend on the drafts before it) and no candidate selector (a walk along the block)."""
        return not (len(self.logits_processor) or self.selector is not None or self.options.do_sample)

    def scored_drafts(self, histories, context, context_positions, anchor_positions, num_drafts: int,
                      slot_mask=None):
        """A scored probe's drafts (batch size 1, greedy): the tokens the drafter proposes after its new `context`,
        [] where none fits before max_length. They are :class:`GreedyDrafts` (:attr:`lazy_probes`), each scored by the
        LM head when first read: a probe is scored against the tokens
        committed after it, and its first draft rarely holds where probes are all the drafter gets (the head over
        the whole block cost a CPU twice the drafter's forward, for SmolLM2-135M's shipped drafter)."""
        num_drafts = self._fitting(histories, num_drafts)
        if num_drafts <= 0:
            return []
        if not self.lazy_probes:
            drafts, _ = self.propose(histories, context, context_positions, anchor_positions, slot_mask, num_drafts)
            return drafts[0].tolist()
        hidden = self.drafter_states(histories, context, context_positions, anchor_positions, slot_mask)
        return GreedyDrafts(self, hidden[0, 1 : num_drafts + 1])

    def draft_logits(self, hidden):
        """The target LM head's logits for drafter `hidden` states; with a draft vocabulary, only its tokens get
        finite logits (-inf elsewhere: never proposed, and q = 0 there for speculative sampling)."""
        if self.draft_ids is None:
            return self.lm_head(hidden)
        partial = self._draft_vocabulary_logits(hidden)
        logits = partial.new_full((*partial.shape[:-1], self.lm_head.weight.shape[0]), float("-inf"))
        return logits.index_copy_(-1, self.draft_ids, partial)

    def greedy_tokens(self, hidden) -> list[int]:
        """The LM head's argmax for each drafter state of `hidden` [n, H], as :meth:`draft_logits` would choose
        it (ties aside), without spreading a draft vocabulary's logits over the whole vocabulary."""
        if self.draft_ids is None:
            return self.lm_head(hidden).argmax(dim=-1).tolist()
        return self.draft_ids[self._draft_vocabulary_logits(hidden).argmax(dim=-1)].tolist()

    def _draft_vocabulary_logits(self, hidden):
        partial = hidden @ draft_head_rows(self.drafter, self.lm_head.weight, self.draft_ids).T
        if getattr(self.lm_head, "bias", None) is not None:
            partial = partial + self.lm_head.bias[self.draft_ids]
        return partial


class GreedyDrafts(Sequence):
    """A scored probe's greedy drafts (:meth:`DFlashCandidateGenerator.scored_drafts`): draft d is the LM head's
    argmax over the drafter's state for it, computed when first read, in runs of 1, 1, 2, 4, ... rows (the policy
    reads draft d only after the text confirmed the drafts before it).

    Example:
        >>> class Head:  # scores a state by its own values
        ...     def greedy_tokens(self, hidden): return hidden.argmax(dim=-1).tolist()
        >>> drafts = GreedyDrafts(Head(), torch.eye(4)[[2, 0, 3]])
        >>> drafts[0], drafts.tokens  # the first state only
        (2, [2])
        >>> len(drafts), drafts[1:], drafts.tokens
        (3, [0, 3], [2, 0, 3])
    """

    def __init__(self, head, hidden: torch.Tensor):
        self.head, self.hidden, self.tokens = head, hidden, []

    def __len__(self) -> int:
        return len(self.hidden)

    def __getitem__(self, depth):
        if isinstance(depth, slice):
            return [self[d] for d in range(*depth.indices(len(self)))]
        depth = range(len(self))[depth]  # negative depths, and IndexError past the end
        while len(self.tokens) <= depth:
            done = len(self.tokens)
            self.tokens += self.head.greedy_tokens(self.hidden[done : done + max(1, done)])
        return self.tokens[depth]


# drafter -> (a weak reference to the target head it gathered from, that head's version, the ids, their rows): weakly
# keyed, as the policy's cost tables are, so that a drafter holds no state of its own (it still pickles) and neither
# keeps the other alive
_DRAFT_HEAD_ROWS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def draft_head_rows(drafter, weight: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """The rows `ids` of the target's LM head `weight` (:func:`~checkpoint_dflash.plain_head_rows`), gathered at
    `drafter`'s first draft and kept for its later calls while the head is the same tensor, unchanged in place (its
    version), and the ids the same: gathering them cost a CPU ~30 ms per call (the shipped SmolLM2-135M drafter's
    13,566 rows, 31 MiB in fp32), a chat call's worth of drafter probes.

    Example:
        >>> weight, drafter = torch.eye(3), torch.nn.Module()
        >>> rows = draft_head_rows(drafter, weight, torch.tensor([2]))
        >>> rows.tolist(), draft_head_rows(drafter, weight, torch.tensor([2])) is rows
        ([[0.0, 0.0, 1.0]], True)
        >>> _ = weight.mul_(2.0); draft_head_rows(drafter, weight, torch.tensor([2])).tolist()  # changed in place
        [[0.0, 0.0, 2.0]]
    """
    kept = _DRAFT_HEAD_ROWS.get(drafter)
    if kept is not None:
        head, version, kept_ids, rows = kept
        if head() is weight and version == weight._version and torch.equal(kept_ids, ids):
            return rows
    rows = plain_head_rows(weight, ids)
    _DRAFT_HEAD_ROWS[drafter] = (weakref.ref(weight), weight._version, ids, rows)
    return rows


def selector_walk(processors, histories: list[torch.Tensor], candidate_ids: torch.Tensor, edges: torch.Tensor,
                  vocab_size: int, do_sample: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """A DFlash2 drafter's drafts: the path its candidate selector takes, and the scores each draft was chosen from.

    At draft position d (d = 1..k) the row's scores are ``edges[d, i_{d-1}, :]`` on the K candidates
    ``candidate_ids[d]`` (i_0 = 0: at the first position every row of `edges` reads the anchor), -inf on every other
    token; the call's logits processors then process them as plain ``generate`` would after the row's history and the
    drafts before d; the draft is the argmax, or a sample of q_d = softmax(processed scores), and i_d its index among
    the candidates. Returns (drafts [b, k], processed scores [b, k, V]): q_d = softmax(scores[:, d - 1]) is exactly
    the law the draft at d was drawn from given the drafts before it, which is what speculative sampling needs. Where
    the processors leave no candidate finite (e.g. all K suppressed), that position keeps its unprocessed scores (the
    target rejects what it would never produce).

    Args:
        histories: each row's committed tokens; candidate_ids: [b, k, K]; edges: [b, k, K, K] (see
        ``modeling_dflash2.DFlash2CandidateSelector``).

    Example (no processors, greedy; one row, 2 positions, K = 2: from candidate 0 the first position prefers its
    candidate 1, token 7; from there the second prefers candidate 0, token 4):
        >>> edges = torch.tensor([[[[0.0, 1.0], [0.0, 1.0]], [[0.0, 3.0], [2.0, 0.0]]]])
        >>> drafts, scores = selector_walk([], [torch.tensor([1])], torch.tensor([[[5, 7], [4, 6]]]), edges, 8, False)
        >>> drafts.tolist(), scores[0, 1, [4, 6]].tolist()
        ([[7, 4]], [2.0, 0.0])
    """
    batch, k, _ = candidate_ids.shape
    if k == 0:
        return candidate_ids[..., 0], edges.new_zeros(batch, 0, vocab_size)
    rows = torch.arange(batch, device=candidate_ids.device)
    previous = torch.zeros(batch, dtype=torch.long, device=candidate_ids.device)
    drafts, chosen_from = [], []
    for d in range(k):
        raw = edges.new_full((batch, vocab_size), float("-inf"))
        raw.scatter_(1, candidate_ids[:, d], edges[rows, d, previous])
        scores = raw
        if len(processors):
            so_far = [torch.cat([h, torch.stack(drafts, dim=1)[r].to(h.device)]) if drafts else h
                      for r, h in enumerate(histories)]
            _, processed = choose_drafts(processors, so_far, raw[:, None], do_sample=False)
            on_candidates = torch.isfinite(raw)  # a processor may turn -inf into a finite floor: keep K candidates
            processed = processed[:, 0].masked_fill(~on_candidates, float("-inf"))
            usable = (processed > float("-inf")).any(dim=-1, keepdim=True)
            scores = torch.where(usable, processed, raw)
        token = select_tokens(scores, do_sample)
        previous = (candidate_ids[:, d] == token[:, None]).long().argmax(dim=-1)
        drafts.append(token)
        chosen_from.append(scores)
    return torch.stack(drafts, dim=1), torch.stack(chosen_from, dim=1)
