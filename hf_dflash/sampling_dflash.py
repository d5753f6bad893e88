# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""Scores over a block and the acceptance rules of DFlash decoding.

Processed scores for every position of a verify block (each position as if plain ``generate`` had scored it after
its own history), draft token choice, and the two acceptance rules: greedy (the longest prefix of drafts equal to
the target's choices) and speculative sampling (accept with min(1, p/q), resample from norm(max(0, p - q))).

Part of the remote-code payload: imports only torch and transformers.
"""

import contextlib

import torch
from transformers.generation import logits_process as lp


# Processors that treat every row of scores alike whatever the token history: applied to all block positions at once.
POSITION_INDEPENDENT_PROCESSORS = (
    lp.TemperatureLogitsWarper,
    lp.TopKLogitsWarper,
    lp.TopPLogitsWarper,
    lp.MinPLogitsWarper,
    lp.TypicalLogitsWarper,
    lp.EpsilonLogitsWarper,
    lp.EtaLogitsWarper,
    lp.SuppressTokensLogitsProcessor,
    lp.InfNanRemoveLogitsProcessor,
)


# ----------------------------------------------------------------------------------------------------------------------
# logits processing over a block (rows of a batch may hold histories of different lengths)
def _behaves_as(processor, classes) -> bool:
    # A subclass that overrides __call__ may read the history differently: only the known __call__ qualifies.
    return any(isinstance(processor, cls) and type(processor).__call__ is cls.__call__ for cls in classes)


def _ids_independent(processor) -> bool:
    return _behaves_as(processor, POSITION_INDEPENDENT_PROCESSORS)


def _set_dependent(processor, history_length: int | None = None) -> bool:
    """Depends only on WHICH tokens are in the history, so rows may be padded with a token already present.

    With an int ``prompt_ignore_length`` the padding token (the last committed one, at ``history_length - 1``) must
    lie in the part of the history the processor reads.
    """
    if not _behaves_as(processor, (lp.RepetitionPenaltyLogitsProcessor,)):
        return False
    ignore = processor.prompt_ignore_length
    if isinstance(ignore, torch.Tensor):
        return False
    return ignore is None or history_length is None or ignore < history_length


def vectorizable(processors, histories) -> bool:
    """Whether `processors` may score every position of every row in one call (histories padded with a token they
    hold already): position-independent warpers and repetition penalty only."""
    shortest = min(len(h) for h in histories)
    return all(_ids_independent(p) or _set_dependent(p, shortest) for p in processors)


def padded_histories(histories: list[torch.Tensor]) -> torch.Tensor:
    """Right-pad each row's history with its own last token (already in its set) to one length: [b, L]."""
    length = max(len(h) for h in histories)
    return torch.stack([torch.cat([h, h[-1:].expand(length - len(h))]) for h in histories])


def processed_verify_scores(processors, histories: list[torch.Tensor], drafts, logits):
    """Processed target scores for a verify block: row r position i was computed after histories[r] + drafts[r, :i].

    One processor call for the whole batch and block when every processor allows it (position-independent
    warpers, repetition penalty); otherwise one call per row and position with the exact history, as plain
    ``generate`` makes them.
    """
    if len(processors) == 0:
        return logits
    batch, rows, vocab = logits.shape
    k = drafts.shape[1]
    if vectorizable(processors, histories):
        base = padded_histories(histories)
        # Position i must not see drafts i..: replace them with the row's anchor, which its history already holds.
        unseen = torch.arange(k, device=drafts.device)[None, :] >= torch.arange(rows, device=drafts.device)[:, None]
        tail = torch.where(unseen[None], base[:, -1:, None], drafts[:, None, :])
        ids = torch.cat([base[:, None].expand(-1, rows, -1), tail], dim=2).reshape(batch * rows, -1)
        return processors(ids, logits.reshape(batch * rows, vocab).clone()).view(batch, rows, vocab)
    out = torch.empty_like(logits)
    for r, history in enumerate(histories):
        full = torch.cat([history, drafts[r]])[None]
        with processors_for_rows(processors, [r]):
            for i in range(rows):
                out[r : r + 1, i] = processors(full[:, : len(history) + i], logits[r : r + 1, i].clone())
    return out


def choose_drafts(processors, histories: list[torch.Tensor], logits, do_sample: bool):
    """Draft tokens [b, k] from drafter `logits` [b, k, V], and the processed scores they were chosen from (q =
    softmax(scores)); vectorised unless a processor depends on the drafts chosen before it.

    Processors that read only which tokens occur (repetition penalty) see the committed history in every
    position: drafts are only a proposal (the target re-scores each position with its exact history), so this
    can change the acceptance rate, never the output.
    """
    batch, k, vocab = logits.shape
    if len(processors) == 0 or k == 0:
        return select_tokens(logits, do_sample), logits
    if vectorizable(processors, histories):
        ids = padded_histories(histories)[:, None].expand(-1, k, -1).reshape(batch * k, -1)
        scores = processors(ids, logits.reshape(batch * k, vocab).clone()).view(batch, k, vocab)
        return select_tokens(scores, do_sample), scores
    scores, drafts = torch.empty_like(logits), []
    for r, history in enumerate(histories):
        ids = history[None]
        with processors_for_rows(processors, [r]):
            for i in range(k):
                scores[r : r + 1, i] = processors(ids, logits[r : r + 1, i].clone())
                ids = torch.cat([ids, select_tokens(scores[r : r + 1, i], do_sample)[:, None]], dim=1)
        drafts.append(ids[0, len(history) :])
    return torch.stack(drafts), scores


class ProcessorRows:
    """The per-row values some processors hold (see :func:`processors_for_rows`), retired with their rows: this
    call's processors are its own, so they keep the selection."""

    def __init__(self, processors):
        self.processors = processors

    def batch_select_indices(self, rows: torch.Tensor) -> None:
        for p in self.processors:
            if isinstance(getattr(p, "prompt_ignore_length", None), torch.Tensor):
                p.prompt_ignore_length = p.prompt_ignore_length[rows.to(p.prompt_ignore_length.device)]


@contextlib.contextmanager
def processors_for_rows(processors, rows: list[int]):
    """Processors that hold one value per batch row (transformers gives repetition_penalty the left-padding length
    of each row of a masked batch as `prompt_ignore_length`) see only `rows` inside: the rows still generating, or the
    one row a per-row call scores."""
    saved = [(p, p.prompt_ignore_length) for p in processors
             if isinstance(getattr(p, "prompt_ignore_length", None), torch.Tensor)]
    for p, values in saved:
        p.prompt_ignore_length = values[torch.tensor(rows, device=values.device)]
    try:
        yield
    finally:
        for p, values in saved:
            p.prompt_ignore_length = values


# ----------------------------------------------------------------------------------------------------------------------
# choosing and accepting tokens
def select_tokens(scores: torch.Tensor, do_sample: bool) -> torch.Tensor:
    """[..., V] scores -> [...] token ids (argmax, or one sample from softmax).

    Example:
        >>> select_tokens(torch.tensor([[[0.0, 2.0, 1.0], [3.0, 0.0, 0.0]]]), do_sample=False).tolist()
        [[1, 0]]
    """
    if not do_sample:
        return scores.argmax(dim=-1)
    probs = scores.softmax(dim=-1).reshape(-1, scores.shape[-1])
    return torch.multinomial(probs, num_samples=1).view(scores.shape[:-1])


def leading_true(matches: torch.Tensor) -> torch.Tensor:
    """[b, k] booleans -> [b] length of each row's all-True prefix.

    Example:
        >>> leading_true(torch.tensor([[True, True, False, True], [False, True, True, True]])).tolist()
        [2, 0]
    """
    return matches.long().cumprod(dim=1).sum(dim=1)


def greedy_accept(drafts, target_scores):
    """Greedy verification: drafts [b, k], target_scores [b, k + 1, V] -> (accepted [b], tokens [b, k + 1]).

    Row r commits tokens[r, : accepted[r] + 1]: the drafts equal to the target's own choices, then the target's
    next token.

    Example (vocabulary of 4; the target's choices are 2, 1, 3):
        >>> scores = torch.eye(4)[[2, 1, 3]][None]
        >>> accepted, tokens = greedy_accept(torch.tensor([[2, 0]]), scores)
        >>> accepted.tolist(), tokens.tolist()
        ([1], [[2, 1, 3]])
    """
    choice = target_scores.argmax(dim=-1)
    return leading_true(drafts == choice[:, : drafts.shape[1]]), choice


def speculative_accept(drafts, draft_probs, target_probs):
    """Speculative sampling: drafts [b, k] were sampled from draft_probs [b, k, V]; target_probs is [b, k + 1, V].

    Draft i is accepted with probability min(1, p/q); the first rejected position is resampled from
    norm(max(0, p - q)); after k acceptances the bonus token is drawn from p. Returns (accepted [b],
    tokens [b, k + 1]) like :func:`greedy_accept`; every committed token follows the target's distribution.
    """
    batch, k = drafts.shape
    p = target_probs[:, :k].gather(2, drafts[..., None])[..., 0]
    q = draft_probs.gather(2, drafts[..., None])[..., 0]
    accepted = leading_true(torch.rand(batch, k, device=drafts.device) * q < p)  # u < p/q, without dividing by q
    # With q = 0 after the last draft, the residual formula yields the bonus distribution p there.
    q = torch.cat([draft_probs, draft_probs.new_zeros(batch, 1, draft_probs.shape[-1])], dim=1)
    at = accepted[:, None, None].expand(-1, 1, target_probs.shape[-1])
    p_next, q_next = target_probs.gather(1, at)[:, 0], q.gather(1, at)[:, 0]
    residual = (p_next - q_next).clamp_min(0)
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p_next)  # rounding may empty it
    tokens = torch.cat([drafts, drafts[:, :1]], dim=1)
    tokens.scatter_(1, accepted[:, None], torch.multinomial(residual / residual.sum(-1, keepdim=True), 1))
    return accepted, tokens


