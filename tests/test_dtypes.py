"""A drafter next to a target of another dtype or quantization.

A drafter in another dtype than its target drafts in its own (it reads the target's embeddings and features cast to
its dtype, and its states are cast back for the target's LM head), so the output is the target's own. A quantized
drafter is served (output stays exact) with one warning that gives the reason."""

import copy
import logging

import pytest
import torch
from conftest import assert_same, make_drafter, make_prompt, make_target, plain_generate

from hf_dflash import features_dflash
from hf_dflash.diagnostics_dflash import low_acceptance_causes

NEW_TOKENS = 24


@pytest.fixture(scope="module")
def target():
    return make_target("qwen3", num_hidden_layers=6, initializer_range=0.1)


def warnings_logged(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith("hf_dflash") and r.levelno == logging.WARNING]


@pytest.mark.parametrize("drafter_dtype", [torch.bfloat16, torch.float64])
def test_a_drafter_in_another_dtype_than_its_fp32_target_gives_the_targets_output(target, drafter_dtype):
    """A bf16 drafter (narrower) and an fp64 one (wider) next to an fp32 target: each drafts (no dtype mismatch in
    its `fc` or in the target's LM head) and the output is the target's own greedy output."""
    drafter = make_drafter(target).to(drafter_dtype)
    for seed in range(2):
        prompt = make_prompt(10, seed=seed)
        expected = plain_generate(target, prompt, max_new_tokens=NEW_TOKENS)
        got = target.generate(prompt, assistant_model=drafter, max_new_tokens=NEW_TOKENS, do_sample=False)
        assert_same(got, expected, f"{drafter_dtype} drafter: ", target)
        assert drafter.last_stats.drafted_verifications > 0  # the drafter ran
    assert next(drafter.parameters()).dtype == drafter_dtype  # it is not cast: it drafts in its own dtype


def test_an_fp32_drafter_next_to_a_bf16_target_drafts_in_fp32(monkeypatch):
    """The fp32-trained drafter next to a bf16 target reads the target's bf16 features in fp32, its own dtype (the
    output is not compared: in bf16 a block verify may break a near-tie otherwise than plain decoding, see
    docs/generation.md)."""
    target = make_target("qwen3", num_hidden_layers=6, initializer_range=0.1).to(torch.bfloat16)
    drafter = make_drafter(make_target("qwen3", num_hidden_layers=6, initializer_range=0.1))
    received, fuse = [], features_dflash.fuse_layer

    def spy(*args):  # the prompt's context is fused by the feature writer, each cycle's when the drafter reads it
        result = fuse(*args)
        return received.append(result.dtype) or result

    monkeypatch.setattr(features_dflash, "fuse_layer", spy)
    target.generate(make_prompt(10), assistant_model=drafter, max_new_tokens=NEW_TOKENS, do_sample=False)
    assert len(received) > len(drafter.config.target_layer_ids), "only the prompt's context was fused"
    assert set(received) == {torch.float32}
    assert drafter.last_stats.drafted_verifications > 0


def test_a_quantized_drafter_is_warned_about_once_with_the_reason(target, caplog):
    """torch's dynamic int8 quantization of the drafter's linear layers: the drafter still drafts and the output is
    the target's own, and ONE warning (not one per call) says why it is a bad idea and what to do."""
    with pytest.warns(Warning):  # torch.ao's deprecation
        drafter = torch.ao.quantization.quantize_dynamic(make_drafter(target), {torch.nn.Linear}, dtype=torch.qint8)
    with caplog.at_level(logging.WARNING, logger="hf_dflash"):
        for seed in range(2):
            prompt = make_prompt(10, seed=seed)
            expected = plain_generate(target, prompt, max_new_tokens=NEW_TOKENS)
            got = target.generate(prompt, assistant_model=drafter, max_new_tokens=NEW_TOKENS, do_sample=False)
            assert_same(got, expected, "quantized drafter: ", target)
    logged = warnings_logged(caplog)
    assert len(logged) == 1, logged
    assert "drafter DFlashDraftModel is quantized" in logged[0] and "Output stays exact" in logged[0]
    assert "loses accepted drafts" in logged[0] and "Load the drafter unquantized" in logged[0]


def test_an_unquantized_drafter_in_any_dtype_is_not_warned_about(target, caplog):
    with caplog.at_level(logging.WARNING, logger="hf_dflash"):
        for dtype in (torch.float32, torch.bfloat16):
            drafter = make_drafter(target).to(dtype)
            target.generate(make_prompt(10), assistant_model=drafter, max_new_tokens=8, do_sample=False)
    assert warnings_logged(caplog) == []


def test_a_torchao_int8_drafter_is_warned_about(target, caplog):
    """int8 weight-only through torchao (tensor-subclass weights, as transformers' TorchAoConfig makes them)."""
    torchao = pytest.importorskip("torchao.quantization")
    drafter = make_drafter(target)
    torchao.quantize_(drafter, torchao.Int8WeightOnlyConfig())
    prompt = make_prompt(10)
    with caplog.at_level(logging.WARNING, logger="hf_dflash"):
        got = target.generate(prompt, assistant_model=drafter, max_new_tokens=NEW_TOKENS, do_sample=False)
    assert_same(got, plain_generate(target, prompt, max_new_tokens=NEW_TOKENS), "torchao int8 drafter: ", target)
    assert len(warnings_logged(caplog)) == 1 and "is quantized" in warnings_logged(caplog)[0]


@pytest.mark.parametrize("draft_vocabulary", [False, True])
def test_a_torchao_int8_target_gives_its_own_output_with_an_fp32_drafter(target, draft_vocabulary):
    """A target whose linear layers (LM head included) have int8 weights through torchao, activations in fp32: the
    drafter reads its features and the int8 LM head scores the drafter's states, also through a draft vocabulary
    (whose rows are gathered from the head and dequantized: torchao's int8 tensor has no transpose), and the output
    is that quantized target's own greedy output."""
    torchao = pytest.importorskip("torchao.quantization")
    quantized = copy.deepcopy(target)
    torchao.quantize_(quantized, torchao.Int8WeightOnlyConfig())
    assert type(quantized.lm_head.weight).__module__.startswith("torchao")  # int8 weights
    drafter = make_drafter(target)
    if draft_vocabulary:
        drafter.set_draft_vocabulary(list(range(0, 96, 2)), lm_head=quantized.get_output_embeddings())
    for seed in range(2):
        prompt = make_prompt(10, seed=seed)
        expected = plain_generate(quantized, prompt, max_new_tokens=NEW_TOKENS)
        got = quantized.generate(prompt, assistant_model=drafter, max_new_tokens=NEW_TOKENS, do_sample=False)
        assert_same(got, expected, "int8 target: ", quantized)
        assert drafter.last_stats.drafted_verifications > 0
    assert low_acceptance_causes(quantized, drafter) == []  # its head rows are the int8 head's, dequantized
