# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""One prompt -> ids rule and left padding (hf_dflash.data.chat)."""


import torch
from conftest import make_char_tokenizer, make_chatml_tokenizer

from hf_dflash.data import chat_input_ids, left_padded_batch, prompt_text


def test_chat_template_and_enable_thinking():
    tokenizer = make_char_tokenizer()
    off = prompt_text(tokenizer, "hi", enable_thinking=False)
    on = prompt_text(tokenizer, "hi", enable_thinking=True)
    assert off == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nno think\n"
    assert on == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert prompt_text(tokenizer, "hi", use_chat_template=False) == "hi"


def test_chat_input_ids_apply_the_template():
    tokenizer = make_chatml_tokenizer()
    ids = chat_input_ids(tokenizer, "Hi")
    assert tokenizer.decode(ids[0]) == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    tokenizer.chat_template = None
    assert tokenizer.decode(chat_input_ids(tokenizer, "Hi")[0]) == "Hi"


def test_left_padded_batch_takes_lists_and_tensors():
    ids, mask = left_padded_batch([[5, 6, 7], torch.tensor([[8]])], pad_token_id=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]] and mask.tolist() == [[1, 1, 1], [0, 0, 1]]


def test_teacher_forced_record_is_the_served_prompt_then_the_existing_response():
    from hf_dflash.data import teacher_forced_record

    tokenizer = make_chatml_tokenizer()
    record = teacher_forced_record(tokenizer, "Hi", "Hello there")
    prompt = record["input_ids"][: record["prompt_length"]]
    assert prompt == chat_input_ids(tokenizer, "Hi")[0].tolist()  # the same rule as regeneration and serving
    response = record["input_ids"][record["prompt_length"]:]
    assert response[-1] == tokenizer.eos_token_id and tokenizer.decode(response[:-1]) == "Hello there"
