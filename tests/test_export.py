"""What we save serves in vLLM unchanged: the draft vocabulary in the EAGLE-3 layout vLLM's DFlash loader
reads, both layouts loading here, the target named by its Hub id, and what vLLM cannot serve said, not written
silently. The real engine runs in tests/test_vllm_check.py (slow); here vLLM's reading of the files is re-done in
a few lines from its source (vllm/model_executor/models/qwen3_dflash.py, DFlashQwen3ForCausalLM)."""

import json
from pathlib import Path

import pytest
import torch
from conftest import make_target
from safetensors.torch import load_file, save_file
from transformers import GenerationConfig

import hf_dflash
from hf_dflash import DFlashConfig, DFlashDraftModel
from hf_dflash.candidates_dflash import DFlashCandidateGenerator
from hf_dflash.checkpoint_dflash import hub_id_of, serving_problems

DRAFT_IDS = [3, 4, 10, 17, 40, 41, 42, 90]  # irregular gaps: wrong d2t offsets cannot pass by luck
HUB_ID = "tiny-org/tiny-qwen3"


@pytest.fixture(scope="module")
def target():
    return make_target("qwen3", num_hidden_layers=6, max_position_embeddings=256, initializer_range=0.1)


def drafter_for(target, draft_ids=None, with_head=True, **overrides):
    torch.manual_seed(1)
    drafter = DFlashDraftModel.from_target(target, num_hidden_layers=1, block_size=8, **overrides).eval()
    if draft_ids is not None:
        drafter.set_draft_vocabulary(draft_ids, lm_head=target.get_output_embeddings() if with_head else None)
    return drafter


def vllm_draft_logits(folder: Path, hidden: torch.Tensor, target) -> torch.Tensor:
    """Draft logits over the target vocabulary as vLLM 0.32 computes them from the saved files: `lm_head.weight`
    when the checkpoint has one (else the target's head, of which its LogitsProcessor keeps the first
    draft_vocab_size columns), then `logits_new[:, arange + d2t] = logits` (compute_logits)."""
    config = json.loads((folder / "config.json").read_text())
    weights = load_file(folder / "model.safetensors")
    rows = config.get("draft_vocab_size") or config["vocab_size"]
    head = weights.get("lm_head.weight", target.get_output_embeddings().weight[:rows])
    logits = hidden @ head.T
    if rows == target.config.vocab_size:
        return logits
    full = logits.new_full((*logits.shape[:-1], target.config.vocab_size), float("-inf"))
    full[..., torch.arange(rows) + weights["d2t"]] = logits
    return full


def our_draft_logits(drafter, target, hidden: torch.Tensor) -> torch.Tensor:
    return DFlashCandidateGenerator(drafter, target, GenerationConfig()).draft_logits(hidden)


def greedy(target, drafter=None, seed=0, new=24):
    ids = torch.randint(1, 96, (1, 12), generator=torch.Generator().manual_seed(seed))
    return target.generate(ids, max_new_tokens=new, do_sample=False, assistant_model=drafter)


# ----------------------------------------------------------------------------------------------------------------------
# the draft vocabulary: EAGLE-3 layout (d2t + the drafter's own lm_head rows)
def test_vllm_scores_drafts_from_the_saved_files_as_we_do(target, tmp_path):
    drafter = drafter_for(target, DRAFT_IDS)
    drafter.save_pretrained(tmp_path / "drafter")
    weights = load_file(tmp_path / "drafter" / "model.safetensors")
    assert weights["d2t"].dtype == torch.long and weights["lm_head.weight"].shape == (len(DRAFT_IDS), 64)
    assert (torch.arange(len(DRAFT_IDS)) + weights["d2t"]).tolist() == DRAFT_IDS  # draft index i -> i + d2t[i]
    assert torch.equal(weights["lm_head.weight"], target.lm_head.weight[DRAFT_IDS])
    hidden = torch.randn(3, 64, generator=torch.Generator().manual_seed(0))
    ours = our_draft_logits(drafter, target, hidden)
    theirs = vllm_draft_logits(tmp_path / "drafter", hidden, target)
    assert torch.allclose(ours, theirs, atol=1e-5) and torch.equal(ours.argmax(-1), theirs.argmax(-1))


def test_the_old_layout_is_what_vllm_misreads(target, tmp_path):
    """Control for the emulation above: without the draft head (a layout with `d2t` alone), vLLM's logits
    come from the target's first draft_vocab_size rows, placed at the draft ids: other tokens than ours."""
    drafter = drafter_for(target, DRAFT_IDS)
    drafter.save_pretrained(tmp_path / "new")
    write_old_layout(tmp_path / "new", tmp_path / "old")
    hidden = torch.randn(16, 64, generator=torch.Generator().manual_seed(0))
    ours = our_draft_logits(drafter, target, hidden)
    assert not torch.equal(ours.argmax(-1), vllm_draft_logits(tmp_path / "old", hidden, target).argmax(-1))


