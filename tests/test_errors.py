# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""Bad input raises a ValueError that names both values and the fix, before any forward pass."""

import json
import re

import pytest
import torch
from conftest import VOCAB, count_forwards, make_drafter, make_prompt, make_target
from transformers import DynamicCache

import hf_dflash


@pytest.fixture(scope="module")
def setup():
    target = make_target("qwen3", seed=0)  # 4 layers, hidden 64, vocab 96
    return target, make_prompt(6, seed=1)


def assert_rejected_before_forward(target, drafter, call, *fragments):
    """`call()` raises ValueError mentioning every fragment, and neither model ran a forward."""
    with count_forwards(target, drafter) as counts:
        with pytest.raises(ValueError) as info:
            call()
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    assert counts == [0, 0], f"forward calls before the error (target, drafter): {counts}"
    return message


def test_hidden_size_mismatch(setup):
    target, prompt = setup
    other = make_target("qwen3", hidden_size=32, num_attention_heads=2, num_key_value_heads=1, seed=2)
    drafter = make_drafter(other, 8)
    assert_rejected_before_forward(
        target, drafter, lambda: target.generate(prompt, assistant_model=drafter, max_new_tokens=5),
        "hidden_size=32", "hidden_size=64", "from_target",
    )


def test_vocab_size_mismatch(setup):
    target, prompt = setup
    other = make_target("qwen3", vocab_size=80, seed=2)
    drafter = make_drafter(other, 8, mask_token_id=79)
    assert_rejected_before_forward(
        target, drafter, lambda: target.generate(prompt, assistant_model=drafter, max_new_tokens=5),
        "vocab_size=80", f"vocab_size={VOCAB}", "tokenizer",
    )


def test_target_layer_ids_outside_depth(setup):
    target, prompt = setup
    drafter = make_drafter(target, 8)
    drafter.config.target_layer_ids = [1, 4]
    message = assert_rejected_before_forward(
        target, drafter, lambda: target.generate(prompt, assistant_model=drafter, max_new_tokens=5),
        "target_layer_ids=[1, 4]", "4 layers", "0..3",
    )
    assert "rebuild it with valid target_layer_ids" in message
    drafter.config.target_layer_ids = [-1]
    assert_rejected_before_forward(
        target, drafter, lambda: target.generate(prompt, assistant_model=drafter, max_new_tokens=5),
        "target_layer_ids=[-1]",
    )
    with pytest.raises(ValueError, match=re.escape("target_layer_ids=[0, 9]")):
        hf_dflash.DFlashDraftModel.from_target(target, target_layer_ids=[0, 9])


def test_num_target_layers_mismatch(setup):
    target, prompt = setup
    drafter = make_drafter(target, 8)
    drafter.config.num_target_layers = 36
    assert_rejected_before_forward(
        target, drafter, lambda: target.generate(prompt, assistant_model=drafter, max_new_tokens=5),
        "num_target_layers=36", "4 layers", "from_target",
    )


def test_mask_token_outside_embedding_table(setup):
    target, prompt = setup
    drafter = make_drafter(target, 8)
    drafter.config.mask_token_id = VOCAB + 3
    assert_rejected_before_forward(
        target, drafter, lambda: target.generate(prompt, assistant_model=drafter, max_new_tokens=5),
        f"mask_token_id={VOCAB + 3}", f"0..{VOCAB - 1}", "config.mask_token_id",
    )
    with pytest.raises(ValueError, match=f"mask_token_id={VOCAB}"):
        hf_dflash.DFlashDraftModel.from_target(target, mask_token_id=VOCAB)


def test_block_size_too_small(setup):
    target, prompt = setup
    drafter = make_drafter(target, 8)
    drafter.config.block_size = 1
    assert_rejected_before_forward(
        target, drafter, lambda: target.generate(prompt, assistant_model=drafter, max_new_tokens=5),
        "block_size=1", "block_size >= 2",
    )
    with pytest.raises(ValueError, match="block_size=1"):
        hf_dflash.DFlashDraftModel.from_target(target, block_size=1)


def test_batch_above_one_with_per_token_outputs(setup):
    """Batches return sequences only; per-token outputs and per-row processor state need batch size 1."""
    target, _ = setup
    drafter = make_drafter(target, 8)
    batch = make_prompt(6, seed=3).expand(2, -1).clone()
    for flag in ("output_scores", "output_logits", "output_hidden_states"):
        call = lambda: target.generate(  # noqa: E731
            batch, assistant_model=drafter, max_new_tokens=5, return_dict_in_generate=True, **{flag: True}
        )
        assert_rejected_before_forward(target, drafter, call, "Batch size 2", "batch size 1", "one prompt at a time")
    call = lambda: target.generate(  # noqa: E731
        batch, assistant_model=drafter, max_new_tokens=5, prefix_allowed_tokens_fn=lambda b, ids: [1, 2]
    )
    assert_rejected_before_forward(target, drafter, call, "prefix_allowed_tokens_fn", "batch size 2")


def test_num_beams_above_one(setup):
    target, prompt = setup
    drafter = make_drafter(target, 8)
    assert_rejected_before_forward(
        target, drafter, lambda: target.generate(prompt, assistant_model=drafter, num_beams=3, max_new_tokens=5),
        "num_beams=3", "num_beams=1",
    )


