# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""Training (hf_dflash.training) on a tiny random Qwen3 target and data it regenerated itself.

A random target's greedy continuations are very predictable, so a drafter trained on them for a few seconds must
raise the acceptance length measured by real ``generate(assistant_model=drafter)`` well above an untrained one's.
"""

import json
import math
from pathlib import Path

import pytest
import torch
from conftest import TRAINING_BLOCK, WORDS, small_args
from torch._dynamo.exc import TorchDynamoException
from torch._inductor.exc import CppCompileError

from hf_dflash import DFlashDraftModel
from hf_dflash.cli import main
from hf_dflash.data import load_training_samples
from hf_dflash.evaluation.acceptance import measure_acceptance_length
from hf_dflash.training import (
    IGNORE_INDEX,
    DFlashTrainer,
    DFlashTrainingArguments,
    block_diffusion_loss,
    context_features,
    default_gamma,
    dense_block_mask,
    gamma_at,
    make_block_batch,
    position_weights,
    sample_anchors,
)
from hf_dflash.training.loss import block_hidden_states, is_flex_attention_available

BLOCK = TRAINING_BLOCK


# ----------------------------------------------------------------------------------------------------------------------
# the recipe
def test_gamma_defaults_and_schedules():
    assert (default_gamma(16), default_gamma(10), default_gamma(8)) == (7.0, 5.0, 4.0)
    assert 5.0 < default_gamma(12) < 7.0 and default_gamma(4) < 4.0
    constant = DFlashTrainingArguments("t", "d", "o", block_size=16)
    assert gamma_at(constant, 3, 100, 200) == 7.0
    per_epoch = DFlashTrainingArguments("t", "d", "o", gamma_schedule="per-epoch", gamma_start=4.5, gamma_end=6.5,
                                        epochs=3)
    assert [gamma_at(per_epoch, e, 0, 9) for e in range(3)] == [4.5, 5.5, 6.5]
    linear = DFlashTrainingArguments("t", "d", "o", gamma_schedule="linear", gamma_start=2.0, gamma_end=4.0)
    assert [gamma_at(linear, 0, s, 5) for s in (0, 2, 4)] == [2.0, 3.0, 4.0]
    weights = position_weights(16, 7.0)
    assert weights.shape == (15,) and weights[0] == 1.0 and math.isclose(float(weights[7]), math.exp(-1), rel_tol=1e-6)


def test_anchors_blocks_and_mask():
    mask = torch.tensor([0, 0, 0, 1, 1, 1, 1, 1], dtype=torch.bool)
    anchors = sample_anchors(mask, 100, torch.Generator().manual_seed(0))
    assert anchors.tolist() == [3, 4, 5, 6]  # p and p + 1 both response tokens
    assert len(sample_anchors(mask, 2, torch.Generator().manual_seed(0))) == 2

    sample_a = {"index": 0, "input_ids": torch.arange(10, 18), "loss_mask": mask}
    sample_b = {"index": 1, "input_ids": torch.arange(20, 25), "loss_mask": mask[:5]}
    batch = make_block_batch([sample_a, sample_b], [torch.tensor([3, 5]), torch.tensor([3])], block_size=3,
                             mask_token_id=99, pad_token_id=0)
    assert batch.block_ids.tolist() == [[13, 99, 99, 15, 99, 99], [23, 99, 99, 20, 99, 99]]
    assert batch.block_positions.tolist() == [[3, 4, 5, 5, 6, 7], [3, 4, 5, 0, 1, 2]]
    assert batch.labels.tolist() == [[[14, 15], [16, 17]], [[24, IGNORE_INDEX], [IGNORE_INDEX, IGNORE_INDEX]]]
    assert batch.block_valid.tolist() == [[True, True], [True, False]]

    visible = dense_block_mask(batch.anchors, batch.context_length, 3)[0, 0].int()  # [6 queries, 8 + 6 keys]
    expected_block0 = [1, 1, 1, 0, 0, 0, 0, 0] + [1, 1, 1, 0, 0, 0]  # context < 3, itself, not block 1
    expected_block1 = [1, 1, 1, 1, 1, 0, 0, 0] + [0, 0, 0, 1, 1, 1]  # context < 5 (overlap allowed), itself
    assert visible.tolist() == [expected_block0] * 3 + [expected_block1] * 3


def _two_sequence_batch(target_and_tokenizer, data_file, drafter):
    target, tokenizer = target_and_tokenizer
    samples = load_training_samples(data_file, max_length=200, min_response_tokens=2 * BLOCK)[:2]
    samples[1] = {**samples[1], "input_ids": samples[1]["input_ids"][:-9], "loss_mask": samples[1]["loss_mask"][:-9]}
    anchors = [sample_anchors(samples[0]["loss_mask"], 12, torch.Generator().manual_seed(1)),
               sample_anchors(samples[1]["loss_mask"], 5, torch.Generator().manual_seed(2))]  # padding blocks too
    batch = make_block_batch(samples, anchors, BLOCK, drafter.config.mask_token_id, tokenizer.pad_token_id)
    features = context_features(target, batch.input_ids, batch.attention_mask, drafter.config.target_layer_ids)
    return batch, features


def test_training_blocks_see_exactly_what_inference_sees(target_and_tokenizer, data_file):
    """Each block of the one-forward training layout equals the drafter call generation makes for that anchor:
    context = features of positions < anchor, block = [token at anchor, MASK...] at anchor + 0..B-1, no mask."""
    target, _ = target_and_tokenizer
    torch.manual_seed(0)
    drafter = DFlashDraftModel.from_target(target, num_hidden_layers=2, block_size=BLOCK).eval()
    batch, features = _two_sequence_batch(target_and_tokenizer, data_file, drafter)
    embed = target.get_input_embeddings()
    with torch.no_grad():
        hidden = block_hidden_states(drafter, embed, features, batch)
        for row in range(2):
            for j in range(int(batch.block_valid[row].sum())):
                anchor = int(batch.anchors[row, j])
                block = torch.full((1, BLOCK), drafter.config.mask_token_id)
                block[0, 0] = batch.input_ids[row, anchor]
                alone = drafter(noise_embeds=embed(block), context_hidden_states=features[row : row + 1, :anchor],
                                position_ids=torch.arange(anchor + BLOCK)[None]).last_hidden_state
                torch.testing.assert_close(hidden[row, j], alone[0], atol=2e-5, rtol=1e-4)


# slow (~29 s): runs with the slow suite in .ci/run
@pytest.mark.slow
def test_dense_and_flex_masks_give_the_same_loss(target_and_tokenizer, data_file):
    if not is_flex_attention_available():
        pytest.skip("torch.nn.attention.flex_attention is not available in this torch build")
    target, _ = target_and_tokenizer
    torch.manual_seed(0)
    drafter = DFlashDraftModel.from_target(target, num_hidden_layers=2, block_size=BLOCK).eval()
    batch, features = _two_sequence_batch(target_and_tokenizer, data_file, drafter)
    weights = position_weights(BLOCK, default_gamma(BLOCK))
    lm_head, embed = target.get_output_embeddings(), target.get_input_embeddings()
    # torch 2.13 runs flex_attention forward on CPU (inductor-compiled) but has no CPU backward: compare under
    # no_grad here; CPU training uses the dense mask with sdpa, GPUs use flex for both.
    with torch.no_grad():
        drafter.config._attn_implementation = "sdpa"
        dense = block_diffusion_loss(drafter, embed, lm_head, features, batch, weights, "sdpa")
        drafter.config._attn_implementation = "flex_attention"
        try:
            flex = block_diffusion_loss(drafter, embed, lm_head, features, batch, weights, "flex_attention")
        except (NotImplementedError, TorchDynamoException, CppCompileError) as error:  # e.g. no C++ compiler
            pytest.skip(f"flex_attention does not compile/run on this CPU: {type(error).__name__}: {str(error)[:200]}")
    torch.testing.assert_close(flex.loss, dense.loss, atol=1e-5, rtol=1e-5)
    assert torch.equal(flex.correct, dense.correct) and torch.equal(flex.acceptance_sum, dense.acceptance_sum)
    assert float(dense.num_blocks) == 12 + 5


# ----------------------------------------------------------------------------------------------------------------------
# end to end
# slow (~28 s): runs with the slow suite in .ci/run
@pytest.mark.slow
def test_training_raises_measured_acceptance_length(workdir, target_dir, data_file, target_and_tokenizer):
    """CLI path with a target folder: training lifts real generate()-measured tau far above an untrained drafter."""
    eval_prompts = workdir / "eval_prompts.jsonl"
    eval_prompts.write_text("".join(json.dumps({"prompt": f"what is a {w} made of? {i}"}) + "\n"
                                    for i, w in enumerate(WORDS[:8])))
    output = workdir / "drafter"
    assert main(["train", "--target", str(target_dir), "--data", str(data_file), "--output", str(output),
                 "--num-layers", "2", "--block-size", str(BLOCK), "--epochs", "10", "--lr", "3e-3",
                 "--num-anchors", "32", "--batch-size", "2", "--max-length", "256", "--eval-split", "0.1",
                 "--eval-prompts", str(eval_prompts), "--eval-max-new-tokens", "64", "--save-every", "0"]) == 0
    results = json.loads((output / "eval.json").read_text())
    info = json.loads((output / "training_info.json").read_text())
    assert info["tau"] == results["tau"] and info["epochs"] == 10 and info["num_samples"] > 0
    assert set(info) >= {"target", "dataset", "num_samples", "epochs", "tau"}
    card = (output / "README.md").read_text()
    assert ".tmp-export" not in card and "drafter" in card  # the output folder names the drafter, not a temp one
    assert results["generate"]["num_prompts"] == 8
    assert 0 <= results["heldout"]["accuracy"] <= 1 and len(results["heldout"]["accuracy_by_position"]) == BLOCK - 1

    target, tokenizer = target_and_tokenizer
    trainer_prompts = [tokenizer.apply_chat_template([{"role": "user", "content": json.loads(line)["prompt"]}],
                                                     tokenize=False, add_generation_prompt=True, enable_thinking=False)
                       for line in eval_prompts.read_text().splitlines()]
    prompt_ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in trainer_prompts]
    trained = DFlashDraftModel.from_pretrained(output)
    tau = measure_acceptance_length(target, trained, prompt_ids, 64)["tau"]
    assert tau == pytest.approx(results["tau"])  # the saved drafter is the one that was measured
    torch.manual_seed(0)
    untrained = DFlashDraftModel.from_target(target, num_hidden_layers=2, block_size=BLOCK)
    baseline = measure_acceptance_length(target, untrained, prompt_ids, 64)["tau"]
    assert baseline < 1.3
    assert tau > baseline + 1.0, (tau, baseline)


class Killed(Exception):
    pass


def test_killed_then_resumed_run_equals_uninterrupted_run(workdir, data_file, target_and_tokenizer):
    target, tokenizer = target_and_tokenizer
    data = workdir / "resume.jsonl"
    data.write_text("".join(data_file.read_text().splitlines(keepends=True)[:16]))
    # 14 train samples, 2 per micro-batch, 2 micro-batches per step: 4 steps per epoch (the last one partial)
    settings = dict(epochs=2, grad_accum=2, save_every=3, eval_split=0.1, seed=3, gamma_schedule="per-epoch")

    straight = DFlashTrainer(small_args(data, workdir / "straight", **settings), target, tokenizer)
    straight.train()
    assert straight.global_step == 8
    assert [log["gamma"] for log in straight.history if "gamma" in log] == [1.5] * 4 + [2.5] * 4  # B=8: 4 - 2.5, +1

    def kill_at_step_7(trainer, log):
        if log["step"] == 7:  # checkpoints exist at steps 3, 4 (epoch end) and 6: step 7 is lost
            raise Killed

    killed_args = small_args(data, workdir / "killed", **settings)
    with pytest.raises(Killed):
        DFlashTrainer(killed_args, target, tokenizer, callbacks=[kill_at_step_7]).train()
    checkpoints = sorted(p.name for p in (workdir / "killed" / "checkpoints").iterdir())
    assert checkpoints == ["checkpoint-4", "checkpoint-6"]  # atomic renames only, the 2 newest kept
    assert (workdir / "killed" / "checkpoints" / "checkpoint-6" / "config.json").exists()  # save_pretrained layout

    with pytest.raises(ValueError, match="already holds this run.*--resume"):
        DFlashTrainer(killed_args, target, tokenizer)
    with pytest.raises(ValueError, match="different run.*lr"):
        DFlashTrainer(small_args(data, workdir / "killed", resume=True, lr=1e-3, **settings), target, tokenizer)

    resumed = DFlashTrainer(small_args(data, workdir / "killed", resume=True, **settings), target, tokenizer)
    resumed.train()
    assert resumed.history == straight.history  # every step's loss, grad norm, lr, gamma and held-out metrics
    final_straight = straight.accelerator.unwrap_model(straight.model).state_dict()
    final_resumed = resumed.accelerator.unwrap_model(resumed.model).state_dict()
    assert all(torch.equal(final_straight[k], final_resumed[k]) for k in final_straight)
    assert (workdir / "killed" / "model.safetensors").exists() and (workdir / "killed" / "eval.json").exists()


def test_feature_cache_gives_the_same_training(workdir, data_file, target_and_tokenizer):
    target, tokenizer = target_and_tokenizer
    data = workdir / "cache.jsonl"
    data.write_text("".join(data_file.read_text().splitlines(keepends=True)[:8]))
    plain = DFlashTrainer(small_args(data, workdir / "plain", eval_split=0.0), target, tokenizer)
    plain.train()
    cache = workdir / "features"
    cached = DFlashTrainer(small_args(data, workdir / "cached", eval_split=0.0, feature_cache=str(cache)),
                           target, tokenizer)
    cached.train()  # epoch 0 fills the cache, epoch 1 reads it
    assert len(list(cache.glob("*.pt"))) == 8
    losses = [[log["loss"] for log in t.history] for t in (plain, cached)]
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)


# ----------------------------------------------------------------------------------------------------------------------
# bad input: clear errors before any long work
def test_bad_inputs_fail_early(workdir, data_file, target_dir, target_and_tokenizer):
    bogus = "no/such-target"  # never loaded: these checks come first
    with pytest.raises(ValueError, match="block_size=1"):
        DFlashTrainer(DFlashTrainingArguments(bogus, str(data_file), str(workdir / "bad1"), block_size=1))
    with pytest.raises(ValueError, match="run `hf-dflash regenerate` first"):
        DFlashTrainer(DFlashTrainingArguments(bogus, str(workdir / "prompts.jsonl"), str(workdir / "bad2")))
    with pytest.raises(ValueError, match="empty dataset after filtering"):  # 64-token responses < 2 x 40
        DFlashTrainer(DFlashTrainingArguments(bogus, str(data_file), str(workdir / "bad3"), block_size=40))
    with pytest.raises(ValueError, match=r"target_layer_ids=\[1, 9\].*4 layers"):  # --verbose: the traceback
        main(["train", "--target", str(target_dir), "--data", str(data_file), "--output", str(workdir / "bad4"),
              "--target-layer-ids", "1,9", "--block-size", str(BLOCK), "--verbose"])
    target, tokenizer = target_and_tokenizer
    DFlashTrainer(small_args(data_file, workdir / "bad5"), target, tokenizer)  # records its run settings
    with pytest.raises(ValueError, match="different run.*num_layers: saved 1, now 3"):
        DFlashTrainer(small_args(data_file, workdir / "bad5", num_layers=3), target, tokenizer)


# ----------------------------------------------------------------------------------------------------------------------
# DFlare through the same trainer
def test_dflare_variant_defaults_to_progressive_gamma():
    dflash = DFlashTrainingArguments("t", "d", "o")
    dflare = DFlashTrainingArguments("t", "d", "o", variant="dflare", epochs=3)
    fusion_only = DFlashTrainingArguments("t", "d", "o", layer_fusion=True)
    assert dflash.resolved_gamma_schedule == "constant" and dflash.drafter_switches == {
        "layer_fusion": False, "split_context_kv": False}
    assert dflare.resolved_gamma_schedule == "per-epoch"
    assert [gamma_at(dflare, e, 0, 30) for e in range(3)] == [4.5, 5.5, 6.5]
    assert fusion_only.drafter_switches == {"layer_fusion": True, "split_context_kv": False}
    assert DFlashTrainingArguments("t", "d", "o", variant="dflare", gamma_schedule="constant").resolved_gamma_schedule \
        == "constant"


@pytest.mark.parametrize("switches", [{"variant": "dflare"}, {"layer_fusion": True}, {"split_context_kv": True}])
def test_dflare_drafters_train_and_save_in_angelslim_layout(workdir, data_file, target_and_tokenizer, switches):
    target, tokenizer = target_and_tokenizer
    name = "-".join(f"{k}" for k in switches)
    args = small_args(data_file, workdir / f"dflare-{name}", epochs=1, max_steps=3, eval_split=0.0, **switches)
    DFlashTrainer(args, target, tokenizer).train()
    config = json.loads((Path(args.output_dir) / "config.json").read_text())
    assert config["architectures"] == ["QwenDFlareDraftModel"]
    drafter = DFlashDraftModel.from_pretrained(args.output_dir)
    assert drafter.config.layer_fusion == (switches.get("variant") == "dflare" or "layer_fusion" in switches)
    assert drafter.config.split_context_kv == (switches.get("variant") == "dflare" or "split_context_kv" in switches)


# ----------------------------------------------------------------------------------------------------------------------
# starting from an existing drafter
def test_init_drafter_starts_from_its_weights_and_refuses_other_architectures(workdir, data_file,
                                                                               target_and_tokenizer):
    target, tokenizer = target_and_tokenizer
    data = workdir / "init.jsonl"
    data.write_text("".join(data_file.read_text().splitlines(keepends=True)[:6]))
    first = DFlashTrainer(small_args(data, workdir / "init-first", eval_split=0.0, epochs=1), target, tokenizer)
    first.train()
    trained = DFlashDraftModel.from_pretrained(workdir / "init-first")
    second = DFlashTrainer(small_args(data, workdir / "init-second", eval_split=0.0, epochs=1,
                                      init_drafter=str(workdir / "init-first")), target, tokenizer)
    start = second.accelerator.unwrap_model(second.model).state_dict()
    for name, tensor in trained.state_dict().items():
        assert torch.equal(start[name], tensor), name
    # a drafter saved with a draft vocabulary (the shipped one, EAGLE-3 layout): its layers load, its d2t head is an
    # export-time view of the target's head and is left out
    trained.set_draft_vocabulary(list(range(40)), lm_head=target.get_output_embeddings())
    trained.save_pretrained(workdir / "init-vocab")
    third = DFlashTrainer(small_args(data, workdir / "init-third", eval_split=0.0, epochs=1,
                                     init_drafter=str(workdir / "init-vocab")), target, tokenizer)
    start = third.accelerator.unwrap_model(third.model).state_dict()
    assert set(start) == set(trained.state_dict()) - {"d2t", "lm_head.weight"}
    for name in start:
        assert torch.equal(start[name], trained.state_dict()[name]), name
    with pytest.raises(ValueError, match=r"num_hidden_layers: 1 there vs 2 here.*--num-layers"):
        DFlashTrainer(small_args(data, workdir / "init-bad", num_layers=2, init_drafter=str(workdir / "init-first")),
                      target, tokenizer)


def test_grown_drafter_drafts_as_the_one_it_grew_from_then_trains_its_added_layer(workdir, data_file,
                                                                                 target_and_tokenizer):
    target, tokenizer = target_and_tokenizer
    data = workdir / "grow.jsonl"
    data.write_text("".join(data_file.read_text().splitlines(keepends=True)[:6]))
    DFlashTrainer(small_args(data, workdir / "grow-first", eval_split=0.0, epochs=1), target, tokenizer).train()
    trained = DFlashDraftModel.from_pretrained(workdir / "grow-first")
    grower = DFlashTrainer(small_args(data, workdir / "grow-second", eval_split=0.0, epochs=1, num_layers=2,
                                      grow_layers=True, init_drafter=str(workdir / "grow-first")), target, tokenizer)
    grown = grower.accelerator.unwrap_model(grower.model)
    # its target layer ids too (a 2-layer drafter's default ids differ from a 1-layer one's)
    assert grown.config.num_hidden_layers == 2 and grown.config.target_layer_ids == trained.config.target_layer_ids
    start = {name: tensor.clone() for name, tensor in grown.state_dict().items()}
    for name, tensor in trained.state_dict().items():
        assert torch.equal(start[name], tensor), name  # its own layer (0), embeddings, fusion, norm: as trained
    zeroed = [name for name in start if name.startswith("layers.1.") and ("o_proj" in name or "down_proj" in name)]
    assert zeroed and not any(start[name].any() for name in zeroed)
    # the added layer adds zero to the residual stream: the same hidden states, so the same drafts token for token
    generator = torch.Generator().manual_seed(0)
    hidden = trained.config.hidden_size
    noise = torch.randn(1, 4, hidden, generator=generator)
    context = torch.randn(1, 5, hidden * len(trained.config.target_layer_ids), generator=generator)
    with torch.no_grad():
        expected = trained.eval()(noise, context).last_hidden_state
        torch.testing.assert_close(grown.eval()(noise, context).last_hidden_state, expected)
    prompts = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in ("alpha beta", "gamma delta")]
    before = measure_acceptance_length(target, trained, prompts, 24)
    after = measure_acceptance_length(target, grown.eval(), prompts, 24)
    assert after["tau_per_prompt"] == before["tau_per_prompt"]
    grower.train()
    moved = DFlashDraftModel.from_pretrained(workdir / "grow-second").state_dict()
    assert moved["layers.1.self_attn.o_proj.weight"].any()  # training reaches the added layer
    with pytest.raises(ValueError, match="--grow-layers.*1 layers and --num-layers is 1"):
        DFlashTrainer(small_args(data, workdir / "grow-bad", grow_layers=True,
                                 init_drafter=str(workdir / "grow-first")), target, tokenizer)
    with pytest.raises(ValueError, match="--grow-layers.*--init-drafter"):
        DFlashTrainer(small_args(data, workdir / "grow-none", num_layers=2, grow_layers=True), target, tokenizer)
