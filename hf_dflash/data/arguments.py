# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""The arguments of ``hf-dflash regenerate`` (:class:`RegenerationArguments`, the command's flags) and the cheap
checks that refuse bad ones before anything is loaded.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from transformers.utils import logging

logger = logging.get_logger(__name__)

REASONING_CHOICES = ("keep", "drop")


def json_object(text: str | dict | None) -> dict | None:
    """A JSON object given on the command line (or already a dict).

    Example:
        >>> json_object('{"enable_thinking": true}')
        {'enable_thinking': True}
    """
    value = json.loads(text) if isinstance(text, str) else text
    if value is not None and not isinstance(value, dict):
        raise ValueError(f"{text!r} is not a JSON object.")
    return value


@dataclass
class RegenerationArguments:
    """Arguments of :func:`regenerate` (the `hf-dflash regenerate` command)."""

    target: str = field(metadata={"help": "Target model: local folder or Hub id.", "required": True})
    prompts: str = field(metadata={"help": "Prompts: JSONL / JSON / Parquet file or a saved `datasets` folder.",
                                   "required": True})
    output: str = field(metadata={"help": "Output JSONL (appended to; resumable).", "required": True})
    max_new_tokens: int = field(default=1024, metadata={"help": "Longest response to generate."})
    batch_size: int = field(default=8, metadata={"help": "Prompts per generate() call (left padded)."})
    limit: int | None = field(default=None, metadata={"help": "Only the first N prompts of the file."})
    temperature: float = field(default=0.0, metadata={"help": "0 = greedy (default); > 0 samples."})
    top_p: float = field(default=1.0, metadata={"help": "Nucleus sampling when temperature > 0."})
    enable_thinking: bool = field(default=False, metadata={"help": "Pass enable_thinking=True to the chat template."})
    use_chat_template: bool = field(default=True, metadata={"help": "Tokenize prompts as plain text, without the "
                                                                    "tokenizer's chat template.",
                                                            "flag": "--no-chat-template"})
    system_prompt: str | None = field(default=None, metadata={"help": "System message for prompts without one."})
    block_size: int = field(default=16, metadata={"help": "Drafter block size: responses < 2*block_size are dropped."})
    min_response_tokens: int | None = field(default=None, metadata={"help": "Override 2*block_size."})
    max_prompt_length: int = field(default=2048, metadata={"help": "Skip prompts longer than this (tokens)."})
    seed: int = field(default=0, metadata={"help": "Sampling seed (reseeded per batch from its first prompt index)."})
    dtype: str = field(default="auto", metadata={"help": "Target dtype: auto (bf16 on GPU, fp32 on CPU) or a name."})
    chat_template_kwargs: dict | None = field(default=None, metadata={
        "help": "Further chat-template variables as a JSON object, e.g. '{\"reasoning_effort\": \"low\"}' (win over "
                "--enable-thinking; sent to servers as chat_template_kwargs).", "type": json_object})
    server: list[str] | None = field(default=None, metadata={
        "help": "Regenerate on these OpenAI-compatible servers (vLLM, SGLang, `transformers serve`; base URLs such as "
                "http://127.0.0.1:8000) instead of in-process; prompts are spread over them. --target then names the "
                "served model and its tokenizer (only the tokenizer is loaded).", "nargs": "+", "metavar": "URL"})
    server_model: str | None = field(default=None, metadata={
        "help": "With --server: the served model's name when it differs from --target (vLLM --served-model-name)."})
    concurrency: int = field(default=8, metadata={"help": "With --server: requests in flight per server."})
    retries: int = field(default=5, metadata={
        "help": "With --server: tries again after a connection error, timeout, 429 or 5xx this many times, waiting "
                "--retry-delay seconds, then twice as long each time."})
    retry_delay: float = field(default=1.0, metadata={"help": "With --server: first wait before a retry (seconds)."})
    request_timeout: float = field(default=600.0, metadata={"help": "With --server: seconds one request may take."})
    reasoning: str = field(default="keep", metadata={
        "help": "With --server: keep the reasoning the engine generated in the response, or drop it and keep the "
                "answer only (re-tokenized), when the engine's reasoning parser splits it off.",
        "choices": REASONING_CHOICES})

    def __post_init__(self) -> None:
        self.chat_template_kwargs = json_object(self.chat_template_kwargs)
        if isinstance(self.server, str):
            self.server = [self.server]

    @property
    def min_tokens(self) -> int:
        return self.min_response_tokens if self.min_response_tokens is not None else 2 * self.block_size

    def run_settings(self) -> dict[str, Any]:
        """Settings a resumed run must share with the run that wrote the output."""
        keys = ("target", "prompts", "max_new_tokens", "temperature", "top_p", "enable_thinking", "use_chat_template",
                "system_prompt", "min_tokens", "max_prompt_length", "seed")
        settings = {k: getattr(self, k) for k in keys}
        for k in ("target", "prompts"):
            settings[k] = _normalised_path(settings[k])
        # settings that came later enter only when set: outputs written before them still resume
        for k, default in (("chat_template_kwargs", None), ("reasoning", "keep")):
            if getattr(self, k) != default:
                settings[k] = getattr(self, k)
        return settings

    def template_kwargs(self) -> dict[str, Any]:
        """The chat-template variables of every prompt (in-process and sent to servers)."""
        return {"enable_thinking": self.enable_thinking} | (self.chat_template_kwargs or {})


def _normalised_path(name: str) -> str:
    return os.path.abspath(name) if os.path.exists(name) else name


def validate_regeneration_arguments(args: RegenerationArguments) -> None:
    """Cheap checks that raise a ValueError naming the problem before anything is loaded."""
    if args.block_size < 2:
        raise ValueError(f"block_size={args.block_size}: a DFlash block needs at least 2 tokens (16 is typical).")
    if args.batch_size < 1 or args.max_new_tokens < 1:
        raise ValueError(f"batch_size={args.batch_size} and max_new_tokens={args.max_new_tokens} must be >= 1.")
    if args.max_new_tokens < args.min_tokens:
        logger.warning(f"max_new_tokens={args.max_new_tokens} < {args.min_tokens} kept minimum: every sample drops.")
    if args.temperature < 0:
        raise ValueError(f"temperature={args.temperature} must be >= 0 (0 = greedy).")
    if args.reasoning not in REASONING_CHOICES:
        raise ValueError(f"reasoning={args.reasoning!r}: choose one of {REASONING_CHOICES}.")
    if args.server:
        if not args.use_chat_template:
            raise ValueError("--no-chat-template with --server: a chat-completions server always applies the chat "
                             "template; regenerate in-process (without --server) for plain-text prompts.")
        if args.concurrency < 1 or args.retries < 0:
            raise ValueError(f"concurrency={args.concurrency} must be >= 1 and retries={args.retries} >= 0.")
    elif args.reasoning != "keep":
        raise ValueError("--reasoning drop needs --server: an engine's reasoning parser is what splits the reasoning "
                         "off the answer.")
