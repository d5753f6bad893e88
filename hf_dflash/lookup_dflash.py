# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""Prompt-lookup proposals (transformers' ``prompt_lookup_num_tokens`` semantics): drafts copied from earlier text.

The cost-aware policy offers them as a second draft source beside the drafter's block, and a tree adds them as one
more branch. Part of the remote-code payload: imports only torch.
"""

import torch


def prompt_lookup(history: torch.Tensor, num_tokens: int, max_ngram: int = 2) -> list[int]:
    """The prompt-lookup continuation: for n-gram sizes from `max_ngram` down to 1, the first (leftmost) earlier
    occurrence of the last n tokens of `history` [L] that has a continuation; up to `num_tokens` tokens that follow
    it. [] when nothing matches.

    Example:
        >>> prompt_lookup(torch.tensor([5, 6, 7, 8, 9, 1, 5, 6]), num_tokens=3)
        [7, 8, 9]
        >>> prompt_lookup(torch.tensor([1, 2, 3]), num_tokens=3)
        []
    """
    return prompt_lookup_match(history, num_tokens, max_ngram)[0]


def prompt_lookup_match(history: torch.Tensor, num_tokens: int, max_ngram: int = 2,
                        min_ngram: int = 1) -> tuple[list[int], int]:
    """(:func:`prompt_lookup`'s continuation, the size of the n-gram that matched; 0 when none did), trying n-gram
    sizes down to `min_ngram`. The size tells how much to trust the continuation: the cost-aware policy keeps
    acceptance statistics per size.

    Example:
        >>> prompt_lookup_match(torch.tensor([5, 6, 7, 8, 9, 1, 5, 6]), num_tokens=2)
        ([7, 8], 2)
        >>> prompt_lookup_match(torch.tensor([5, 6, 7, 5]), num_tokens=2, min_ngram=2)
        ([], 0)
    """
    length = len(history)
    for size in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        windows = history.unfold(0, size, 1)
        starts = ((windows == history[-size:]).all(dim=1).nonzero().flatten() + size).tolist()
        start = next((i for i in starts if i < length), None)
        if start is not None:
            return history[start : min(start + num_tokens, length)].tolist(), size
    return [], 0
