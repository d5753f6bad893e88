# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""Loads on a GPU box without network: transformers 5.25 turns hub kernels on for every ``from_pretrained`` and their
publisher trust check needs the network, so there a ``device_map="cuda"`` load raises. The fixture below plants that
failure on CPU (``device_map="cpu"`` stands in for cuda): every load hf-dflash performs must still work, and a caller's
own ``use_kernels=True`` must still reach transformers (and fail here)."""

import pytest
import torch
import transformers.modeling_utils
from packaging.version import Version
from conftest import make_target
from transformers import AutoModel, AutoModelForCausalLM

from hf_dflash import DFlash2DraftModel, DFlashDraftModel
from hf_dflash.models import load_drafter, load_target

TRUST_FAILURE = "Kernel repository 'kernels-community/liger-kernels' could not verify publisher trust status"
# What use_kernels=True meets here: the planted failure, or (transformers 5.23 beside a newer `kernels`) its refusal
KERNELS_ASKED = "publisher trust|Kernels are not available"


@pytest.fixture()
def offline_kernel_hub(monkeypatch):
    """Every load that turns hub kernels on raises what an offline GPU box raises."""

    def untrusted(model, *args, **kwargs):
        raise ValueError(TRUST_FAILURE)

    monkeypatch.delenv("USE_HUB_KERNELS", raising=False)  # a GPU script may set it; the fault must not be masked
    monkeypatch.setattr(transformers.modeling_utils, "kernelize", untrusted)


@pytest.fixture(scope="module")
def saved(tiny_folder, tmp_path_factory):
    """Folders of the tiny target and of a DFlash, a DFlare and a DFlash2 drafter for it."""
    root = tmp_path_factory.mktemp("offline")
    target = AutoModelForCausalLM.from_pretrained(tiny_folder / "target", use_kernels=False)
    torch.manual_seed(2)
    DFlashDraftModel.from_target(target, num_hidden_layers=2, block_size=4, layer_fusion=True,
                                 split_context_kv=True).save_pretrained(root / "dflare")
    DFlash2DraftModel.from_target(target, num_hidden_layers=1, block_size=4, conv_group_size=1, selector_rank=4,
                                  selector_top_k=2).save_pretrained(root / "dflash2")
    return {"target": tiny_folder / "target", "dflash": tiny_folder / "drafter", "dflare": root / "dflare",
            "dflash2": root / "dflash2"}


def test_the_planted_failure_is_what_a_default_transformers_load_meets(saved, offline_kernel_hub):
    """The negative control: transformers' own default load fails under the fixture where it turns kernels on."""
    if Version(transformers.__version__) >= Version("5.25"):  # where transformers turns them on by default
        with pytest.raises(ValueError, match="publisher trust"):
            AutoModelForCausalLM.from_pretrained(saved["target"], device_map="cpu")
    with pytest.raises(ValueError, match=KERNELS_ASKED):
        AutoModelForCausalLM.from_pretrained(saved["target"], device_map="cpu", use_kernels=True)


def test_load_target_and_load_drafter_load_offline(saved, offline_kernel_hub):
    target, _ = load_target(saved["target"], device="cpu", device_map="cpu")
    assert not target.use_kernels
    for layout in ("dflash", "dflare", "dflash2"):
        drafter = load_drafter(saved[layout], target)
        assert drafter.device == target.device and not drafter.use_kernels


@pytest.mark.parametrize("layout", ["dflash", "dflare", "dflash2"])
def test_every_drafter_layout_loads_offline_by_every_loader(saved, offline_kernel_hub, layout):
    classes = {"dflash": DFlashDraftModel, "dflare": DFlashDraftModel, "dflash2": DFlash2DraftModel}
    for loader in (DFlashDraftModel.from_pretrained, classes[layout].from_pretrained):
        drafter = loader(saved[layout], device_map="cpu")
        assert isinstance(drafter, classes[layout]) and not drafter.use_kernels
    assert isinstance(AutoModel.from_pretrained(saved[layout], trust_remote_code=True, device_map="cpu"),
                      classes[layout])


def test_a_callers_use_kernels_true_still_reaches_transformers(saved, offline_kernel_hub):
    with pytest.raises(ValueError, match=KERNELS_ASKED):
        load_target(saved["target"], device="cpu", device_map="cpu", use_kernels=True)
    for layout in ("dflash", "dflash2"):
        with pytest.raises(ValueError, match=KERNELS_ASKED):
            DFlashDraftModel.from_pretrained(saved[layout], device_map="cpu", use_kernels=True)


def test_the_run_stamp_records_the_choice():
    from hf_dflash.evaluation.machine import run_stamp

    assert run_stamp("cpu")["hub_kernels"] is False
