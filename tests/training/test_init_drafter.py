# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""``hf-dflash train --init-drafter``: a drafter of another architecture is refused with one error line that lists
every field that differs (README: "a ValueError lists every field that differs"), before any training."""

import pytest
import torch
from conftest import make_target, save_tiny_target, write_data

from hf_dflash import DFlashDraftModel
from hf_dflash.cli import main

# each with the saved drafter's value, as the message prints it ("NAME: THERE there vs HERE here")
DIFFERING = {
    "num_hidden_layers": "2",
    "block_size": "4",
    "target_layer_ids": "[0, 2]",
    "mask_token_id": "5",
    "layer_fusion": "True",
    "split_context_kv": "True",
    "hidden_size": "32",
    "vocab_size": "96",
}


def test_init_drafter_lists_every_differing_field(tmp_path, capsys):
    other_target = make_target("llama", hidden_size=32, num_hidden_layers=3)  # hidden 32, vocab 96: not the target's
    torch.manual_seed(0)
    DFlashDraftModel.from_target(other_target, num_hidden_layers=2, block_size=4, target_layer_ids=[0, 2],
                                 mask_token_id=5, layer_fusion=True, split_context_kv=True).save_pretrained(
        tmp_path / "other-drafter")
    target = save_tiny_target(tmp_path / "target")  # hidden 64, vocab 64, 4 layers
    capsys.readouterr()
    code = main(["train", "--target", str(target), "--data", str(write_data(tmp_path / "train.jsonl")),
                 "--output", str(tmp_path / "out"), "--num-layers", "1", "--block-size", "8",
                 "--init-drafter", str(tmp_path / "other-drafter")])
    assert code == 2
    captured = capsys.readouterr().err
    err = captured.strip().splitlines()[-1]  # one line (after any weight-loading progress bars), no traceback
    assert err.startswith("hf-dflash train: error: --init-drafter") and "Traceback" not in captured
    missing = [name for name, there in DIFFERING.items() if f"{name}: {there} there vs " not in err]
    assert not missing, f"not listed: {missing} in {err}"
    assert not (tmp_path / "out" / "checkpoints").exists()


@pytest.mark.parametrize("field, flags", [("block_size", ["--block-size", "4"]),
                                          ("split_context_kv", ["--split-context-kv"])])
def test_init_drafter_lists_only_what_differs(tmp_path, capsys, field, flags):
    target = save_tiny_target(tmp_path / "target")
    data = str(write_data(tmp_path / "train.jsonl"))
    common = ["train", "--target", str(target), "--data", data, "--num-layers", "1", "--epochs", "1",
              "--num-anchors", "4", "--max-length", "64", "--num-eval-prompts", "0", "--eval-split", "0"]
    assert main([*common, "--output", str(tmp_path / "first"), "--block-size", "8"]) == 0
    capsys.readouterr()
    code = main([*common, "--output", str(tmp_path / "second"), "--block-size", "8", *flags, "--init-drafter",
                 str(tmp_path / "first")])
    err = capsys.readouterr().err
    assert code == 2 and err.count(" there vs ") == 1 and f"{field}: " in err, err
