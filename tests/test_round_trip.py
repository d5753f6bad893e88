"""Every checkpoint layout we read round-trips: load -> save -> load gives the same config fields, the same
weights and the same drafts, and remote code loads the saved folder. A drafter built from a bare config saves too:
its config never named a target, which is then absent from config.json (not null) and stated in the model card.

Each layout is written as its publisher writes it (z-lab's older and newer configs, AngelSlim's DFlare, DFlash2 with
and without its own embeddings and LM head, an EAGLE-3 draft vocabulary, a bare config), loaded ("first"), saved by
us and loaded again ("second")."""

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from conftest import (
    VOCAB,
    make_prompt,
    make_target,
    own_weights_folder,
    randomized,
    recorded_drafts,
    run_without_hf_dflash,
    write_zlab_checkpoint,
)
from safetensors.torch import load_file
from transformers import AutoModel

from hf_dflash import DFlash2Config, DFlash2DraftModel, DFlashConfig, DFlashDraftModel

QWEN3_FIELDS = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=128,
                    num_hidden_layers=2, vocab_size=VOCAB)
DFLASH_FIELDS = dict(target_layer_ids=[1, 3], mask_token_id=VOCAB - 1, num_target_layers=6, block_size=8)
DFLASH2_NESTED = dict(conv_group_size=16, conv_kernel_size=3, selector_rank=8, selector_top_k=4)
DRAFT_IDS = [3, 4, 10, 17, 40, 41, 42, 90]  # irregular gaps: a wrong d2t cannot pass by luck
# config.json keys a publisher's folder has that ours replaces: its own remote-code entry points
REPLACED_KEYS = ("auto_map",)


@pytest.fixture(scope="module")
def target():
    return make_target("qwen3", num_hidden_layers=6, max_position_embeddings=256, initializer_range=0.02)


def bare_drafter(variant: str) -> DFlashDraftModel:
    """A drafter made from a config alone (no target, no checkpoint): its config has no target name."""
    if variant == "dflash2":
        config = DFlash2Config(**QWEN3_FIELDS, dflash_config={**DFLASH_FIELDS, **DFLASH2_NESTED})
        return DFlash2DraftModel(config).eval()
    return DFlashDraftModel(DFlashConfig(**QWEN3_FIELDS, **DFLASH_FIELDS)).eval()


def saved_by_us(drafter, folder: Path) -> Path:
    drafter.save_pretrained(folder)
    return folder


def angelslim_layout(ours: Path, dest: Path) -> Path:
    """Our saved DFlare folder as AngelSlim publishes it: no remote-code map, no target name, no DFlare switches (the
    architecture alone means both)."""
    dest.mkdir()
    config = json.loads((ours / "config.json").read_text())
    for key in ("auto_map", "target_name_or_path", "layer_fusion", "split_context_kv"):
        config.pop(key, None)
    (dest / "config.json").write_text(json.dumps(config, indent=2))
    (dest / "model.safetensors").write_bytes((ours / "model.safetensors").read_bytes())
    return dest


def dflash(target, seed: int = 1, **overrides):
    torch.manual_seed(seed)
    drafter = DFlashDraftModel.from_target(target, num_hidden_layers=2, block_size=8, **overrides)
    return randomized(drafter, seed, scale=0.2)


def dflash2(target, seed: int = 2):
    torch.manual_seed(seed)
    drafter = DFlash2DraftModel.from_target(target, num_hidden_layers=2, block_size=8, target_layer_ids=[1, 3],
                                            **DFLASH2_NESTED)
    return randomized(drafter, seed, scale=0.2)


def with_draft_vocabulary(drafter, target):
    drafter.set_draft_vocabulary(DRAFT_IDS, lm_head=target.get_output_embeddings())
    return drafter


