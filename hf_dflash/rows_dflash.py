# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""Per-row state of a DFlash generate() call: what each row of a batch has committed, where its slots are, when it
stops (exactly where plain ``generate`` would), and the outputs plain ``generate`` would return.

Part of the remote-code payload: imports only torch, transformers and sibling modules.
"""

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from .cache_dflash import select_cache_rows


@dataclass
class Rows:
    """Per-row state of the rows still generating (axis 0 of every tensor); finished rows leave it.

    The target's and the drafter's caches hold one slot per verified position of every row; the batch's longest
    acceptance sets how many slots a cycle adds, and ``slot_mask`` marks the slots that hold no real token (left
    padding, and drafts a row rejected while a neighbour accepted more) so no row waits for a neighbour. A static
    cache, which has an end, has those padding slots squeezed out when it runs short (``cache_dflash.compact_slots``)
    and its finished rows selected out like a dynamic one's.

    Example (two prompts, the second left-padded):
        >>> rows = Rows.for_prompts(torch.tensor([[5, 6, 7], [0, 8, 9]]), torch.tensor([[1, 1, 1], [0, 1, 1]]))
        >>> rows.feature_positions.tolist(), rows.slot_mask.tolist()
        ([[0, 1, 2], [0, 0, 1]], [[True, True, True], [False, True, True]])
        >>> rows.anchor_positions = torch.tensor([3, 2])
        >>> ids, positions, mask = rows.verify_inputs(torch.tensor([[7, 11], [9, 12]]), width=2)
        >>> positions.tolist(), mask.tolist()
        ([[3, 4], [2, 3]], [[True, True, True, True, True], [False, True, True, True, True]])
    """

    histories: list[torch.Tensor]  # committed tokens per row (its prompt, padding included, first); last: the anchor
    ids: list[int]  # the original batch row of each row
    finished: list[torch.Tensor | None]  # by original batch row: the history a finished row ends with
    slot_mask: torch.Tensor | None  # [b, slots]: which cache slots hold real tokens; None while all do
    feature_positions: torch.Tensor  # [b, n]: positions of the slots verified since the drafter last read features
    features: torch.Tensor | None = None  # [b, n, C]: the drafter context of those fused so far (None: none)
    anchor_positions: torch.Tensor | None = None  # [b]: position of each row's anchor (its last committed token)
    # verifies' (selected target states, positions) after `features`: fused and joined when the drafter reads them
    pending: list[tuple[list[torch.Tensor], torch.Tensor]] = field(default_factory=list, repr=False)
    fuse: Callable[[list[torch.Tensor]], torch.Tensor] | None = field(default=None, repr=False)  # drafter.fuse

    @classmethod
    def for_prompts(cls, input_ids, attention_mask=None) -> "Rows":
        """The rows of a left-padded batch before the prefill: positions count real tokens only."""
        batch, prompt_len = input_ids.shape
        slot_mask = None if attention_mask is None or bool(attention_mask.all()) else attention_mask.bool()
        if slot_mask is None:
            positions = torch.arange(prompt_len, device=input_ids.device)[None].expand(batch, -1)
        else:
            positions = (slot_mask.long().cumsum(-1) - 1).clamp_min(0)
        return cls(list(input_ids), list(range(batch)), [None] * batch, slot_mask, positions)

    def __len__(self) -> int:
        return len(self.ids)

    def anchors(self) -> torch.Tensor:
        """[b, 1]: each row's last committed token, which the target has not read yet."""
        return torch.stack([h[-1:] for h in self.histories])

    def start(self, tokens, features, scores, stopping_criteria, fuse) -> list[int]:
        """After the prefill: append each row's first token (`tokens` [b, 1]); the prompt features are the drafter's
        first context, and `fuse` (``DFlashDraftModel.fuse``) makes the later verifies' states into context. Returns
        the rows that go on."""
        self.features, self.anchor_positions, self.fuse = features, self.feature_positions[:, -1] + 1, fuse
        return [r for r in range(len(self)) if self._extend(r, tokens[r], scores[r], stopping_criteria)[1]]

    def unread(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(features [b, n, C], positions [b, n]) of the slots verified since the drafter last read: its next
        context. Verifies leave their target states in pieces, fused and joined here once, when the drafter reads
        them: a run of plain steps pays for neither (fused at every step, ``fc`` cost ~1% of a plain step of
        SmolLM2-135M on a CPU; joined at every step, a long prompt's unread features were copied per step: +13% per
        token after a 2K-token prompt)."""
        if self.pending:
            states = [torch.cat(layer, dim=1) for layer in zip(*(s for s, _ in self.pending))]
            fused = self.fuse(states)
            self.features = fused if self.features is None else torch.cat([self.features, fused], dim=1)
            self.feature_positions = torch.cat([self.feature_positions, *(p for _, p in self.pending)], dim=1)
            self.pending = []
        return self.features, self.feature_positions

    def retire(self, running: list[int], *caches) -> bool:
        """Keep only the rows `running` (indices), here and in `caches`; the others are finished. False: none left."""
        if len(running) == len(self):
            return True
        for r in set(range(len(self))) - set(running):
            self.finished[self.ids[r]] = self.histories[r]
        if not running:
            return False
        keep = torch.tensor(running, device=self.anchor_positions.device)
        for cache in caches:
            select_cache_rows(cache, keep)
        self.histories, self.ids = [self.histories[r] for r in running], [self.ids[r] for r in running]
        features, positions = self.unread()
        self.features, self.feature_positions = features[keep], positions[keep]
        self.anchor_positions = self.anchor_positions[keep]
        self.slot_mask = self.slot_mask[keep] if self.slot_mask is not None else None
        return True

    def verify_inputs(self, candidates, width: int):
        """Target inputs for `candidates` [b, 1 + k] (anchor, drafts) padded with their last token to `width` slots:
        ids and positions [b, width], and the attention mask over cache and block (None while every slot is real)."""
        ids = torch.cat([candidates, candidates[:, -1:].expand(-1, width - candidates.shape[1])], dim=1)
        positions = self.anchor_positions[:, None] + torch.arange(width, device=self.anchor_positions.device)
        if self.slot_mask is None:
            return ids, positions, None
        return ids, positions, torch.cat([self.slot_mask, self.slot_mask.new_ones(len(self), width)], dim=1)

    def commit(self, accepted, tokens, scores, states, positions, cache, cached: int, stopping_criteria,
               drafter_read: bool = True):
        """Commit a verification: row r accepted `accepted[r]` drafts and then `tokens[r, accepted[r]]`.

        The target `cache` (`cached` slots before the verify forward) keeps the slots of the longest acceptance;
        shorter rows mark their rejected slots as padding. The kept slots' target `states` (the drafter's layers,
        ``DFlashDraftModel.selected_states``, [b, width, H] each) and `positions` [b, width] become the drafter's next
        context (after the unread ones, when the drafter did not run this cycle), fused when it reads them. Each row's
        history grows by its tokens, cut exactly where plain generate would stop (EOS, max length, stop strings inside
        the block; `scores` [b, k + 1, V] feed the criteria).

        Returns (the rows that go on, the tokens each row committed).
        """
        keep = int(accepted.max()) + 1
        cache.crop(-(positions.shape[1] - keep))
        real = torch.arange(keep, device=self.anchor_positions.device)[None] <= accepted[:, None]
        if self.slot_mask is not None or not bool(real.all()):
            before = self.slot_mask if self.slot_mask is not None else real.new_ones(len(self), cached)
            self.slot_mask = torch.cat([before, real], dim=1)
        kept = ([state[:, :keep] for state in states], positions[:, :keep])
        if drafter_read:  # the drafter read all before: these are its whole next context
            self.features, self.feature_positions, self.pending = None, positions[:, :0], [kept]
        else:  # a plain step: the drafter has not read the previous features either; it reads both next time
            self.pending.append(kept)
        self.anchor_positions = self.anchor_positions + accepted + 1
        running, committed = [], []
        for r, n in enumerate(accepted.tolist()):
            new, goes_on = self._extend(r, tokens[r, : n + 1], scores[r], stopping_criteria)
            committed.append(new)
            if goes_on:
                running.append(r)
        return running, committed

    def _extend(self, r: int, tokens, scores, stopping_criteria):
        """Append `tokens` to row r's history up to the first one plain generate stops after: (appended, goes on)."""
        start = len(self.histories[r])
        history = torch.cat([self.histories[r], tokens])
        stop = first_stop(stopping_criteria, history, start, scores)
        self.histories[r] = history if stop is None else history[: start + stop + 1]
        return self.histories[r][start:], stop is None


