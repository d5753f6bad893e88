"""What the repository itself records: the shipped drafter's model card is the one hf-dflash writes from its config
and training_info.json (so its tau is the one figure training_info.json and eval.json carry)."""

import json
from pathlib import Path
from types import SimpleNamespace

from hf_dflash.configuration_dflash import DFlashConfig
from hf_dflash.model_card import render_model_card

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "hf_dflash" / "assets" / "smollm2-dflash"


def test_the_shipped_model_card_is_the_one_its_training_info_renders():
    drafter = SimpleNamespace(config=DFlashConfig.from_pretrained(SHIPPED), hub_repo_id="smollm2-dflash-1536")
    template = (ROOT / "hf_dflash" / "MODEL_CARD.md").read_text(encoding="utf-8")
    rendered = render_model_card(drafter, template, str(SHIPPED))
    assert (SHIPPED / "README.md").read_text(encoding="utf-8") == rendered, (
        "hf_dflash/assets/smollm2-dflash/README.md differs from what MODEL_CARD.md renders from its config and "
        "training_info.json: change training_info.json (or the template), then re-render the card")


def test_the_shipped_drafter_has_one_tau():
    info = json.loads((SHIPPED / "training_info.json").read_text())
    results = json.loads((SHIPPED / "eval.json").read_text())
    assert info["tau"] == results["tau"] == results["unseen_prompts"]["tau"]
    assert f"{info['tau']:.3f}" in (SHIPPED / "README.md").read_text(encoding="utf-8")
    assert info["tau_measured_on"] and results["unseen_prompts"]["command"].startswith("python benchmarks/")