# Each layout: (target, a scratch folder) -> the folder as its publisher writes it
LAYOUTS = {
    "zlab-older-top-level-block-size": lambda t, d: write_zlab_checkpoint(saved_by_us(dflash(t), d / "ours"),
                                                                          d / "published", newer_layout=False),
    "zlab-newer-nested-dflash-config": lambda t, d: write_zlab_checkpoint(saved_by_us(dflash(t), d / "ours"),
                                                                          d / "published", newer_layout=True),
    "angelslim-dflare": lambda t, d: angelslim_layout(
        saved_by_us(dflash(t, layer_fusion=True, split_context_kv=True), d / "ours"), d / "published"),
    "dflash2-shared-embeddings": lambda t, d: saved_by_us(dflash2(t), d / "published"),
    "dflash2-own-embeddings-and-head": lambda t, d: own_weights_folder(saved_by_us(dflash2(t), d / "ours"),
                                                                       d / "published"),
    "eagle3-draft-vocabulary": lambda t, d: saved_by_us(with_draft_vocabulary(dflash(t), t), d / "published"),
    "bare-config": lambda t, d: saved_by_us(randomized(bare_drafter("dflash"), 3, scale=0.2), d / "published"),
}


@dataclass
class RoundTrip:
    published: Path  # as its publisher writes it
    saved: Path  # `first` saved by us
    first: DFlashDraftModel  # loaded from `published`
    second: DFlashDraftModel  # loaded from `saved`


@pytest.fixture(scope="module")
def round_trips(target, tmp_path_factory) -> dict[str, RoundTrip]:
    trips = {}
    for name, write in LAYOUTS.items():
        scratch = tmp_path_factory.mktemp(name)
        published = write(target, scratch)
        first = DFlashDraftModel.from_pretrained(published).eval()
        saved = saved_by_us(first, scratch / "saved")
        trips[name] = RoundTrip(published, saved, first, DFlashDraftModel.from_pretrained(saved).eval())
    return trips


def config_json(folder: Path) -> dict:
    return json.loads((folder / "config.json").read_text())


def kept_fields(published: dict, saved: dict, where: str = "") -> list[str]:
    """The keys of `published` (recursively into dicts) whose value `saved` lacks or changed.

    Example:
        >>> kept_fields({"a": 1, "n": {"b": 2, "c": 3}}, {"a": 1, "n": {"b": 2}, "d": 4})
        ['n.c: 3 -> absent']
    """
    lost = []
    for key, value in published.items():
        if isinstance(value, dict) and isinstance(saved.get(key), dict):
            lost += kept_fields(value, saved[key], f"{where}{key}.")
        elif saved.get(key, "absent") != value:
            lost.append(f"{where}{key}: {value} -> {saved.get(key, 'absent')}")
    return lost


def greedy_and_sampled_drafts(target, drafter) -> tuple[list, list]:
    """Every draft `drafter` proposes in a greedy and a seeded sampled run, and both runs' tokens."""
    prompt = make_prompt(11, seed=3)
    with recorded_drafts() as drafts:
        greedy = target.generate(prompt, max_new_tokens=20, do_sample=False, assistant_model=drafter)
        torch.manual_seed(0)
        sampled = target.generate(prompt, max_new_tokens=20, do_sample=True, assistant_model=drafter)
    return drafts, [greedy.tolist(), sampled.tolist()]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_published_config_field_survives_the_round_trip(round_trips, layout):
    trip = round_trips[layout]
    published = {k: v for k, v in config_json(trip.published).items() if k not in REPLACED_KEYS}
    assert kept_fields(published, config_json(trip.saved)) == []
    first, second = trip.first.config.to_dict(), trip.second.config.to_dict()
    first.pop("_name_or_path", None), second.pop("_name_or_path", None)
    assert first == second
    assert type(trip.first.config) is type(trip.second.config) and type(trip.first) is type(trip.second)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_published_weight_survives_the_round_trip(round_trips, layout):
    trip = round_trips[layout]
    published, saved = load_file(trip.published / "model.safetensors"), load_file(trip.saved / "model.safetensors")
    assert set(published) == set(saved)
    assert [name for name in published if not torch.equal(published[name], saved[name])] == []
    first, second = trip.first.state_dict(), trip.second.state_dict()
    assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_round_trip_drafts_the_same_tokens(round_trips, target, layout):
    trip = round_trips[layout]
    drafts, outputs = greedy_and_sampled_drafts(target, trip.first)
    assert drafts and (drafts, outputs) == greedy_and_sampled_drafts(target, trip.second)
    assert outputs[0] == target.generate(make_prompt(11, seed=3), max_new_tokens=20, do_sample=False).tolist()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_automodel_loads_the_saved_folder(round_trips, layout):
    trip = round_trips[layout]
    loaded = AutoModel.from_pretrained(trip.saved, trust_remote_code=True)
    assert type(loaded) is type(trip.second)
    assert all(torch.equal(tensor, trip.second.state_dict()[k]) for k, tensor in loaded.state_dict().items())


