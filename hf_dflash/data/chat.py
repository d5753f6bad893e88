# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""From a prompt to the token ids the target sees: ONE rule, used by regeneration, training, evaluation, the demo
and the benchmark, so the drafter is trained and measured on the inputs it will serve.

The rule: the tokenizer's chat template with a generation prompt when it has one (``enable_thinking=False`` for
Qwen3-style templates; others ignore it), tokenized without extra special tokens; else the raw text with them.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedTokenizerBase

from .records import Prompt


def prompt_text(tokenizer, prompt: Prompt, use_chat_template: bool = True, enable_thinking: bool | None = False,
                system_prompt: str | None = None, template_kwargs: dict | None = None) -> str:
    """The text the target sees: chat template with a generation prompt when the tokenizer has one, else raw text.

    `enable_thinking` is handed to the template (Qwen3-style templates read it; others ignore it); None omits it.
    `template_kwargs` are further template variables (they win over `enable_thinking`), as an engine's
    ``chat_template_kwargs`` are.

    Example:
        >>> prompt_text(tokenizer, "Hi")  # doctest: +SKIP
        '<|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n'
    """
    has_template = use_chat_template and getattr(tokenizer, "chat_template", None)
    if not has_template:
        if isinstance(prompt, list):
            return "\n\n".join(m["content"] for m in prompt)
        return prompt
    variables = ({} if enable_thinking is None else {"enable_thinking": enable_thinking}) | (template_kwargs or {})
    return tokenizer.apply_chat_template(chat_messages(prompt, system_prompt), tokenize=False,
                                         add_generation_prompt=True, **variables)


def chat_messages(prompt: Prompt, system_prompt: str | None = None) -> list[dict[str, str]]:
    """The chat turns of a prompt: a string becomes one user turn; `system_prompt` leads when none is there.

    Example:
        >>> chat_messages("Hi", system_prompt="Be brief.")
        [{'role': 'system', 'content': 'Be brief.'}, {'role': 'user', 'content': 'Hi'}]
    """
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    if system_prompt and not any(m["role"] == "system" for m in messages):
        messages = [{"role": "system", "content": system_prompt}] + messages
    return messages


def prompt_token_ids(tokenizer, text: str, use_chat_template: bool = True) -> list[int]:
    """Token ids of a prompt text; special tokens come from the template itself when one was applied."""
    add_special = not (use_chat_template and getattr(tokenizer, "chat_template", None))
    return tokenizer(text, add_special_tokens=add_special)["input_ids"]


def chat_input_ids(tokenizer: PreTrainedTokenizerBase, prompt: Prompt, device: torch.device | str = "cpu",
                   **template_options) -> torch.Tensor:
    """``[1, n]`` input ids of ``prompt`` as the target sees it: :func:`prompt_text` then :func:`prompt_token_ids`.

    Example:
        >>> ids = chat_input_ids(tokenizer, "What is the capital of France?")  # doctest: +SKIP
        >>> tokenizer.decode(ids[0])  # doctest: +SKIP
        '<|im_start|>system\\n...<|im_start|>user\\nWhat is the capital of France?<|im_end|>\\n<|im_start|>assistant\\n'
    """
    use_chat_template = template_options.get("use_chat_template", True)
    text = prompt_text(tokenizer, prompt, **template_options)
    return torch.tensor([prompt_token_ids(tokenizer, text, use_chat_template)], device=device)


def teacher_forced_record(tokenizer: PreTrainedTokenizerBase, prompt: Prompt, response: str,
                          **template_options) -> dict[str, list[int] | int]:
    """A training record of an EXISTING response, no generation: ``{"input_ids", "prompt_length"}`` with the prompt
    as the target sees it (:func:`chat_input_ids`), then the response's tokens and the end-of-turn token.

    The response only supplies contexts: train on such records with ``hf-dflash train --distill-weight 1`` so every
    label is the target's own next-token distribution at that context (teacher forcing on cheap data; a
    regenerated response costs a generation, this costs one target forward in training).

    Example:
        >>> record = teacher_forced_record(tokenizer, "Name a colour.", "Blue.")  # doctest: +SKIP
        >>> tokenizer.decode(record["input_ids"][record["prompt_length"]:])  # doctest: +SKIP
        'Blue.<|im_end|>'
    """
    prompt_ids = chat_input_ids(tokenizer, prompt, **template_options)[0].tolist()
    response_ids = tokenizer(response, add_special_tokens=False)["input_ids"]
    end = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    return {"input_ids": prompt_ids + response_ids + end, "prompt_length": len(prompt_ids)}


def left_padded_batch(sequences: list[list[int] | torch.Tensor], pad_token_id: int,
                      device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """input_ids and attention_mask [b, longest], padded on the left (what decoder-only ``generate`` expects).

    Sequences are token-id lists or tensors ([n] or [1, n]); the result lands on ``device`` (default: the first
    tensor's device, else CPU).

    Example:
        >>> ids, mask = left_padded_batch([[5, 6, 7], [8]], pad_token_id=0)
        >>> ids.tolist(), mask.tolist()
        ([[5, 6, 7], [0, 0, 8]], [[1, 1, 1], [0, 0, 1]])
    """
    rows = [torch.as_tensor(s, dtype=torch.long).reshape(-1) for s in sequences]
    if device is None:
        device = sequences[0].device if isinstance(sequences[0], torch.Tensor) else "cpu"
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for row, sequence in enumerate(rows):
        ids[row, width - len(sequence) :] = sequence.cpu()
        mask[row, width - len(sequence) :] = 1
    return ids.to(device), mask.to(device)
