"""Checkpoint format: z-lab layout on disk, both published config layouts, remote code, Hub resolution offline."""

import ast
import json
import os
import pickle
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from conftest import make_target, run_without_hf_dflash, write_zlab_checkpoint
from transformers import AutoModel, Qwen3ForCausalLM

import hf_dflash
from hf_dflash import DFlashDraftModel


def tiny_target(seed: int = 0) -> Qwen3ForCausalLM:
    return make_target("qwen3", num_hidden_layers=6, max_position_embeddings=256, bos_token_id=0,
                       initializer_range=0.02, seed=seed)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A target folder and a saved 2-layer drafter folder for it."""
    root = tmp_path_factory.mktemp("ckpt")
    target = tiny_target()
    target.save_pretrained(root / "target")
    torch.manual_seed(1)
    drafter = DFlashDraftModel.from_target(target, num_hidden_layers=2, block_size=8).eval()
    drafter.training_info = {"target": "tiny/qwen3", "dataset": "unit-test prompts", "tau": 3.25}
    drafter.save_pretrained(root / "drafter")
    return target, drafter, root


def greedy(target, drafter=None, seed=3, new=24):
    ids = torch.randint(0, 96, (1, 11), generator=torch.Generator().manual_seed(seed))
    return target.generate(ids, max_new_tokens=new, do_sample=False, assistant_model=drafter)


def test_saved_folder_is_the_zlab_layout(saved):
    target, drafter, root = saved
    folder = root / "drafter"
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"]
    assert config["model_type"] == "qwen3"
    assert config["block_size"] == 8 and config["num_target_layers"] == 6
    assert config["dflash_config"]["mask_token_id"] == drafter.config.mask_token_id
    assert config["dflash_config"]["target_layer_ids"] == drafter.config.target_layer_ids
    assert config["auto_map"]["AutoModel"] == "modeling_dflash.DFlashDraftModel"
    for key in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                "rms_norm_eps", "vocab_size", "num_hidden_layers", "layer_types"):
        assert key in config, key
    assert not list(folder.glob("*.bin")) and not list(folder.glob("*.pt"))
    weights = load_file(folder / "model.safetensors")
    per_layer = {
        "input_layernorm.weight", "post_attention_layernorm.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
        "mlp.down_proj.weight", *(f"self_attn.{n}.weight" for n in ("q_proj", "k_proj", "v_proj", "o_proj",
                                                                     "q_norm", "k_norm")),
    }
    expected = {"fc.weight", "hidden_norm.weight", "norm.weight"} | {
        f"layers.{i}.{name}" for i in range(2) for name in per_layer
    }
    assert set(weights) == expected
    num_features = len(drafter.config.target_layer_ids)
    assert weights["fc.weight"].shape == (64, num_features * 64)
    assert weights["layers.0.self_attn.q_norm.weight"].shape == (16,)


def test_remote_code_payload_is_flat_and_imports_only_torch_and_transformers(saved):
    folder = saved[2] / "drafter"
    payload = sorted(p.name for p in folder.glob("*.py"))
    package = {p.name for p in Path(hf_dflash.__file__).parent.glob("*_dflash.py")}
    assert package <= set(payload), f"save_pretrained must copy every payload module; missing {package - set(payload)}"
    allowed = {"torch", "transformers", "huggingface_hub", "hf_dflash"} | set(sys.stdlib_module_names)
    for name in payload:
        tree = ast.parse((folder / name).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level:
                assert (folder / f"{node.module}.py").exists(), f"{name} imports missing sibling {node.module}"
                assert "." not in node.module, f"{name}: nested relative import {node.module}"
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
                for module in modules:
                    assert module.split(".")[0] in allowed, f"{name} imports {module}"


def test_model_card_names_target_block_layers_data_and_tau(saved):
    drafter, root = saved[1], saved[2]
    card = (root / "drafter" / "README.md").read_text()
    assert "tiny/qwen3" in card and "unit-test prompts" in card and "3.25" in card
    assert str(drafter.config.target_layer_ids) in card and "| block size | 8 |" in card
    assert "{" not in card.split("```")[0].split("---", 2)[-1]  # every placeholder filled


def test_round_trip_keeps_weights_and_output(saved):
    target, drafter, root = saved
    loaded = DFlashDraftModel.from_pretrained(root / "drafter").eval()
    for name, tensor in drafter.state_dict().items():
        assert torch.equal(tensor, loaded.state_dict()[name]), name
    assert torch.equal(greedy(target, loaded), greedy(target))
    assert loaded.last_stats.acceptance_lengths == (greedy(target, drafter), drafter.last_stats)[1].acceptance_lengths


@pytest.mark.parametrize("newer_layout", [False, True], ids=["older-top-level-block-size", "newer-nested"])
def test_loads_published_zlab_layouts_without_remote_code(saved, tmp_path, newer_layout):
    target, drafter, root = saved
    write_zlab_checkpoint(root / "drafter", tmp_path / "zlab", newer_layout)
    loaded = DFlashDraftModel.from_pretrained(tmp_path / "zlab").eval()
    assert loaded.config.block_size == 8
    assert loaded.config.num_target_layers == 6
    assert loaded.config.target_layer_ids == drafter.config.target_layer_ids
    assert loaded.config.mask_token_id == drafter.config.mask_token_id
    assert loaded.config.rope_parameters["rope_theta"] == drafter.config.rope_parameters["rope_theta"]
    assert torch.equal(greedy(target, loaded), greedy(target))
    assert loaded.last_stats.acceptance_lengths == (greedy(target, drafter), drafter.last_stats)[1].acceptance_lengths


def test_automodel_with_hf_dflash_installed_gives_installed_classes(saved):
    loaded = AutoModel.from_pretrained(saved[2] / "drafter", trust_remote_code=True)
    assert type(loaded) is DFlashDraftModel
    assert type(loaded.config) is hf_dflash.DFlashConfig


REMOTE_GENERATE = """
    import torch
    from transformers import AutoModel, AutoModelForCausalLM
    target = AutoModelForCausalLM.from_pretrained({target!r}).eval()
    drafter = AutoModel.from_pretrained({drafter!r}, trust_remote_code=True).eval()
    assert type(drafter).__module__.startswith("transformers_modules"), type(drafter).__module__
    ids = torch.randint(0, 96, (1, 11), generator=torch.Generator().manual_seed(3))
    plain = target.generate(ids, max_new_tokens=24, do_sample=False)
    fast = target.generate(ids, max_new_tokens=24, do_sample=False, assistant_model=drafter)
    assert torch.equal(plain, fast), (plain, fast)
    assert len(drafter.last_stats.acceptance_lengths) > 0
    tree = target.generate(ids, max_new_tokens=24, do_sample=False, assistant_model=drafter, dflash_tree_budget=8,
                           dflash_policy="full")
    assert torch.equal(plain, tree), (plain, tree)
    assert max(drafter.last_stats.drafts_per_cycle) == 8
    print("REMOTE-OK", drafter.last_stats.mean_acceptance_length)