def write_old_layout(source: Path, dest: Path) -> None:
    """The same drafter as saved before the draft head: d2t and draft_vocab_size, no lm_head.weight."""
    dest.mkdir(parents=True)
    (dest / "config.json").write_text((source / "config.json").read_text())
    weights = {k: v for k, v in load_file(source / "model.safetensors").items() if k != "lm_head.weight"}
    save_file(weights, dest / "model.safetensors", metadata={"format": "pt"})


def test_saving_a_draft_vocabulary_without_its_head_rows_raises_and_writes_nothing(target, tmp_path):
    drafter = drafter_for(target, DRAFT_IDS, with_head=False)
    assert drafter.lm_head is None and drafter.draft_token_ids().tolist() == DRAFT_IDS
    fix = r"set_draft_vocabulary\(drafter\.draft_token_ids\(\), lm_head=target\.get_output_embeddings\(\)\)"
    with pytest.raises(ValueError, match=rf"draft_vocab_size={len(DRAFT_IDS)} .*no draft LM head.*{fix}"):
        drafter.save_pretrained(tmp_path / "drafter")
    assert not (tmp_path / "drafter" / "model.safetensors").exists()
    drafter.set_draft_vocabulary(drafter.draft_token_ids(), lm_head=target.get_output_embeddings())  # the fix
    drafter.save_pretrained(tmp_path / "drafter")
    assert torch.equal(load_file(tmp_path / "drafter" / "model.safetensors")["lm_head.weight"],
                       target.lm_head.weight[DRAFT_IDS])


def test_the_draft_head_must_come_from_the_target_head(target):
    drafter = drafter_for(target)
    with pytest.raises(ValueError, match=r"\[vocab_size=96, hidden_size=64\]; got weight \(96, 32\)"):
        drafter.set_draft_vocabulary(DRAFT_IDS, lm_head=torch.zeros(96, 32))
    with_bias = torch.nn.Linear(64, 96, bias=True)
    with pytest.raises(ValueError, match="has a bias.*set_draft_vocabulary\\(None\\)"):
        drafter.set_draft_vocabulary(DRAFT_IDS, lm_head=with_bias)
    assert drafter.config.draft_vocab_size is None  # a refused call changes nothing
    drafter.set_draft_vocabulary(DRAFT_IDS, lm_head=target.lm_head.weight)  # the weight itself works too
    assert torch.equal(drafter.lm_head.weight, target.lm_head.weight[DRAFT_IDS])
    drafter.set_draft_vocabulary(None)
    assert drafter.lm_head is None and "d2t" not in drafter.state_dict()


@pytest.mark.parametrize("layout", ["with-head", "old-d2t-only"])
def test_both_layouts_load_and_draft_alike(target, tmp_path, layout):
    drafter = drafter_for(target, DRAFT_IDS)
    drafter.save_pretrained(tmp_path / "with-head")
    if layout == "old-d2t-only":
        write_old_layout(tmp_path / "with-head", tmp_path / layout)
    loaded = DFlashDraftModel.from_pretrained(tmp_path / layout).eval()
    assert loaded.draft_token_ids().tolist() == DRAFT_IDS
    if layout == "with-head":
        assert torch.equal(loaded.lm_head.weight, target.lm_head.weight[DRAFT_IDS])
        assert not loaded.lm_head.weight.requires_grad  # the target's rows: frozen like the target's head
    else:
        assert loaded.lm_head is None  # not a random head: the target's rows are read at generate time
        with pytest.raises(ValueError, match="no draft LM head"):
            loaded.save_pretrained(tmp_path / "again")
    for seed in range(3):
        assert torch.equal(greedy(target, loaded, seed=seed), greedy(target, seed=seed))
        lengths = loaded.last_stats.acceptance_lengths
        greedy(target, drafter, seed=seed)
        assert lengths == drafter.last_stats.acceptance_lengths