def point_mass_accept(drafts, target_probs):
    """Speculative sampling of drafts proposed with certainty (prompt lookup: q is a point mass on each draft), with
    no vocabulary-wide q: draft i is accepted with probability p(draft_i) (min(1, p/q) with q = 1); the first rejected
    position is resampled from p without the rejected token, renormalised (norm(max(0, p - q))); after k acceptances
    the bonus token is drawn from p. Returns (accepted [b], tokens [b, k + 1]) like :func:`speculative_accept`, with
    the same draws.

    Example (the target is sure of token 2, then of token 1: both lookup drafts are accepted, 3 is the bonus):
        >>> p = torch.eye(4)[[2, 1, 3]][None]
        >>> accepted, tokens = point_mass_accept(torch.tensor([[2, 1]]), p)
        >>> accepted.tolist(), tokens.tolist()
        ([2], [[2, 1, 3]])
    """
    batch, k = drafts.shape
    p = target_probs[:, :k].gather(2, drafts[..., None])[..., 0]
    accepted = leading_true(torch.rand(batch, k, device=drafts.device) < p)
    at = accepted[:, None, None].expand(-1, 1, target_probs.shape[-1])
    p_next = target_probs.gather(1, at)[:, 0]
    rejected = accepted < k  # rows whose position `accepted` holds a rejected draft (the others draw the bonus)
    draft_at = torch.cat([drafts, drafts[:, :1]], dim=1).gather(1, accepted[:, None])
    residual = torch.where(rejected[:, None], p_next.scatter(1, draft_at, 0.0), p_next)
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p_next)  # rounding may empty it
    tokens = torch.cat([drafts, drafts[:, :1]], dim=1)
    tokens.scatter_(1, accepted[:, None], torch.multinomial(residual / residual.sum(-1, keepdim=True), 1))
    return accepted, tokens


def accept(drafts, draft_scores, scores, do_sample: bool):
    """Step 4 for drafts [b, k] and processed target `scores` [b, k + 1, V]: (accepted drafts [b], tokens [b, k + 1]).
    `draft_scores` None: the drafts were proposed with certainty (a prompt lookup). No drafts (a plain step): the
    target's own token alone."""
    if do_sample and drafts.shape[1] > 0:
        if draft_scores is None:
            return point_mass_accept(drafts, scores.softmax(-1))
        return speculative_accept(drafts, draft_scores.softmax(-1), scores.softmax(-1))
    if drafts.shape[1] == 0:  # a plain step (the policy's most common cycle where drafts do not pay): no prefix
        return drafts.new_zeros(drafts.shape[0]), select_tokens(scores, do_sample)
    return greedy_accept(drafts, scores)
