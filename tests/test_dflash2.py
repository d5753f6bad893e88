"""DFlash2 drafters (issue 21): the published layout loads and saves (with and without their own embeddings and LM
head, with remote code), mixed layouts are refused, the convolution and selector compute what vLLM computes, and
generate() drafts with the selector's path losslessly (greedy identical; sampling: drafts and q follow the selector's
law, chi-square with negative controls)."""

import collections
import contextlib
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from conftest import P_THRESHOLD, assert_lossless, chi_square_pvalue, left_padded, make_prompt, make_target
from safetensors.torch import load_file, save_file
from transformers import AutoModel, GenerationConfig

import hf_dflash
from hf_dflash import DFlash2Config, DFlash2DraftModel, DFlashDraftModel
from hf_dflash.candidates_dflash import DFlashCandidateGenerator, selector_walk
from hf_dflash.modeling_dflash2 import DFlash2GroupedConv

BLOCK = 8
DFLASH2_FIELDS = dict(conv_group_size=16, conv_kernel_size=3, selector_rank=8, selector_top_k=4,
                      output_multiplier=1.5, final_logit_softcapping=6.0)


def randomized(drafter, seed: int = 0, scale: float = 0.1, selector_scale: float = 1.0):
    """`drafter` with every weight random (a fresh DFlash2 drafter starts with identity convolutions and a near-zero
    selector, which would hide the parts under test): convolution base kernels around the identity, kernel
    projections, selector codebooks (times `selector_scale`) and the rest normal(0, `scale`)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in drafter.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator) * scale
            if name.endswith("norm.weight"):
                noise += 1.0
            elif name.endswith("base_kernel"):
                noise[:, 0] += 1.0
            elif "codebook" in name:
                noise *= selector_scale / scale
            parameter.copy_(noise)
    return drafter.eval().requires_grad_(False)


def make_dflash2(target, seed: int = 0, num_hidden_layers: int = 2, block_size: int = BLOCK, **overrides):
    torch.manual_seed(seed)
    fields = {**DFLASH2_FIELDS, **overrides}
    selector_scale = fields.pop("selector_scale", 1.0)
    drafter = DFlash2DraftModel.from_target(target, num_hidden_layers=num_hidden_layers, block_size=block_size,
                                            target_layer_ids=[0, 2], **fields)
    return randomized(drafter, seed, selector_scale=selector_scale)


@pytest.fixture(scope="module")
def target():
    return make_target("qwen3", num_hidden_layers=4)


@pytest.fixture(scope="module")
def drafter(target):
    return make_dflash2(target)


@pytest.fixture(scope="module")
def saved(tmp_path_factory, target, drafter):
    folder = tmp_path_factory.mktemp("dflash2") / "drafter"
    drafter.save_pretrained(folder)
    return folder


# ----------------------------------------------------------------------------------------------------------------------
# layout: load, save, refuse mixtures
def test_saved_folder_is_the_published_layout(saved, drafter):
    config = json.loads((saved / "config.json").read_text())
    assert config["architectures"] == ["DFlash2DraftModel"] and config["model_type"] == "qwen3"
    nested = config["dflash_config"]
    for name, value in {**DFLASH2_FIELDS, "block_size": BLOCK, "target_layer_ids": [0, 2],
                        "mask_token_id": drafter.config.mask_token_id}.items():
        assert nested[name] == value, name
    assert not {"has_own_embed_tokens", "has_own_lm_head", "selector_top_k"} & set(config)
    assert config["auto_map"]["AutoModel"] == "modeling_dflash2.DFlash2DraftModel"
    weights = load_file(saved / "model.safetensors")
    hidden, taps, groups, vocab = 64, 3, 64 // 16, 96
    for i in range(2):
        for conv in ("attention_conv", "mlp_conv"):
            assert weights[f"layers.{i}.{conv}.base_kernel"].shape == (2, taps, hidden)
            assert weights[f"layers.{i}.{conv}.kernel_projection.weight"].shape == (2 * taps * groups, hidden)
    assert weights["candidate_selector.predecessor_codebook"].shape == (vocab, 8)
    assert weights["candidate_selector.successor_codebook"].shape == (vocab, 8)
    assert weights["candidate_selector.hidden_projection.weight"].shape == (8, hidden)
    assert "embed_tokens.weight" not in weights and "lm_head.weight" not in weights  # shared with the target
    assert {"modeling_dflash2.py", "configuration_dflash2.py", "modeling_dflash.py"} <= {p.name for p in saved.iterdir()}


@pytest.mark.parametrize("loader", [DFlashDraftModel, DFlash2DraftModel, AutoModel])
def test_round_trip_by_every_loader(saved, drafter, loader):
    kwargs = {"trust_remote_code": True} if loader is AutoModel else {}
    loaded = loader.from_pretrained(saved, **kwargs)
    assert type(loaded) is DFlash2DraftModel and type(loaded.config) is DFlash2Config
    assert loaded.state_dict().keys() == drafter.state_dict().keys()
    for name, tensor in drafter.state_dict().items():
        assert torch.equal(tensor, loaded.state_dict()[name]), name
    assert loaded.own_embeddings() == (None, None)


@contextlib.contextmanager
def recorded_drafts():
    """Yields the list of every proposal (drafts as lists) made inside."""
    original, proposals = DFlashCandidateGenerator.propose, []

    def propose(self, *args, **kwargs):
        drafts, scores = original(self, *args, **kwargs)
        proposals.append(drafts.tolist())
        return drafts, scores

    DFlashCandidateGenerator.propose = propose
    try:
        yield proposals
    finally:
        DFlashCandidateGenerator.propose = original


def own_weights_folder(saved, tmp_path, target):
    """The saved drafter with its own embed_tokens and lm_head (not the target's: a drafter using the target's would
    draft differently)."""
    folder = tmp_path / "own"
    folder.mkdir()
    for path in saved.iterdir():
        if path.suffix in (".json", ".py"):
            (folder / path.name).write_bytes(path.read_bytes())
    weights = load_file(saved / "model.safetensors")
    generator = torch.Generator().manual_seed(7)
    weights["embed_tokens.weight"] = torch.randn(96, 64, generator=generator) * 0.5
    weights["lm_head.weight"] = torch.randn(96, 64, generator=generator) * 0.5
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def test_own_embeddings_and_head_load_save_and_draft(saved, tmp_path, target, drafter):
    folder = own_weights_folder(saved, tmp_path, target)
    loaded = DFlashDraftModel.from_pretrained(folder).eval()
    embed, head = loaded.own_embeddings()
    assert torch.equal(embed.weight, load_file(folder / "model.safetensors")["embed_tokens.weight"])
    assert torch.equal(head.weight, load_file(folder / "model.safetensors")["lm_head.weight"])
    generator = DFlashCandidateGenerator(loaded, target, GenerationConfig(do_sample=False))
    assert generator.input_embeddings is embed and generator.lm_head is head
    prompt = make_prompt(10, seed=1)
    with recorded_drafts() as own_drafts:
        own = target.generate(prompt, assistant_model=loaded, max_new_tokens=24, do_sample=False,
                              dflash_policy="full")
    with recorded_drafts() as shared_drafts:
        shared = target.generate(prompt, assistant_model=drafter, max_new_tokens=24, do_sample=False,
                                 dflash_policy="full")
    assert torch.equal(own, shared)  # lossless either way, so both drafted after the same histories
    assert own_drafts != shared_drafts  # with its own embeddings and head
    loaded.save_pretrained(tmp_path / "again")
    again = load_file(tmp_path / "again" / "model.safetensors")
    assert set(again) == set(load_file(folder / "model.safetensors"))
    assert "has_own_lm_head" not in json.loads((tmp_path / "again" / "config.json").read_text())


def config_with(saved, tmp_path, edit):
    folder = tmp_path / "edited"
    folder.mkdir(exist_ok=True)
    config = json.loads((saved / "config.json").read_text())
    edit(config)
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "model.safetensors").write_bytes((saved / "model.safetensors").read_bytes())
    return folder


MIXED = {
    "DFlash architecture, DFlash2 field": (
        lambda c: c.update(architectures=["DFlashDraftModel"]),
        r"dflash_config\.conv_group_size is a DFlash2 field.*DFlash2DraftModel.*or remove dflash_config.conv_group_size"),
    "DFlare architecture, DFlash2 field": (
        lambda c: c.update(architectures=["QwenDFlareDraftModel"]), r"dflash_config\.conv_group_size is a DFlash2"),
    "DFlash2 architecture, field missing": (
        lambda c: c["dflash_config"].pop("selector_top_k"), r"needs dflash_config\.selector_top_k.*add it"),
    "DFlash2 field at the top level": (
        lambda c: c.update(selector_rank=c["dflash_config"].pop("selector_rank")),
        r"selector_rank is a DFlash2 field at the top level.*move it to dflash_config\.selector_rank"),
    "two architectures": (
        lambda c: c.update(architectures=["DFlash2DraftModel", "DFlashDraftModel"]), r"keep one"),
    "DFlare switch": (lambda c: c.update(layer_fusion=True), r"layer_fusion=true is a DFlare switch.*remove"),
    "draft vocabulary": (lambda c: c.update(draft_vocab_size=48), r"draft_vocab_size with a DFlash2.*Remove"),
    "group size": (lambda c: c["dflash_config"].update(conv_group_size=24), r"conv_group_size=24 must divide"),
}


@pytest.mark.parametrize("case", MIXED)
@pytest.mark.parametrize("loader", [DFlashDraftModel, DFlash2DraftModel])
def test_mixed_layouts_are_refused_naming_field_and_fix(saved, tmp_path, case, loader):
    edit, message = MIXED[case]
    with pytest.raises(ValueError, match=message):
        loader.from_pretrained(config_with(saved, tmp_path, edit))


def test_dflash_config_refuses_dflash2_fields_and_dflash2_refuses_a_draft_vocabulary(drafter):
    with pytest.raises(ValueError, match="selector_top_k is a DFlash2 field"):
        hf_dflash.DFlashConfig(target_layer_ids=[1], dflash_config={"selector_top_k": 4})
    with pytest.raises(ValueError, match="cannot take a draft vocabulary"):
        drafter.set_draft_vocabulary([1, 2, 3])


def test_trust_remote_code_generates_without_hf_dflash(saved, tmp_path, target):
    (tmp_path / "target").mkdir()
    target.save_pretrained(tmp_path / "target")
    code = f"""
        import sys
        sys.modules["hf_dflash"] = None  # not installed
        import torch
        from transformers import AutoModel, AutoModelForCausalLM
        target = AutoModelForCausalLM.from_pretrained({str(tmp_path / "target")!r}).eval()
        drafter = AutoModel.from_pretrained({str(saved)!r}, trust_remote_code=True).eval()
        assert type(drafter).__name__ == "DFlash2DraftModel", type(drafter)
        assert type(drafter).__module__.startswith("transformers_modules"), type(drafter).__module__
        ids = torch.randint(1, 96, (1, 11), generator=torch.Generator().manual_seed(3))
        plain = target.generate(ids, max_new_tokens=24, do_sample=False)
        fast = target.generate(ids, max_new_tokens=24, do_sample=False, assistant_model=drafter, dflash_policy="full")
        assert torch.equal(plain, fast), (plain, fast)
        print("REMOTE-OK", drafter.last_stats.acceptance_lengths)
    """
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules"), "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                            timeout=300)
    assert result.returncode == 0 and "REMOTE-OK" in result.stdout, result.stderr[-3000:]