def first_stop(stopping_criteria, history, start: int, scores) -> int | None:
    """Index (relative to `start`) of the first new token of `history` [L] after which generation must stop.

    `scores` [n, V] holds the processed scores each new token was chosen from (row i for token start + i).
    """
    for i in range(start, len(history)):
        if bool(stopping_criteria(history[None, : i + 1], scores[None, i - start]).any()):
            return i - start
    return None


class OutputRecorder:
    """Per-token scores / logits / hidden states / attentions, in the layout plain ``generate`` returns (batch 1), as
    the call's `options` (:class:`~options_dflash.DFlashCallOptions`) ask for them."""

    def __init__(self, options):
        self.on = options.return_dict_in_generate
        self.scores = () if self.on and options.output_scores else None
        self.logits = () if self.on and options.output_logits else None
        self.attentions = () if self.on and options.output_attentions else None
        self.hidden_states = () if self.on and options.output_hidden_states else None

    def add(self, outputs, raw, processed, count: int, prefill: bool, kv_length: int):
        """Record `count` committed tokens whose logits are rows 0..count-1 of raw/processed."""
        for i in range(count):
            if self.scores is not None:
                self.scores += (processed[:, i],)
            if self.logits is not None:
                self.logits += (raw[:, i],)
            if self.hidden_states is not None:
                self.hidden_states += (tuple(h if prefill else h[:, i : i + 1] for h in outputs.hidden_states),)
            if self.attentions is not None and outputs.attentions is not None:
                self.attentions += (
                    tuple(a if prefill else a[..., i : i + 1, : kv_length + i + 1] for a in outputs.attentions),
                )