"""


def test_trust_remote_code_works_without_hf_dflash(saved, tmp_path):
    root = saved[2]
    code = REMOTE_GENERATE.format(target=str(root / "target"), drafter=str(root / "drafter"))
    out = run_without_hf_dflash(code, {"HF_MODULES_CACHE": str(tmp_path / "modules")})
    assert "REMOTE-OK" in out


def place_in_hub_cache(folder: Path, cache: Path, repo_id: str) -> None:
    """Lay out `folder` as a downloaded snapshot of `repo_id` in a Hugging Face cache."""
    repo_dir = cache / f"models--{repo_id.replace('/', '--')}"
    commit = "0123456789abcdef0123456789abcdef01234567"
    shutil.copytree(folder, repo_dir / "snapshots" / commit)
    (repo_dir / "refs").mkdir(parents=True, exist_ok=True)
    (repo_dir / "refs" / "main").write_text(commit)


def test_push_to_hub_and_load_by_repo_id_offline(saved, tmp_path, monkeypatch):
    """push_to_hub uploads what save_pretrained writes; the repo then resolves from the cache offline."""
    import huggingface_hub

    target, drafter, root = saved
    uploaded = tmp_path / "uploaded"

    class FakeRepo:
        repo_id = "me/my-drafter"

    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", lambda self, repo_id, **kw: FakeRepo())
    monkeypatch.setattr(
        huggingface_hub.HfApi, "upload_folder",
        lambda self, repo_id, folder_path, **kw: shutil.copytree(folder_path, uploaded),
    )
    drafter.push_to_hub("me/my-drafter")
    assert (uploaded / "model.safetensors").exists() and (uploaded / "modeling_dflash.py").exists()
    assert "me/my-drafter" in (uploaded / "README.md").read_text()

    cache = tmp_path / "hub"
    place_in_hub_cache(uploaded, cache, "me/my-drafter")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code = f"""
        import os
        import hf_dflash
        from transformers import AutoModel
        d = hf_dflash.DFlashDraftModel.from_pretrained("me/my-drafter", cache_dir={str(cache)!r})
        a = AutoModel.from_pretrained("me/my-drafter", cache_dir={str(cache)!r}, trust_remote_code=True)
        assert type(a) is hf_dflash.DFlashDraftModel
        print("HUB-OK", d.config.block_size)
    """
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "modules")}
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "HUB-OK 8" in result.stdout

    remote = REMOTE_GENERATE.format(target=str(root / "target"), drafter="me/my-drafter").replace(
        "trust_remote_code=True", f"trust_remote_code=True, cache_dir={str(cache)!r}"
    )
    out = run_without_hf_dflash(remote, {"HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "modules2")})
    assert "REMOTE-OK" in out


def test_broken_checkpoints_raise_clear_errors(saved, tmp_path):
    source = saved[2] / "drafter"
    weights = load_file(source / "model.safetensors")

    missing = tmp_path / "missing"
    shutil.copytree(source, missing)
    save_file({k: v for k, v in weights.items() if k != "layers.1.mlp.up_proj.weight"}, missing / "model.safetensors")
    with pytest.raises(ValueError, match=r"layers\.1\.mlp\.up_proj\.weight.*save_pretrained"):
        DFlashDraftModel.from_pretrained(missing)

    wrong_shape = tmp_path / "wrong_shape"
    shutil.copytree(source, wrong_shape)
    save_file({**weights, "fc.weight": torch.zeros(64, 64)}, wrong_shape / "model.safetensors")
    with pytest.raises(ValueError, match="weight shapes do not match"):
        DFlashDraftModel.from_pretrained(wrong_shape)

    not_dflash2 = tmp_path / "dflash2"  # a DFlash folder that claims to be DFlash2: no DFlash2 fields
    shutil.copytree(source, not_dflash2)
    config = json.loads((not_dflash2 / "config.json").read_text())
    config["architectures"] = ["DFlash2DraftModel"]
    (not_dflash2 / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"DFlash2DraftModel.*needs dflash_config\.conv_group_size"):
        DFlashDraftModel.from_pretrained(not_dflash2)


# ----------------------------------------------------------------------------------------------------------------------
# an optional draft vocabulary (EAGLE-3-style d2t): saved only when set, read back, lossless
DRAFT_IDS = list(range(0, 96, 2))  # every other token of the tiny vocabulary


def test_draft_vocabulary_round_trips_and_is_absent_from_the_zlab_layout(saved, tmp_path):
    target, drafter, root = saved
    assert "draft_vocab_size" not in json.loads((root / "drafter" / "config.json").read_text())
    assert "d2t" not in load_file(root / "drafter" / "model.safetensors")
    restricted = DFlashDraftModel.from_pretrained(root / "drafter").eval()
    restricted.set_draft_vocabulary(DRAFT_IDS, lm_head=target.get_output_embeddings())
    restricted.save_pretrained(tmp_path / "restricted")
    assert json.loads((tmp_path / "restricted" / "config.json").read_text())["draft_vocab_size"] == len(DRAFT_IDS)
    weights = load_file(tmp_path / "restricted" / "model.safetensors")
    assert (torch.arange(len(DRAFT_IDS)) + weights["d2t"]).tolist() == DRAFT_IDS  # EAGLE-3: i + d2t[i]
    assert torch.equal(weights["lm_head.weight"], target.lm_head.weight[DRAFT_IDS])  # and its own head rows
    loaded = DFlashDraftModel.from_pretrained(tmp_path / "restricted")
    assert loaded.draft_token_ids().tolist() == DRAFT_IDS
    loaded.set_draft_vocabulary(None)
    loaded.save_pretrained(tmp_path / "unrestricted")
    assert "d2t" not in load_file(tmp_path / "unrestricted" / "model.safetensors")
    assert "draft_vocab_size" not in json.loads((tmp_path / "unrestricted" / "config.json").read_text())
    with pytest.raises(ValueError, match=r"token ids in \[0, 96\).*from 0 to 200"):
        loaded.set_draft_vocabulary([0, 200])
    code = REMOTE_GENERATE.format(target=str(root / "target"), drafter=str(tmp_path / "restricted"))
    assert "REMOTE-OK" in run_without_hf_dflash(code, {"HF_MODULES_CACHE": str(tmp_path / "modules")})


def test_a_draft_vocabulary_only_proposes_its_tokens_and_stays_lossless(saved):
    target, drafter, root = saved
    restricted = DFlashDraftModel.from_pretrained(root / "drafter").eval()
    restricted.set_draft_vocabulary(DRAFT_IDS)
    proposed = []
    original = hf_dflash.candidates_dflash.DFlashCandidateGenerator.propose

    def spy(self, *args, **kwargs):
        drafts, scores = original(self, *args, **kwargs)
        proposed.extend(drafts.flatten().tolist())
        return drafts, scores

    hf_dflash.candidates_dflash.DFlashCandidateGenerator.propose = spy
    try:
        for seed in range(4):
            assert torch.equal(greedy(target, restricted, seed=seed), greedy(target, seed=seed))
            ids = torch.randint(0, 96, (1, 11), generator=torch.Generator().manual_seed(seed))
            torch.manual_seed(seed)
            sampled = target.generate(ids, max_new_tokens=16, do_sample=True, top_k=1, assistant_model=restricted)
            assert torch.equal(sampled, greedy(target, seed=seed, new=16))  # top_k=1: the greedy law
    finally:
        hf_dflash.candidates_dflash.DFlashCandidateGenerator.propose = original
    assert proposed and set(proposed) <= set(DRAFT_IDS)


def test_a_draft_vocabularys_head_rows_are_gathered_once_for_a_drafters_calls(saved, monkeypatch):
    """The target head's rows for the draft vocabulary are gathered at a drafter's first draft and kept for its later
    calls (~30 ms a call on a CPU for the shipped drafter); gathered again for another target's head, or for the same
    head changed in place, so that drafts are always scored by the head the target verifies with."""
    target, _, root = saved
    restricted = DFlashDraftModel.from_pretrained(root / "drafter").eval()
    restricted.set_draft_vocabulary(DRAFT_IDS)
    gathered, gather = [], hf_dflash.candidates_dflash.plain_head_rows
    monkeypatch.setattr(hf_dflash.candidates_dflash, "plain_head_rows",
                        lambda weight, ids: gathered.append(weight) or gather(weight, ids))
    for seed in range(3):
        assert torch.equal(greedy(target, restricted, seed=seed), greedy(target, seed=seed))
    assert len(gathered) == 1 and restricted.last_stats.drafted_verifications > 0
    assert pickle.loads(pickle.dumps(restricted)).draft_token_ids().tolist() == DRAFT_IDS  # no state on the drafter
    other = tiny_target(seed=5)
    assert torch.equal(greedy(other, restricted), greedy(other))
    assert len(gathered) == 2 and gathered[1] is other.lm_head.weight
    with torch.no_grad():
        other.lm_head.weight.mul_(1.5)  # the same tensor, changed in place
    assert torch.equal(greedy(other, restricted), greedy(other))
    assert len(gathered) == 3
