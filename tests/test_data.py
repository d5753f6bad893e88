# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""Regeneration and dataset loading (hf_dflash.data), on a tiny random Qwen3 target saved to a folder."""

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

from hf_dflash.cli import main
from hf_dflash.data import (
    RegenerationArguments,
    load_prompts,
    load_training_samples,
    prompt_from_record,
    prompt_text,
    read_records,
    regenerate,
    response_token_ids,
    skipped_path,
)


# ----------------------------------------------------------------------------------------------------------------------
# tiny target + tokenizer (also used by test_training.py)
CHARS = "abcdefghijklmnopqrstuvwxyz0123456789 .,?!'\n:"
SPECIALS = ["<pad>", "<unk>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}no think\n{% endif %}{% endif %}"
)
WORDS = ["apple", "river", "stone", "cloud", "tiger", "piano", "lemon", "storm", "maple", "orbit", "candle", "zebra"]


def make_tiny_tokenizer() -> PreTrainedTokenizerFast:
    """Character-level tokenizer with a Qwen-like chat template that reads `enable_thinking`."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    vocab = {token: i for i, token in enumerate(SPECIALS + list(CHARS))}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens(SPECIALS)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", pad_token="<pad>",
                                        eos_token="<|im_end|>")
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def make_tiny_target(seed: int = 0) -> Qwen3ForCausalLM:
    """Random 4-layer Qwen3 (hidden 64, vocab 64) that never emits EOS, so responses run to max_new_tokens."""
    torch.manual_seed(seed)
    config = Qwen3Config(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
                         eos_token_id=SPECIALS.index("<|im_end|>"), pad_token_id=0, bos_token_id=None,
                         tie_word_embeddings=False)
    model = Qwen3ForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight[config.eos_token_id] = 0.0
        model.lm_head.weight[0] = 0.0  # nor padding
    model.generation_config.eos_token_id = config.eos_token_id
    model.generation_config.pad_token_id = 0
    return model


def save_tiny_target(folder: Path, seed: int = 0) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    make_tiny_target(seed).save_pretrained(folder)
    make_tiny_tokenizer().save_pretrained(folder)
    return folder


def write_prompts(path: Path, count: int = 24) -> Path:
    """Prompts in the three layouts regeneration reads: chat messages, ShareGPT and plain fields."""
    lines = []
    for i in range(count):
        text = f"tell me about the {WORDS[i % len(WORDS)]} number {i}, please."
        if i % 3 == 0:
            lines.append({"messages": [{"role": "user", "content": text}]})
        elif i % 3 == 1:
            lines.append({"conversations": [{"from": "human", "value": text}, {"from": "gpt", "value": "ok"}]})
        else:
            lines.append({"question": text})
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory) -> Path:
    return save_tiny_target(tmp_path_factory.mktemp("tiny-target"))


# ----------------------------------------------------------------------------------------------------------------------
# prompts
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


def test_dataset_without_prompt_field_is_rejected(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"answer": "4", "id": 1}\n{"answer": "5", "id": 2}\n')
    with pytest.raises(ValueError, match=r"no usable prompt field.*\['answer', 'id'\]"):
        load_prompts(path)
    # ... and the command fails the same way before loading any model
    with pytest.raises(ValueError, match="no usable prompt field"):
        main(["regenerate", "--target", "no/such-model", "--prompts", str(path), "--output", str(tmp_path / "o")])


def test_read_records_formats(tmp_path):
    array = tmp_path / "cut.json"
    array.write_text('[{"prompt": "a"}, {"prompt": "b"}, {"prompt": "c", "x": [1, 2')  # truncated mid-element
    assert [r["prompt"] for r in read_records(array)] == ["a", "b"]
    lines = tmp_path / "p.jsonl"
    lines.write_text('{"prompt": "a"}\n\n{"prompt": "b"}\n')
    assert len(read_records(lines)) == 2
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        return
    pq.write_table(pa.Table.from_pylist([{"question": "q1"}, {"question": "q2"}]), tmp_path / "p.parquet")
    assert load_prompts(tmp_path / "p.parquet") == [(0, "q1"), (1, "q2")]


def test_chat_template_and_enable_thinking():
    tokenizer = make_tiny_tokenizer()
    off = prompt_text(tokenizer, "hi", enable_thinking=False)
    on = prompt_text(tokenizer, "hi", enable_thinking=True)
    assert off == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nno think\n"
    assert on == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert prompt_text(tokenizer, "hi", use_chat_template=False) == "hi"


def test_response_cut_at_first_eos():
    assert response_token_ids([5, 6, 3, 0, 0], {3}) == ([5, 6, 3], True)
    assert response_token_ids([5, 6, 7], {3}) == ([5, 6, 7], False)


# ----------------------------------------------------------------------------------------------------------------------
# regeneration
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