# ----------------------------------------------------------------------------------------------------------------------
# the target's name: a Hub id, never a folder of the machine that saved the drafter
def test_hub_ids_pass_and_local_paths_do_not(tmp_path):
    assert hub_id_of("Qwen/Qwen3-8B") == "Qwen/Qwen3-8B" and hub_id_of("gpt2") == "gpt2"
    assert hub_id_of(tmp_path) is None and hub_id_of("/gone/SmolLM2") is None and hub_id_of("./t") is None
    assert hub_id_of(f"{tmp_path}/hub/models--HuggingFaceTB--SmolLM2-135M-Instruct/snapshots/abc") == \
        "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_saved_config_names_the_target_by_hub_id(target, tmp_path):
    target.save_pretrained(tmp_path / "target")
    local = target.__class__.from_pretrained(tmp_path / "target")
    assert local.name_or_path == str(tmp_path / "target")
    assert drafter_for(local).config.target_name_or_path is None  # not the local folder
    drafter = drafter_for(local, target_hub_id=HUB_ID)
    drafter.save_pretrained(tmp_path / "named")
    assert json.loads((tmp_path / "named" / "config.json").read_text())["target_name_or_path"] == HUB_ID
    trained = drafter_for(local)
    trained.config.target_name_or_path = str(tmp_path / "target")  # e.g. set by hand, or an old config
    trained.training_info = {"target": HUB_ID}  # what hf-dflash train records
    trained.save_pretrained(tmp_path / "trained")
    assert json.loads((tmp_path / "trained" / "config.json").read_text())["target_name_or_path"] == HUB_ID
    unnamed = drafter_for(local)
    unnamed.config.target_name_or_path = str(tmp_path / "target")
    unnamed.training_info = {"target": str(tmp_path / "target")}  # hf-dflash train on a folder, no --target-hub-id
    unnamed.save_pretrained(tmp_path / "unnamed")
    for name in ("config.json", "README.md"):
        assert str(tmp_path) not in (tmp_path / "unnamed" / name).read_text(), name


def test_hf_dflash_train_names_a_local_target_by_target_hub_id(tmp_path):
    from hf_dflash.training import DFlashTrainingArguments
    from hf_dflash.training.arguments import validate_arguments
    from hf_dflash.training.export import training_info

    data = tmp_path / "data.jsonl"
    data.write_text("")
    args = DFlashTrainingArguments(str(tmp_path / "target"), str(data), str(tmp_path / "out"), target_hub_id=HUB_ID)
    validate_arguments(args)
    results = {"heldout": {}, "steps": 1}
    assert training_info(args, 1, results)["target"] == HUB_ID
    assert training_info(DFlashTrainingArguments("smollm2", str(data), "o"), 1, results)["target"] == \
        "HuggingFaceTB/SmolLM2-135M-Instruct"
    args.target_hub_id = str(tmp_path / "target")
    with pytest.raises(ValueError, match="--target-hub-id .* is not a Hub id.*--target-hub-id Qwen/Qwen3-8B"):
        validate_arguments(args)


def test_the_shipped_drafter_names_its_target_by_hub_id():
    folder = Path(hf_dflash.__file__).parent / "assets" / "smollm2-dflash"
    for name in ("config.json", "training_info.json", "README.md"):
        text = (folder / name).read_text()
        assert "/root/" not in text and "/home/" not in text and "/tmp/" not in text, name
    assert json.loads((folder / "config.json").read_text())["target_name_or_path"] == \
        "HuggingFaceTB/SmolLM2-135M-Instruct"


# ----------------------------------------------------------------------------------------------------------------------
# what vLLM cannot serve: said at save time, in the model card, and refused by vLLM itself (not misread)
def test_serving_problems_name_what_vllm_reads_differently():
    def problems(**fields):
        config = DFlashConfig(target_layer_ids=fields.pop("ids", [1, 3]), num_target_layers=6, **fields)
        return [p.split(":")[0].split("=")[0] for p in serving_problems(config)]

    assert problems() == []
    assert problems(layer_fusion=True) == ["layer_fusion"]
    assert problems(split_context_kv=True) == ["split_context_kv"]
    assert problems(ids=[3, 1]) == problems(ids=[1, 1]) == ["target_layer_ids"]
    assert problems(ids=[1, 5]) == ["target layer 5 is the target's last"]


def test_dflare_is_saved_under_an_architecture_vllm_refuses_and_the_card_says_so(target, tmp_path):
    """vLLM's dflash method loads `DFlash{arch}` for an architecture not named DFlash (EAGLEConfig), and its
    registry has no DFlashQwenDFlareDraftModel: it refuses the folder at load (measured: benchmarks/conformance/vllm_check.py)."""
    drafter = drafter_for(target, layer_fusion=True)
    drafter.save_pretrained(tmp_path / "dflare")
    config = json.loads((tmp_path / "dflare" / "config.json").read_text())
    assert config["architectures"] == ["QwenDFlareDraftModel"]
    card = (tmp_path / "dflare" / "README.md").read_text()
    assert "vLLM 0.32 cannot serve this drafter" in card
    drafter_for(target).save_pretrained(tmp_path / "dflash")
    assert "cannot serve" not in (tmp_path / "dflash" / "README.md").read_text()


