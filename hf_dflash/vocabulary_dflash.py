# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""A drafter's draft vocabulary: the target tokens drafts are chosen from, and the draft LM head scoring them.

Saved in EAGLE-3's layout, the one vLLM reads: ``draft_vocab_size`` in the config, a ``d2t`` buffer (draft index i
is target token ``i + d2t[i]``) and the drafter's own ``lm_head.weight``, the target's LM head rows for those tokens.

Part of the remote-code payload: imports only torch and sibling modules.
"""

import torch
from torch import nn

from .checkpoint_dflash import plain_head_rows


class DraftVocabularyMixin:
    """`draft_token_ids` and `set_draft_vocabulary` of a DFlash drafter (its `d2t` buffer and `lm_head`)."""

    def draft_token_ids(self) -> torch.Tensor | None:
        """The target token ids drafts are chosen from (sorted), or None: the whole vocabulary."""
        if not self.config.draft_vocab_size:
            return None
        return torch.arange(len(self.d2t), device=self.d2t.device) + self.d2t

    def set_draft_vocabulary(
        self, token_ids: torch.Tensor | list[int] | None, lm_head: nn.Module | torch.Tensor | None = None
    ) -> None:
        """Draft among `token_ids` only (e.g. the most frequent tokens of the training responses), or among the whole
        vocabulary again (None). Lossless either way: the target still verifies every draft; tokens outside the set
        are simply never proposed.

        Saved in EAGLE-3's layout, the one vLLM's DFlash loader reads: ``draft_vocab_size`` in the config, a ``d2t``
        buffer (draft index i is target token ``i + d2t[i]``) and the drafter's own ``lm_head.weight``: the rows of
        the target's LM head for those tokens, gathered here from `lm_head` (the target's output embeddings or their
        weight). Without them the drafter still generates here (the target's rows are read at generate time), but
        `save_pretrained` refuses to write it: vLLM would score drafts with the wrong rows and accept nothing.

        Example:
            >>> drafter.set_draft_vocabulary(frequent_ids, lm_head=target.get_output_embeddings())  # doctest: +SKIP
            >>> drafter.save_pretrained("my-drafter")  # draft_vocab_size; d2t and lm_head.weight  # doctest: +SKIP
        """
        if token_ids is None:
            self.config.draft_vocab_size = None
            self._buffers.pop("d2t", None)
            self.lm_head = None
            return
        ids = torch.as_tensor(token_ids, dtype=torch.long).flatten().unique(sorted=True)
        vocab = self.config.vocab_size
        if len(ids) == 0 or int(ids[0]) < 0 or int(ids[-1]) >= vocab:
            raise ValueError(f"A draft vocabulary needs token ids in [0, {vocab}) (the target's vocab_size); got "
                             f"{len(ids)} ids" + (f" from {int(ids[0])} to {int(ids[-1])}." if len(ids) else "."))
        if len(ids) == vocab:  # every token: the whole vocabulary (vLLM has no d2t slot when the sizes are equal)
            return self.set_draft_vocabulary(None)
        reference = self.norm.weight
        head = None if lm_head is None else self._draft_head_from(lm_head, ids.to(_weight_of(lm_head).device))
        self.config.draft_vocab_size = len(ids)
        self.register_buffer("d2t", (ids - torch.arange(len(ids))).to(reference.device))
        self.lm_head = head.to(device=reference.device, dtype=reference.dtype) if head is not None else None

    def _draft_head_from(self, lm_head: nn.Module | torch.Tensor, ids: torch.Tensor) -> nn.Linear:
        """A frozen `nn.Linear` holding the rows `ids` of the target LM head `lm_head`."""
        weight = _weight_of(lm_head)
        hidden = self.config.hidden_size
        if weight.dim() != 2 or weight.shape[1] != hidden or weight.shape[0] < self.config.vocab_size:
            raise ValueError(
                f"lm_head must be the target's LM head, [vocab_size={self.config.vocab_size}, hidden_size={hidden}]; "
                f"got weight {tuple(weight.shape)}. Pass target.get_output_embeddings()."
            )
        if getattr(lm_head, "bias", None) is not None:
            raise ValueError(
                "The target's LM head has a bias, which the saved draft head cannot carry (vLLM's draft lm_head has "
                "none): draft among the whole vocabulary instead, drafter.set_draft_vocabulary(None)."
            )
        head = frozen_head(hidden, len(ids), device=weight.device, dtype=weight.dtype)
        with torch.no_grad():
            head.weight.copy_(plain_head_rows(weight, ids))
        return head


def frozen_head(hidden_size: int, rows: int, device=None, dtype=None) -> nn.Linear:
    """The draft LM head: `rows` rows of the target's LM head, copied, never trained (the target's head is frozen)."""
    head = nn.Linear(hidden_size, rows, bias=False, device=device, dtype=dtype)
    head.requires_grad_(False)
    return head


def _weight_of(lm_head: nn.Module | torch.Tensor) -> torch.Tensor:
    return lm_head if isinstance(lm_head, torch.Tensor) else lm_head.weight
