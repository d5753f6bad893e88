# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""Regeneration (hf_dflash.data.regenerate) on a tiny random Qwen3 target saved to a folder."""

import json
from pathlib import Path

import pytest
import torch
from conftest import save_tiny_target, write_prompts
from transformers import AutoTokenizer, Qwen3ForCausalLM

from hf_dflash.cli import main
from hf_dflash.data import (
    RegenerationArguments,
    load_training_samples,
    regenerate,
    response_token_ids,
    skipped_path,
)


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory) -> Path:
    return save_tiny_target(tmp_path_factory.mktemp("tiny-target"))


def test_response_cut_at_first_eos():
    assert response_token_ids([5, 6, 3, 0, 0], {3}) == ([5, 6, 3], True)
    assert response_token_ids([5, 6, 7], {3}) == ([5, 6, 7], False)


def test_regenerate_resumes_after_interruption(tmp_path, target_dir):
    prompts = write_prompts(tmp_path / "prompts.jsonl", count=20)
    output = tmp_path / "train.jsonl"
    common = ["regenerate", "--target", str(target_dir), "--prompts", str(prompts), "--output", str(output),
              "--max-new-tokens", "24", "--batch-size", "8", "--block-size", "8"]
    assert main(common + ["--limit", "7"]) == 0  # the "killed" run: only the first 7 prompts done
    first = output.read_text().splitlines()
    assert sorted(json.loads(line)["index"] for line in first) == list(range(7))
    with open(output, "a") as f:
        f.write('{"index": 7, "prompt_len')  # a write cut off by the kill
    assert main(common) == 0
    lines = output.read_text().splitlines()
    assert lines[:7] == first  # earlier work kept as is, not redone
    records = [json.loads(line) for line in lines]
    assert sorted(r["index"] for r in records) == list(range(20))  # each prompt exactly once

    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    record = records[0]
    prompt_ids = record["input_ids"][: record["prompt_length"]]
    assert tokenizer.decode(prompt_ids) == record["prompt"]
    assert record["prompt"].endswith("<|im_start|>assistant\nno think\n")  # thinking off by default
    assert len(record["input_ids"]) - record["prompt_length"] == 24
    # greedy and batched with left padding: the same tokens as one prompt generated alone
    target = Qwen3ForCausalLM.from_pretrained(target_dir)
    alone = target.generate(torch.tensor([prompt_ids]), max_new_tokens=24, do_sample=False)
    assert alone[0].tolist() == record["input_ids"]

    samples = load_training_samples(output, max_length=1000, min_response_tokens=16)
    assert len(samples) == 20 and int(samples[0]["loss_mask"].sum()) == 24
    # running again has nothing to do
    counts = regenerate(RegenerationArguments(target=str(target_dir), prompts=str(prompts), output=str(output),
                                              max_new_tokens=24, batch_size=8, block_size=8))
    assert counts == {"kept": 0, "skipped": 0, "already_done": 20, "total": 20}


def test_regenerate_drops_short_samples(tmp_path, target_dir):
    prompts = write_prompts(tmp_path / "prompts.jsonl", count=6)
    output = tmp_path / "short.jsonl"
    args = RegenerationArguments(target=str(target_dir), prompts=str(prompts), output=str(output),
                                 max_new_tokens=15, batch_size=4, block_size=8)  # 15 < 2 x 8
    assert regenerate(args)["skipped"] == 6
    assert output.read_text() == ""
    skipped = [json.loads(line) for line in skipped_path(output).read_text().splitlines()]
    assert [s["reason"] for s in skipped] == ["short"] * 6 and {s["index"] for s in skipped} == set(range(6))
    assert regenerate(args)["already_done"] == 6  # dropped prompts are not regenerated on resume
    with pytest.raises(ValueError, match="empty dataset after filtering"):
        load_training_samples(output, max_length=100, min_response_tokens=16)
    # the same output with other settings is another run
    with pytest.raises(ValueError, match="other settings.*max_new_tokens"):
        regenerate(RegenerationArguments(target=str(target_dir), prompts=str(prompts), output=str(output),
                                         max_new_tokens=64, block_size=8))
