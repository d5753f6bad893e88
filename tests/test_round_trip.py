"""Every checkpoint layout we read round-trips (issue 32): load -> save -> load gives the same config fields, the same
weights and the same drafts, and remote code loads the saved folder. A drafter built from a bare config saves too:
its config never named a target, which is then absent from config.json (not null) and stated in the model card."""

import json

import pytest
from conftest import VOCAB

from hf_dflash import DFlash2Config, DFlash2DraftModel, DFlashConfig, DFlashDraftModel

QWEN3_FIELDS = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=128,
                    num_hidden_layers=1, vocab_size=VOCAB)
DFLASH_FIELDS = dict(target_layer_ids=[0, 2], mask_token_id=VOCAB - 1, num_target_layers=4, block_size=8)
DFLASH2_NESTED = dict(conv_group_size=16, conv_kernel_size=3, selector_rank=8, selector_top_k=4)


def bare_drafter(variant: str) -> DFlashDraftModel:
    """A drafter made from a config alone (no target, no checkpoint): its config has no target name."""
    if variant == "dflash2":
        config = DFlash2Config(**QWEN3_FIELDS, dflash_config={**DFLASH_FIELDS, **DFLASH2_NESTED})
        return DFlash2DraftModel(config).eval()
    return DFlashDraftModel(DFlashConfig(**QWEN3_FIELDS, **DFLASH_FIELDS)).eval()


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
