"""DFlare variant: layer-wise feature fusion and split context K/V, each alone or together."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from safetensors.torch import load_file
from conftest import assert_lossless, make_target

from hf_dflash import DFlashConfig, DFlashDraftModel

VARIANTS = {
    "dflare": dict(layer_fusion=True, split_context_kv=True),
    "fusion-only": dict(layer_fusion=True, split_context_kv=False),
    "split-kv-only": dict(layer_fusion=False, split_context_kv=True),
}


@pytest.fixture(scope="module")
def target():
    return make_target("llama", num_hidden_layers=9, max_position_embeddings=256, initializer_range=0.02)


def make_drafter(target, **switches):
    torch.manual_seed(1)
    ids = [1, 2, 3, 4, 5]  # T = 5 features for L = 3 layers: T need not equal L
    return DFlashDraftModel.from_target(target, num_hidden_layers=3, block_size=8, target_layer_ids=ids, **switches)


def test_fusion_weights_start_focused_on_evenly_spread_features(target):
    drafter = make_drafter(target, layer_fusion=True)
    weights = drafter.layer_fusion_weights.detach()
    assert weights.shape == (3, 5)
    assert weights.argmax(dim=1).tolist() == [0, 1, 3]  # floor(d / L * T)
    assert weights.max(dim=1).values.tolist() == [2.0, 2.0, 2.0] and weights.sum().item() == 6.0


@pytest.mark.parametrize("variant", VARIANTS)
def test_variant_round_trips_in_angelslim_layout(target, tmp_path, variant):
    drafter = make_drafter(target, **VARIANTS[variant])
    drafter.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == ["QwenDFlareDraftModel"]
    assert config["dflash_config"]["target_layer_ids"] == [1, 2, 3, 4, 5]
    names = set(load_file(tmp_path / "model.safetensors"))
    assert ("layer_fusion_weights" in names) == VARIANTS[variant]["layer_fusion"]
    assert ("fc.weight" in names) != VARIANTS[variant]["layer_fusion"]
    assert ("layers.2.self_attn.k_proj_target.weight" in names) == VARIANTS[variant]["split_context_kv"]
    assert ("layers.2.self_attn.v_proj_target.weight" in names) == VARIANTS[variant]["split_context_kv"]
    loaded = DFlashDraftModel.from_pretrained(tmp_path)
    assert loaded.config.layer_fusion == VARIANTS[variant]["layer_fusion"]
    assert loaded.config.split_context_kv == VARIANTS[variant]["split_context_kv"]
    for name, tensor in drafter.state_dict().items():
        assert torch.equal(tensor, loaded.state_dict()[name]), name


def test_angelslim_config_without_switches_means_full_dflare():
    config = DFlashConfig(architectures=["QwenDFlareDraftModel"], hidden_size=64, num_attention_heads=4,
                          num_key_value_heads=2, head_dim=16, intermediate_size=128, num_hidden_layers=2,
                          vocab_size=96, dflash_config={"mask_token_id": 95, "target_layer_ids": [1, 4]})
    assert config.layer_fusion and config.split_context_kv and config.is_dflare


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("do_sample", [False, True])
def test_variant_is_lossless_greedy_and_samples(target, variant, do_sample):
    drafter = make_drafter(target, **VARIANTS[variant]).eval()
    ids = torch.randint(0, 96, (1, 13), generator=torch.Generator().manual_seed(5))
    if not do_sample:
        assert_lossless(target, drafter, ids, ("random",), max_new_tokens=30)
    else:
        out = target.generate(ids, max_new_tokens=30, do_sample=True, top_k=20, assistant_model=drafter)
        assert out.shape == (1, 43)
    assert drafter.last_stats.num_verifications > 0


def test_dflare_loads_by_remote_code_without_hf_dflash(target, tmp_path):
    make_drafter(target, **VARIANTS["dflare"]).save_pretrained(tmp_path / "drafter")
    target.save_pretrained(tmp_path / "target")
    code = f"""
        import sys
        sys.modules["hf_dflash"] = None
        import torch
        from transformers import AutoModel, AutoModelForCausalLM
        target = AutoModelForCausalLM.from_pretrained({str(tmp_path / "target")!r}).eval()
        drafter = AutoModel.from_pretrained({str(tmp_path / "drafter")!r}, trust_remote_code=True).eval()
        assert drafter.config.layer_fusion and drafter.config.split_context_kv
        ids = torch.randint(0, 96, (1, 13), generator=torch.Generator().manual_seed(5))
        plain = target.generate(ids, max_new_tokens=20, do_sample=False)
        assert torch.equal(target.generate(ids, max_new_tokens=20, do_sample=False, assistant_model=drafter), plain)
        print("DFLARE-REMOTE-OK")
    """
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules")}
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "DFLARE-REMOTE-OK" in result.stdout