def test_num_return_sequences_above_one(setup):
    target, prompt = setup
    drafter = make_drafter(target, 8)
    assert_rejected_before_forward(
        target,
        drafter,
        lambda: target.generate(prompt, assistant_model=drafter, num_return_sequences=2, do_sample=True),
        "num_return_sequences=2", "num_return_sequences=1", "once per sequence",
    )
    # greedy: transformers' own config validation answers first (as it does without a drafter), also before forwards
    assert_rejected_before_forward(
        target,
        drafter,
        lambda: target.generate(prompt, assistant_model=drafter, num_return_sequences=2, do_sample=False),
        "num_return_sequences", "different than 1 (got 2)",
    )


def test_inputs_embeds(setup):
    target, prompt = setup
    drafter = make_drafter(target, 8)
    embeds = target.get_input_embeddings()(prompt)
    assert_rejected_before_forward(
        target, drafter, lambda: target.generate(inputs_embeds=embeds, assistant_model=drafter, max_new_tokens=5),
        "inputs_embeds", "input_ids",
    )


def test_right_padding(setup):
    target, prompt = setup
    drafter = make_drafter(target, 8)
    mask = torch.ones_like(prompt)
    mask[0, -2:] = 0
    assert_rejected_before_forward(
        target, drafter,
        lambda: target.generate(prompt, attention_mask=mask, assistant_model=drafter, max_new_tokens=5),
        "attention_mask", "left",
    )


def test_prefilled_cache(setup):
    target, prompt = setup
    drafter = make_drafter(target, 8)
    cache = DynamicCache(config=target.config)
    with torch.no_grad():
        target(prompt[:, :3], past_key_values=cache, use_cache=True)
    assert_rejected_before_forward(
        target, drafter,
        lambda: target.generate(prompt, past_key_values=cache, assistant_model=drafter, max_new_tokens=5),
        "past_key_values", "full prompt",
    )


def test_errors_leave_routing_usable(setup):
    """After a rejected call, a correct call on the same models works."""
    target, prompt = setup
    drafter = make_drafter(target, 8)
    with pytest.raises(ValueError):
        target.generate(prompt, assistant_model=drafter, num_beams=2, max_new_tokens=5)
    expected = target.generate(prompt, max_new_tokens=9, do_sample=False)
    assert target.generate(prompt, assistant_model=drafter, max_new_tokens=9).tolist() == expected.tolist()


# ----------------------------------------------------------------------------------------------------------------------
# loading
def _write_config(folder, **changes):
    target = make_target("qwen3", seed=0)
    drafter = make_drafter(target, 8)
    config = drafter.config.to_dict()
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return folder


def test_from_pretrained_rejects_other_architectures(tmp_path):
    folder = _write_config(tmp_path, architectures=["DFlash3DraftModel"])  # DFlash2 loads (tests/test_dflash2.py)
    with pytest.raises(ValueError) as info:
        hf_dflash.DFlashDraftModel.from_pretrained(folder)
    message = str(info.value)
    assert "DFlash3DraftModel" in message and "DFlashDraftModel" in message and "QwenDFlareDraftModel" in message
    assert "DFlash2DraftModel" in message
    assert "convert" in message or "code published" in message


def test_from_pretrained_rejects_config_without_dflash_fields(tmp_path):
    config = make_target("qwen3", seed=0).config.to_dict()
    config["architectures"] = ["DFlashDraftModel"]
    (tmp_path / "config.json").write_text(json.dumps(config), encoding="utf-8")
    with pytest.raises(ValueError, match="target_layer_ids") as info:
        hf_dflash.DFlashDraftModel.from_pretrained(tmp_path)
    assert "from_target" in str(info.value)


def test_from_pretrained_round_trip(tmp_path, qwen3_target):
    """The happy path next to the errors: a saved drafter loads and generates the same tokens."""
    drafter = make_drafter(qwen3_target, 8)
    drafter.save_pretrained(tmp_path)
    loaded = hf_dflash.DFlashDraftModel.from_pretrained(tmp_path).eval()
    prompt = make_prompt(6, seed=4)
    expected = qwen3_target.generate(prompt, max_new_tokens=12, do_sample=False)
    assert qwen3_target.generate(prompt, assistant_model=loaded, max_new_tokens=12).tolist() == expected.tolist()
    for name, tensor in drafter.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name], tensor)


@pytest.mark.parametrize("settings, named", [
    (dict(num_assistant_tokens=0), "num_assistant_tokens=0"),
    (dict(num_assistant_tokens=2.5), "num_assistant_tokens=2.5"),
    (dict(num_assistant_tokens_schedule="exponential"), "num_assistant_tokens_schedule='exponential'"),
])
def test_bad_draft_length_settings(setup, settings, named):
    target, prompt = setup
    drafter = make_drafter(target, 8)
    assert_rejected_before_forward(
        target, drafter, lambda: target.generate(prompt, assistant_model=drafter, max_new_tokens=5, **settings),
        named, "int >= 1" if "num_assistant_tokens" in settings else "heuristic",
    )