def test_sliding_layers_are_saved_with_the_keys_vllm_reads(target, tmp_path):
    """vLLM takes the window from dflash_config.swa_window_size (the transformers it pins drops a Qwen3
    sliding_window without use_sliding_window) and runs windowed layers causally unless dflash_config.causal is
    false; ours see the block both ways. Without these keys it refused the drafter (measured)."""
    drafter = drafter_for(target, layer_types=["sliding_attention"], sliding_window=5)
    drafter.save_pretrained(tmp_path / "sliding")
    config = json.loads((tmp_path / "sliding" / "config.json").read_text())
    assert config["dflash_config"]["swa_window_size"] == 5 and config["dflash_config"]["causal"] is False
    config.pop("sliding_window")  # a config with vLLM's keys alone (use_swa: every layer windowed)
    config.pop("layer_types")
    config["dflash_config"]["use_swa"] = True
    (tmp_path / "sliding" / "config.json").write_text(json.dumps(config))
    loaded = DFlashDraftModel.from_pretrained(tmp_path / "sliding")
    assert loaded.config.layer_types == ["sliding_attention"] and loaded.config.sliding_window == 5
    drafter_for(target).save_pretrained(tmp_path / "full")
    nested = json.loads((tmp_path / "full" / "config.json").read_text())["dflash_config"]
    assert "swa_window_size" not in nested and "causal" not in nested  # plain drafters keep the z-lab layout


def test_hf_dflash_train_exports_a_draft_vocabulary_with_its_head_rows(target, tmp_path):
    """`hf-dflash train --draft-vocab-size N` builds its final drafter with inference_drafter: it must carry the
    target's rows, or the run would end in save_pretrained's refusal."""
    from hf_dflash.training.export import inference_drafter

    trained = drafter_for(target)
    drafter = inference_drafter(trained.config, trained.state_dict(), target, torch.tensor(DRAFT_IDS))
    assert torch.equal(drafter.lm_head.weight, target.lm_head.weight[DRAFT_IDS])
    drafter.save_pretrained(tmp_path / "exported")
    assert "lm_head.weight" in load_file(tmp_path / "exported" / "model.safetensors")


def test_a_draft_vocabulary_of_every_token_is_the_whole_vocabulary(target):
    """vLLM reads d2t only when draft_vocab_size differs from the target's vocab_size (qwen3_dflash.py): a full
    "draft vocabulary" is saved as none."""
    drafter = drafter_for(target, list(range(96)))
    assert drafter.config.draft_vocab_size is None and drafter.lm_head is None and "d2t" not in drafter.state_dict()


# ----------------------------------------------------------------------------------------------------------------------
# stored in bf16, as published drafters are; a float32 target upcasts the drafter at load
def test_weights_written_in_bf16_keep_the_draft_vocabulary_and_stay_lossless(target, tmp_path):
    from hf_dflash.training.export import write_weights_in_dtype

    drafter = drafter_for(target, DRAFT_IDS)
    drafter.save_pretrained(tmp_path / "fp32")
    write_weights_in_dtype(tmp_path / "fp32", tmp_path / "bf16")
    weights = load_file(tmp_path / "bf16" / "model.safetensors")
    assert weights["d2t"].dtype == torch.long and torch.equal(weights["d2t"], drafter.d2t)
    assert {w.dtype for name, w in weights.items() if name != "d2t"} == {torch.bfloat16}
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["dtype"] == "bfloat16"
    loaded = DFlashDraftModel.from_pretrained(tmp_path / "bf16", dtype=torch.float32).eval()
    for name, weight in drafter.state_dict().items():
        expected = weight.to(torch.bfloat16).to(weight.dtype) if weight.is_floating_point() else weight
        assert torch.equal(loaded.state_dict()[name], expected), name
    assert torch.equal(greedy(target, loaded), greedy(target))


def test_the_shipped_drafter_is_stored_in_bf16():
    from hf_dflash.checkpoint_dflash import saved_weight_dtype

    folder = Path(hf_dflash.__file__).parent / "assets" / "smollm2-dflash"
    assert saved_weight_dtype(folder) == "bfloat16"
    assert json.loads((folder / "config.json").read_text())["dtype"] == "bfloat16"
    assert load_file(folder / "model.safetensors")["d2t"].dtype == torch.long
