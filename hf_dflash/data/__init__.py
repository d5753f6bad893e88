# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""Training data for DFlash drafters: reading records, turning prompts into target inputs, and regenerating the
target's own responses.

- :mod:`hf_dflash.data.records`: JSON / JSONL / Parquet / ``datasets`` readers, prompts and training samples;
- :mod:`hf_dflash.data.chat`: the one rule that turns a prompt into the token ids the target sees, and left padding;
- :mod:`hf_dflash.data.regenerate`: ``hf-dflash regenerate`` (resumable), in-process or on servers;
- :mod:`hf_dflash.data.arguments`: its arguments and their checks;
- :mod:`hf_dflash.data.resume`: its output's sidecars, the prompts already done, the same-settings check;
- :mod:`hf_dflash.data.serving`: the OpenAI-compatible chat-completions client regeneration on servers uses.
"""

from .chat import chat_input_ids, left_padded_batch, prompt_text, prompt_token_ids, teacher_forced_record
from .records import (
    Prompt,
    iter_records,
    load_prompts,
    load_training_samples,
    loss_mask_from_record,
    prompt_from_record,
    read_records,
)
from .arguments import RegenerationArguments
from .regenerate import regenerate, response_token_ids
from .resume import skipped_path

__all__ = [
    "Prompt",
    "RegenerationArguments",
    "chat_input_ids",
    "iter_records",
    "left_padded_batch",
    "load_prompts",
    "load_training_samples",
    "loss_mask_from_record",
    "prompt_from_record",
    "prompt_text",
    "prompt_token_ids",
    "read_records",
    "regenerate",
    "response_token_ids",
    "skipped_path",
    "teacher_forced_record",
]
