# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""Reading records, prompts and training samples (hf_dflash.data.records)."""

import json

import pytest
from conftest import write_prompts

from hf_dflash.cli import main
from hf_dflash.data import (
    load_prompts,
    load_training_samples,
    prompt_from_record,
    read_records,
)


def test_prompt_fields():
    assert prompt_from_record({"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"},
                                            {"role": "assistant", "content": "A"}]}) == [
        {"role": "system", "content": "S"}, {"role": "user", "content": "Q"}]
    assert prompt_from_record({"conversations": [{"from": "human", "value": "Hi"}]}) == [
        {"role": "user", "content": "Hi"}]
    assert prompt_from_record({"prompt": "P"}) == "P"
    assert prompt_from_record({"question": "Q", "answer": "A"}) == "Q"
    assert prompt_from_record({"instruction": "Do", "input": "this"}) == "Do\n\nthis"
    assert prompt_from_record({"turns": ["first", "second"]}) == "first"
    assert prompt_from_record({"answer": "A"}) is None
    assert prompt_from_record({"conversations": [{"from": "gpt", "value": "no user"}]}) is None


def test_a_multi_turn_prompt_is_kept_whole_for_the_target_to_answer_its_last_turn():
    """A `prompt` conversation ending on a user turn (the training builder's multi-turn continuations) is the
    context the target answers; a full `messages` conversation still yields its first exchange only."""
    turns = [{"role": "system", "content": "S"}, {"from": "human", "value": "Q1"}, {"from": "gpt", "value": "A1"},
             {"role": "user", "content": "Q2"}]
    assert prompt_from_record({"prompt": turns}) == [
        {"role": "system", "content": "S"}, {"role": "user", "content": "Q1"}, {"role": "assistant", "content": "A1"},
        {"role": "user", "content": "Q2"}]
    assert prompt_from_record({"prompt": turns[:3]}) == turns[:1] + [{"role": "user", "content": "Q1"}]  # no question
    assert prompt_from_record({"messages": turns}) == turns[:1] + [{"role": "user", "content": "Q1"}]


def test_dataset_without_prompt_field_is_rejected(tmp_path, capsys):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"answer": "4", "id": 1}\n{"answer": "5", "id": 2}\n')
    with pytest.raises(ValueError, match=r"no usable prompt field.*\['answer', 'id'\]"):
        load_prompts(path)
    # ... and the command fails the same way before loading any model
    code = main(["regenerate", "--target", "no/such-model", "--prompts", str(path), "--output", str(tmp_path / "o")])
    error = capsys.readouterr().err
    assert code == 2 and "no usable prompt field" in error and "Traceback" not in error
    assert not (tmp_path / "o").exists() and not (tmp_path / "o.meta.json").exists()


def test_read_records_formats(tmp_path):
    array = tmp_path / "cut.json"
    array.write_text('[{"prompt": "a"}, {"prompt": "b"}, {"prompt": "c", "x": [1, 2')  # truncated mid-element
    assert [r["prompt"] for r in read_records(array)] == ["a", "b"]
    lines = tmp_path / "p.jsonl"
    lines.write_text('{"prompt": "a"}\n\n{"prompt": "b"}\n')
    assert len(read_records(lines)) == 2

def test_read_parquet(tmp_path):
    pa = pytest.importorskip("pyarrow")  # a dev dependency: skipped (visibly) only outside `pip install -e .[dev]`
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist([{"question": "q1"}, {"question": "q2"}]), tmp_path / "p.parquet")
    assert load_prompts(tmp_path / "p.parquet") == [(0, "q1"), (1, "q2")]


def test_training_samples_need_token_ids(tmp_path):
    path = write_prompts(tmp_path / "prompts.jsonl", count=3)
    with pytest.raises(ValueError, match="run `hf-dflash regenerate` first"):
        load_training_samples(path, max_length=100, min_response_tokens=4)
    path = tmp_path / "ids.jsonl"
    path.write_text(json.dumps({"input_ids": list(range(12)), "loss_mask": [0] * 4 + [1] * 8}) + "\n"
                    + json.dumps({"prompt_ids": [1, 2], "response_ids": list(range(3, 13))}) + "\n")
    samples = load_training_samples(path, max_length=10, min_response_tokens=4)
    assert [len(s["input_ids"]) for s in samples] == [10, 10]
    assert samples[0]["loss_mask"].tolist() == [False] * 4 + [True] * 6