# The first remote copy loaded routes generate(): drafts are recorded in whichever copy's candidate generator runs
REMOTE_DRAFTS = """
    import json, sys
    import torch
    from transformers import AutoModel, AutoModelForCausalLM
    target = AutoModelForCausalLM.from_pretrained({target!r}).eval()
    prompt = torch.tensor({prompt!r})
    found, drafts = {{}}, []

    def recording(propose):
        def propose_and_record(self, *args, **kwargs):
            proposed = propose(self, *args, **kwargs)
            drafts.append(proposed[0].tolist())
            return proposed
        return propose_and_record

    for name, folder in {folders!r}.items():
        drafter = AutoModel.from_pretrained(folder, trust_remote_code=True).eval()
        assert type(drafter).__module__.startswith("transformers_modules"), type(drafter).__module__
        for module in [m for n, m in sys.modules.items() if n.endswith(".candidates_dflash")]:
            generator = module.DFlashCandidateGenerator
            if not hasattr(generator, "recorded"):
                generator.propose, generator.recorded = recording(generator.propose), True
        drafts.clear()
        out = target.generate(prompt, max_new_tokens=20, do_sample=False, assistant_model=drafter,
                              dflash_policy="full")
        found[name] = [type(drafter).__name__, list(drafts), out.tolist()]
    print("REMOTE", json.dumps(found))
"""


def test_remote_code_without_hf_dflash_loads_every_saved_folder_and_drafts_the_same(round_trips, target, tmp_path):
    target.save_pretrained(tmp_path / "target")
    prompt = make_prompt(11, seed=3)
    code = REMOTE_DRAFTS.format(target=str(tmp_path / "target"), prompt=prompt.tolist(),
                                folders={name: str(trip.saved) for name, trip in round_trips.items()})
    out = run_without_hf_dflash(code, {"HF_MODULES_CACHE": str(tmp_path / "modules"), "OMP_NUM_THREADS": "1"})
    found = json.loads(out.split("REMOTE ", 1)[1])
    for name, trip in round_trips.items():
        with recorded_drafts() as drafts:
            expected = target.generate(prompt, max_new_tokens=20, do_sample=False, assistant_model=trip.second)
        assert found[name] == [type(trip.second).__name__, drafts, expected.tolist()], name


@pytest.mark.parametrize("variant", ["dflash", "dflash2"])
def test_a_bare_config_drafter_saves_with_its_target_absent_and_the_card_says_so(tmp_path, variant):
    drafter = bare_drafter(variant)
    assert drafter.config.target_name_or_path is None
    drafter.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert "target_name_or_path" not in saved  # absent, as in z-lab's and AngelSlim's published configs
    card = (tmp_path / "README.md").read_text()
    assert "(target not recorded)" in card and "The target this drafter was trained for was not recorded" in card
    assert "base_model:" not in card and "huggingface.co/unknown" not in card and "for unknown" not in card
    assert DFlashDraftModel.from_pretrained(tmp_path).config.target_name_or_path is None