def record(recorder: OutputRecorder, streamer, outputs, raw, processed, committed: list[torch.Tensor], cached) -> None:
    """Step 5's outputs, for a chain or a tree's path alike: per-token scores / hidden states (batch 1) and the
    streamer's new tokens. `committed`: each row's new tokens; `raw`/`processed`: their logits, in that order."""
    if len(committed) != 1:
        return
    recorder.add(outputs, raw, processed, len(committed[0]), prefill=False, kv_length=cached)
    if streamer is not None:
        streamer.put(committed[0].cpu())


def right_padded(histories: list[torch.Tensor], pad_token_id: int | None) -> torch.Tensor:
    """Finished rows padded with `pad_token_id` to the longest row, as plain batched generate returns them.

    Example:
        >>> right_padded([torch.tensor([5, 6, 7]), torch.tensor([8])], pad_token_id=0).tolist()
        [[5, 6, 7], [8, 0, 0]]
    """
    longest = max(len(h) for h in histories)
    if all(len(h) == longest for h in histories):
        return torch.stack(histories)
    if pad_token_id is None:
        raise ValueError("Batched generation with rows of different lengths needs a pad_token_id: pass "
                         "pad_token_id=... (or set the tokenizer's pad token) to generate().")
    pad = histories[0].new_tensor([pad_token_id])
    return torch.stack([torch.cat([h, pad.expand(longest - len(h))]) for h in histories])
