# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""The training recipe options and the learning curves, on the tiny target of test_trainer.py.

Each option is checked twice: exactly (the computation against a brute-force or independent one) and end to end
(training with it on raises the held-out expected acceptance length far above the untrained drafter's). Exact
resume and the DFlare variant are checked with every option on at once.
"""

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch
from conftest import TRAINING_BLOCK as BLOCK
from conftest import small_args

import hf_dflash.training.loss as loss_module
from hf_dflash import DFlashDraftModel
from hf_dflash.cli import main
from hf_dflash.data import load_training_samples
from hf_dflash.training import (
    IGNORE_INDEX,
    LOG_FILE,
    DFlashTrainer,
    Objective,
    batch_vocabulary,
    block_diffusion_loss,
    context_features,
    frequent_tokens,
    initial_weights_from_target,
    make_block_batch,
    position_weights,
    read_log,
    sample_anchors,
    sampled_tokens,
    split_heldout,
    target_outputs,
    training_vocabulary,
)
from hf_dflash.training.loss import (
    block_hidden_states,
    chunked_token_losses,
    teacher_rows,
)
from hf_dflash.training.recipe import initial_reach_rates

TIMING = ("train_seconds", "train_cpu_seconds", "elapsed_seconds")


def _batch(target_and_tokenizer, data_file, drafter, final_hidden=True):
    """Two sequences (one shortened), every possible anchor: blocks run off the end of the response too."""
    target, tokenizer = target_and_tokenizer
    samples = load_training_samples(data_file, max_length=200, min_response_tokens=2 * BLOCK)[:2]
    samples[1] = {**samples[1], "input_ids": samples[1]["input_ids"][:-9], "loss_mask": samples[1]["loss_mask"][:-9]}
    anchors = [sample_anchors(s["loss_mask"], 1000, torch.Generator().manual_seed(i)) for i, s in enumerate(samples)]
    batch = make_block_batch(samples, anchors, BLOCK, drafter.config.mask_token_id, tokenizer.pad_token_id)
    features, final = target_outputs(target, batch.input_ids, batch.attention_mask, drafter.config.target_layer_ids,
                                      final_hidden)
    return batch, features, final


def _drafter(target, seed=0, **kwargs):
    torch.manual_seed(seed)
    return DFlashDraftModel.from_target(target, num_hidden_layers=1, block_size=BLOCK, **kwargs).eval()


def _label_log_probs(drafter, target, features, batch):
    """log q(label) and argmax == label per [b, A, B-1], computed independently of the loss code."""
    with torch.no_grad():
        hidden = block_hidden_states(drafter, target.get_input_embeddings(), features, batch)[:, :, 1:]
        log_q = torch.log_softmax(target.get_output_embeddings()(hidden).float(), dim=-1)
    labels = batch.labels.clamp_min(0)
    return log_q.gather(-1, labels[..., None])[..., 0], log_q.argmax(dim=-1) == labels


# ----------------------------------------------------------------------------------------------------------------------
# (a) distillation
def test_distillation_teacher_is_the_targets_next_token_distribution(target_and_tokenizer, data_file):
    target, _ = target_and_tokenizer
    drafter = _drafter(target)
    batch, features, final = _batch(target_and_tokenizer, data_file, drafter)
    # the same forward gives the same features, and the final hidden states give the target's logits
    torch.testing.assert_close(features, context_features(target, batch.input_ids, batch.attention_mask,
                                                          drafter.config.target_layer_ids))
    with torch.no_grad():
        logits = target(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    torch.testing.assert_close(target.lm_head(final), logits, atol=1e-5, rtol=1e-5)
    # label k of the block at anchor a is predicted by the target at position a + k - 1
    rows = teacher_rows(final, batch)
    supervised = batch.labels != IGNORE_INDEX
    for row in range(2):
        for j in range(int(batch.block_valid[row].sum())):
            anchor = int(batch.anchors[row, j])
            for k in range(1, BLOCK):
                if supervised[row, j, k - 1]:
                    assert torch.equal(rows[row, j, k - 1], final[row, anchor + k - 1]), (row, j, k)
    predicted = target.lm_head(rows).argmax(dim=-1)
    assert (predicted[supervised] == batch.labels[supervised]).float().mean() > 0.97  # regenerated greedily


def test_distillation_kl_full_and_top_k(target_and_tokenizer):
    target, _ = target_and_tokenizer
    generator = torch.Generator().manual_seed(0)
    hidden, teacher = torch.randn(7, 64, generator=generator), torch.randn(7, 64, generator=generator) * 3
    labels = torch.randint(1, 64, (7,), generator=generator)
    head = target.lm_head
    log_q = torch.log_softmax(head(hidden), dim=-1)
    teacher_logits = head(teacher)
    expected_full = (teacher_logits.softmax(-1) * (teacher_logits.log_softmax(-1) - log_q)).sum(-1)
    top = teacher_logits.topk(5, dim=-1)
    p = top.values.softmax(-1)  # renormalised over the top 5
    expected_top5 = (p * (p.log() - log_q.gather(1, top.indices))).sum(-1)
    for chunk_size in (4096, 3):  # one chunk, and checkpointed chunks
        ce, kl, hits = chunked_token_losses(hidden, labels, head, chunk_size, None, teacher, Objective(1.0))
        torch.testing.assert_close(ce, -log_q.gather(1, labels[:, None])[:, 0])
        torch.testing.assert_close(kl, expected_full)
        _, kl5, _ = chunked_token_losses(hidden, labels, head, chunk_size, None, teacher, Objective(1.0, 5))
        torch.testing.assert_close(kl5, expected_top5)
    _, kl_all, _ = chunked_token_losses(hidden, labels, head, 4096, None, teacher, Objective(1.0, 64))
    torch.testing.assert_close(kl_all, expected_full)  # top-k over the whole vocabulary = the full KL


# ----------------------------------------------------------------------------------------------------------------------
# (b) acceptance-aware loss
def test_acceptance_loss_is_minus_log_expected_acceptance(target_and_tokenizer, data_file):
    target, _ = target_and_tokenizer
    drafter = _drafter(target)
    batch, features, _ = _batch(target_and_tokenizer, data_file, drafter, final_hidden=False)
    supervised = batch.labels != IGNORE_INDEX
    assert (~supervised[batch.block_valid]).any()  # some blocks run off the end: their tail must not count
    log_p, _ = _label_log_probs(drafter, target, features, batch)
    terms = []
    for row in range(2):
        for j in range(int(batch.block_valid[row].sum())):
            expected, product = 0.0, 1.0
            for k in range(BLOCK - 1):
                if not supervised[row, j, k]:
                    break
                product *= math.exp(float(log_p[row, j, k]))
                expected += product
            terms.append(-math.log1p(expected))
    acceptance = sum(terms) / len(terms)
    weights = position_weights(BLOCK, 4.0)
    embed, head = target.get_input_embeddings(), target.get_output_embeddings()
    with torch.no_grad():
        plain = block_diffusion_loss(drafter, embed, head, features, batch, weights)
        only = block_diffusion_loss(drafter, embed, head, features, batch, weights, objective=Objective(
            acceptance_weight=1.0))
        half = block_diffusion_loss(drafter, embed, head, features, batch, weights, objective=Objective(
            acceptance_weight=0.5))
    assert float(only.loss) == pytest.approx(acceptance, rel=1e-4)
    assert float(half.loss) == pytest.approx(0.5 * float(plain.loss) + 0.5 * acceptance, rel=1e-4)
    assert torch.equal(only.weighted_ce, plain.weighted_ce)  # the reported loss stays the weighted CE


# ----------------------------------------------------------------------------------------------------------------------
# (c) dynamic position weights
def test_reached_counts_blocks_whose_earlier_drafts_were_all_right(target_and_tokenizer, data_file, monkeypatch):
    target, _ = target_and_tokenizer
    drafter = _drafter(target)
    batch, features, _ = _batch(target_and_tokenizer, data_file, drafter, final_hidden=False)
    # a half-trained-like drafter: make the first drafts right often enough for long prefixes to exist
    _, hits = _label_log_probs(drafter, target, features, batch)
    hits = hits | (torch.rand(hits.shape, generator=torch.Generator().manual_seed(0)) < 0.6)
    supervised = batch.labels != IGNORE_INDEX
    expected = torch.zeros(BLOCK - 1)
    for row in range(2):
        for j in range(int(batch.block_valid[row].sum())):
            for k in range(BLOCK - 1):
                if supervised[row, j, k] and bool(hits[row, j, :k].all()):
                    expected[k] += 1
    assert expected[0] > expected[-1] > 0
    real = loss_module.chunked_token_losses

    def scripted(hidden, labels, *args, **kwargs):
        ce, kl, _ = real(hidden, labels, *args, **kwargs)
        return ce, kl, hits[supervised]

    monkeypatch.setattr(loss_module, "chunked_token_losses", scripted)
    with torch.no_grad():
        out = block_diffusion_loss(drafter, target.get_input_embeddings(), target.get_output_embeddings(),
                                   features, batch, position_weights(BLOCK, 4.0))
    assert out.reached.tolist() == expected.tolist()
    assert out.reached[0] == out.counted[0]  # every block reaches its first draft


def test_dynamic_weights_follow_the_measured_reach_rates(workdir, data_file, target_and_tokenizer):
    target, tokenizer = target_and_tokenizer
    rates_after_step = []
    args = small_args(data_file, workdir / "dynamic", epochs=1, max_steps=6, eval_split=0.0,
                      position_weighting="acceptance", position_weight_floor=0.05)
    trainer = DFlashTrainer(args, target, tokenizer,
                            callbacks=[lambda t, log: rates_after_step.append(list(t.reach_rates))])
    trainer.train()
    used = [log["position_weights"] for log in trainer.history if "position_weights" in log]
    assert len(used) == 6
    start = initial_reach_rates(BLOCK, 4.0)
    assert used[0] == pytest.approx([max(r, 0.05) for r in start])  # the fixed weights exp(-(k-1)/gamma) at first
    for step in range(1, 6):
        assert used[step] == pytest.approx([max(r, 0.05) for r in rates_after_step[step - 1]])
        assert rates_after_step[step][0] == pytest.approx(1.0)  # every block reaches position 1
        assert min(used[step]) >= 0.05
    assert rates_after_step[-1] != pytest.approx(start, abs=1e-3)  # they moved with the measurements


# ----------------------------------------------------------------------------------------------------------------------
# (d) training-time vocabulary
def test_restricted_vocabulary_is_the_loss_over_a_smaller_head(target_and_tokenizer, data_file):
    target, _ = target_and_tokenizer
    drafter = _drafter(target)
    batch, features, final = _batch(target_and_tokenizer, data_file, drafter)
    samples = load_training_samples(data_file, max_length=200, min_response_tokens=2 * BLOCK)
    frequent = frequent_tokens(samples, 4)
    vocab = batch_vocabulary(frequent, batch.labels)
    labels = batch.labels[batch.labels != IGNORE_INDEX]
    assert set(labels.tolist()) <= set(vocab.tolist()) and set(frequent.tolist()) <= set(vocab.tolist())
    assert len(vocab) < target.config.vocab_size
    # reference: a head holding only those rows, labels renumbered by hand
    head = target.get_output_embeddings()
    small_head = torch.nn.Linear(64, len(vocab), bias=False)
    small_head.weight.data = head.weight[vocab].clone()
    renumber = {int(t): i for i, t in enumerate(vocab)}
    remapped = batch.to("cpu")
    remapped.labels = batch.labels.clone().apply_(lambda t: renumber.get(t, t) if t != IGNORE_INDEX else t)
    weights = position_weights(BLOCK, 4.0)
    embed = target.get_input_embeddings()
    objective = Objective(distill_weight=0.5, distill_top_k=3, acceptance_weight=0.3)
    with torch.no_grad():
        restricted = block_diffusion_loss(drafter, embed, head, features, batch, weights, objective=objective,
                                          teacher_hidden=final, vocab_ids=vocab)
        reference = block_diffusion_loss(drafter, embed, small_head, features, remapped, weights,
                                         objective=objective, teacher_hidden=final)
    torch.testing.assert_close(restricted.loss, reference.loss)
    assert torch.equal(restricted.correct, reference.correct)
    # sampled negatives: each stands for (V - N) / S of the other tokens, through a logit offset in the loss only
    negatives = sampled_tokens(frequent, 64, 5, torch.Generator().manual_seed(0))
    assert not set(negatives.tolist()) & set(frequent.tolist())
    vocab, offsets = training_vocabulary(frequent, batch.labels, negatives, 64)
    assert set(vocab.tolist()) == set(batch_vocabulary(frequent, batch.labels).tolist()) | set(negatives.tolist())
    extra = ~torch.isin(vocab, batch_vocabulary(frequent, batch.labels))
    assert extra.any() and torch.allclose(offsets[extra], torch.tensor(math.log((64 - 4) / 5)))
    assert (offsets[~extra] == 0).all()
    biased_head = torch.nn.Linear(64, len(vocab), bias=True)
    biased_head.weight.data, biased_head.bias.data = head.weight[vocab].clone(), offsets.clone()
    renumber = {int(t): i for i, t in enumerate(vocab)}
    remapped.labels = batch.labels.clone().apply_(lambda t: renumber.get(t, t) if t != IGNORE_INDEX else t)
    with torch.no_grad():
        sampled = block_diffusion_loss(drafter, embed, head, features, batch, weights, objective=objective,
                                       teacher_hidden=final, vocab_ids=vocab, vocab_offsets=offsets)
        reference = block_diffusion_loss(drafter, embed, biased_head, features, remapped, weights,
                                         objective=objective, teacher_hidden=final)
    torch.testing.assert_close(sampled.loss, reference.loss)


# ----------------------------------------------------------------------------------------------------------------------
# (e) initialisation from the target
@pytest.mark.parametrize("switches", [{}, {"split_context_kv": True, "layer_fusion": True}])
def test_init_from_target_copies_its_last_layers(target_and_tokenizer, switches):
    target, _ = target_and_tokenizer
    torch.manual_seed(0)
    drafter = DFlashDraftModel.from_target(target, num_hidden_layers=2, block_size=BLOCK, **switches)
    copied = initial_weights_from_target(drafter, target)
    layers = target.get_decoder().layers
    for i in range(2):
        source = dict(layers[len(layers) - 2 + i].named_parameters())
        for name, param in drafter.layers[i].named_parameters():
            origin = name.replace("_proj_target", "_proj")
            assert torch.equal(param, source[origin]), (i, name)
            assert f"layers.{i}.{name}" in copied
    assert torch.equal(drafter.norm.weight, target.get_decoder().norm.weight)


# ----------------------------------------------------------------------------------------------------------------------
# end to end: every option trains
OPTIONS = {
    "distill-full": dict(distill_weight=1.0),  # no hard labels at all: the target's distribution alone
    "distill-top4": dict(distill_weight=0.5, distill_top_k=4),
    "acceptance-loss": dict(acceptance_loss_weight=1.0),  # the acceptance-aware loss alone
    "fixed-weights": dict(position_weighting="fixed"),  # the paper's weights (measured weights are the default)
    "train-vocab": dict(train_vocab_size=6),
    "train-vocab-sampled": dict(train_vocab_size=6, train_vocab_sampled=8),
    "init-from-target": dict(init_from_target=True),
}


@pytest.mark.parametrize("name", list(OPTIONS))
def test_each_recipe_option_raises_heldout_tau(workdir, data_file, target_and_tokenizer, name):
    target, tokenizer = target_and_tokenizer
    args = small_args(data_file, workdir / f"option-{name}", epochs=2, eval_every=6, eval_split=0.2,
                      **OPTIONS[name])
    DFlashTrainer(args, target, tokenizer).train()
    evals = read_log(args.output_dir, "eval")
    assert evals[0]["step"] == 0
    untrained, trained = evals[0]["heldout"]["acceptance_length"], evals[-1]["heldout"]["acceptance_length"]
    assert untrained < 1.3 and trained > untrained + 2.0, (name, untrained, trained)
    info = json.loads((Path(args.output_dir) / "training_info.json").read_text())
    assert info["recipe"] == OPTIONS[name]


def test_teacher_forced_text_with_the_targets_labels_raises_heldout_tau(workdir, data_file, target_and_tokenizer):
    """Teacher forcing on text the target did not write (random responses) with the target's own distribution as
    every label (--distill-weight 1) raises tau on held-out text the target did write; the same text with its own
    tokens as hard labels learns nothing of the target."""
    import random

    target, tokenizer = target_and_tokenizer
    rng, lines = random.Random(0), []
    for line in data_file.read_text().splitlines():
        record = json.loads(line)
        ids, start = record["input_ids"], record["prompt_length"]
        ids[start:] = [rng.randrange(4, 64) for _ in ids[start:]]
        lines.append(json.dumps({"input_ids": ids, "prompt_length": start}))
    foreign = workdir / "foreign.jsonl"
    foreign.write_text("\n".join(lines) + "\n")
    taus = {}
    for name, weight in (("targets-labels", 1.0), ("texts-labels", 0.0)):
        args = small_args(foreign, workdir / f"teacher-forced-{name}", epochs=2, eval_split=0.2,
                          eval_data=str(data_file), distill_weight=weight)
        taus[name] = DFlashTrainer(args, target, tokenizer).train()["heldout"]["acceptance_length"]
    assert taus["texts-labels"] < 1.3 and taus["targets-labels"] > taus["texts-labels"] + 1.0, taus


# ----------------------------------------------------------------------------------------------------------------------
# learning curves
def test_training_log_and_curves_from_the_cli(workdir, target_dir, data_file):
    data = workdir / "curves.jsonl"
    data.write_text("".join(data_file.read_text().splitlines(keepends=True)[:18]))  # 16 train + 2 held-out
    output = workdir / "curves"
    assert main(["train", "--target", str(target_dir), "--data", str(data), "--output", str(output),
                 "--num-layers", "1", "--block-size", str(BLOCK), "--epochs", "2", "--lr", "3e-3",
                 "--num-anchors", "16", "--batch-size", "2", "--eval-split", "0.1", "--num-eval-prompts", "0",
                 "--save-every", "0", "--eval-every", "3", "--logging-steps", "2"]) == 0
    lines = (output / LOG_FILE).read_text().splitlines()
    records = [json.loads(line) for line in lines]
    evals = [r for r in records if r["kind"] == "eval"]
    trains = [r for r in records if r["kind"] == "train"]
    assert [r["step"] for r in evals] == [0, 3, 6, 8, 9, 12, 15, 16]  # every 3 steps + the epoch ends (8, 16)
    assert [r["step"] for r in trains] == list(range(2, 17, 2))
    for record in records:
        assert set(record) >= {"step", "epoch", "tokens", "blocks", *TIMING}
    for record in evals:
        heldout = record["heldout"]
        assert len(heldout["accuracy_by_position"]) == BLOCK - 1 and heldout["acceptance_length"] >= 1
    ordered = sorted(records, key=lambda r: (r["step"], r["kind"] == "eval"))
    for key in ("tokens", "blocks", "train_seconds", "train_cpu_seconds", "elapsed_seconds"):
        values = [r[key] for r in ordered]
        assert values == sorted(values), key
    # one epoch = every training sample once (16 samples, 2 per step), with up to 16 anchors (blocks) each
    train_samples, _ = split_heldout(load_training_samples(data, 3072, 2 * BLOCK), 0.1, 256, seed=0)
    at_epoch_end = next(r for r in evals if r["step"] == 8)
    assert at_epoch_end["tokens"] == sum(len(s["input_ids"]) for s in train_samples)
    assert at_epoch_end["blocks"] == sum(len(sample_anchors(s["loss_mask"], 16, torch.Generator())) for s in
                                         train_samples)
    assert evals[-1]["heldout"]["acceptance_length"] > evals[0]["heldout"]["acceptance_length"] + 2
    png = output / "training_curves.png"
    try:
        import matplotlib  # noqa: F401 (a dev dependency; without it no PNG, and no error)
    except ImportError:
        assert not png.exists()
    else:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    results = json.loads((output / "eval.json").read_text())
    assert results["compute"]["tokens"] == records[-1]["tokens"]


def test_cpu_budget_stops_training_and_still_evaluates(workdir, data_file, target_and_tokenizer):
    target, tokenizer = target_and_tokenizer
    args = small_args(data_file, workdir / "budget", eval_split=0.1, max_cpu_seconds=1e-9)
    results = DFlashTrainer(args, target, tokenizer).train()
    assert results["steps"] == 1
    evals = read_log(args.output_dir, "eval")
    assert [r["step"] for r in evals] == [1] and results["heldout"] == evals[-1]["heldout"]
    assert (Path(args.output_dir) / "checkpoints" / "checkpoint-1").is_dir()


def ids(samples: list[dict]) -> list[tuple[int, ...]]:
    """The token ids of each sample, comparable across trainers."""
    return [tuple(map(int, s["input_ids"])) for s in samples]


def test_max_train_samples_keeps_the_held_out_set(workdir, data_file, target_and_tokenizer):
    """A data-scaling run trains on fewer samples and is measured on exactly the same held-out samples."""
    target, tokenizer = target_and_tokenizer
    full = DFlashTrainer(small_args(data_file, workdir / "all", eval_split=0.2), target, tokenizer)
    fewer = DFlashTrainer(small_args(data_file, workdir / "fewer", eval_split=0.2, max_train_samples=3),
                          target, tokenizer)
    assert ids(fewer.train_samples) == ids(full.train_samples)[:3] and len(full.train_samples) > 3
    assert ids(fewer.eval_samples) == ids(full.eval_samples) != []


def test_eval_data_holds_out_the_same_samples_as_a_run_on_that_file(workdir, data_file, target_and_tokenizer):
    """Runs on other data (e.g. + teacher-forced conversations) are measured on the held-out set of a run on
    --eval-data, and never train on those held-out samples even when their data contains them."""
    target, tokenizer = target_and_tokenizer
    lines = data_file.read_text().splitlines()
    other = workdir / "other.jsonl"  # the same records reversed, plus copies: positions differ from data_file's
    other.write_text("\n".join(lines[::-1] + lines[:3]) + "\n")
    reference = DFlashTrainer(small_args(data_file, workdir / "ref", eval_split=0.2), target, tokenizer)
    args = small_args(other, workdir / "eval-data", eval_split=0.2, eval_data=str(data_file),
                      feature_cache=str(workdir / "eval-data-cache"), max_steps=1, epochs=1)
    trainer = DFlashTrainer(args, target, tokenizer)
    assert ids(trainer.eval_samples) == ids(reference.eval_samples) != []
    assert [s["index"] for s in trainer.eval_samples] == [s["index"] for s in reference.eval_samples]
    assert not set(ids(trainer.eval_samples)) & set(ids(trainer.train_samples))
    held = set(ids(reference.eval_samples))
    assert len(trainer.train_samples) == sum(tuple(json.loads(line)["input_ids"]) not in held
                                             for line in other.read_text().splitlines())
    trainer.train()  # held-out features go to a cache of their own (indices of --eval-data)
    assert (workdir / "eval-data-cache" / "eval" / "cache.json").exists()
    with pytest.raises(ValueError, match="needs --eval-split"):
        DFlashTrainer(small_args(other, workdir / "no-split", eval_split=0.0, eval_data=str(data_file)), target,
                      tokenizer)


def test_draft_vocab_size_exports_the_most_frequent_response_tokens(workdir, data_file, target_and_tokenizer):
    target, tokenizer = target_and_tokenizer
    args = small_args(data_file, workdir / "draft-vocab", epochs=1, max_steps=2, eval_split=0.0, draft_vocab_size=7)
    trainer = DFlashTrainer(args, target, tokenizer)
    trainer.train()
    drafter = DFlashDraftModel.from_pretrained(args.output_dir)
    assert drafter.config.draft_vocab_size == 7
    assert drafter.draft_token_ids().tolist() == frequent_tokens(trainer.train_samples, 7).tolist()
    info = json.loads((Path(args.output_dir) / "training_info.json").read_text())
    assert info["recipe"]["draft_vocab_size"] == 7


def test_training_info_records_the_epochs_trained_not_the_epochs_asked_for(workdir, data_file, target_and_tokenizer):
    # --epochs is an upper bound: a run that --max-steps stops early must not tell its model card it trained 100 epochs
    target, tokenizer = target_and_tokenizer
    args = small_args(data_file, workdir / "epochs", epochs=100, max_steps=7, eval_split=0.0)
    trainer = DFlashTrainer(args, target, tokenizer)
    results = trainer.train()
    trained = round(7 / len(trainer.epoch_groups(0)), 2)  # 7 steps of an epoch's micro-batch groups
    assert results["epochs"] == trained < 1
    info = json.loads((Path(args.output_dir) / "training_info.json").read_text())
    assert info["epochs"] == trained
    assert f"/ {trained} |" in (Path(args.output_dir) / "README.md").read_text()  # the model card's table


# ----------------------------------------------------------------------------------------------------------------------
# resume and DFlare with every option on
ALL_OPTIONS = dict(distill_weight=0.5, distill_top_k=4, acceptance_loss_weight=0.3, position_weighting="acceptance",
                   train_vocab_size=6, train_vocab_sampled=8, init_from_target=True)


class Killed(Exception):
    pass


def _without_timing(records):
    return [{k: v for k, v in r.items() if k not in TIMING} for r in records]


@pytest.mark.parametrize("variant", ["dflash", "dflare"])
def test_resume_is_exact_with_every_option_on(workdir, data_file, target_and_tokenizer, variant):
    target, tokenizer = target_and_tokenizer
    data = workdir / "resume-options.jsonl"
    data.write_text("".join(data_file.read_text().splitlines(keepends=True)[:16]))
    settings = dict(epochs=2, grad_accum=2, save_every=3, eval_split=0.1, seed=3, eval_every=2, logging_steps=1,
                    variant=variant, **ALL_OPTIONS)
    straight = DFlashTrainer(small_args(data, workdir / f"straight-{variant}", **settings), target, tokenizer)
    straight.train()
    assert straight.global_step == 8

    def kill_at_step_7(trainer, log):
        if log["step"] == 7:  # after the log got step 7's records; the last checkpoint is step 6's
            raise Killed

    killed = workdir / f"killed-{variant}"
    with pytest.raises(Killed):
        DFlashTrainer(small_args(data, killed, **settings), target, tokenizer, callbacks=[kill_at_step_7]).train()
    assert any(r["step"] == 7 for r in read_log(killed))  # written before the kill, to be dropped on resume
    resumed = DFlashTrainer(small_args(data, killed, resume=True, **settings), target, tokenizer)
    resumed.train()
    assert resumed.history == straight.history
    final_straight = straight.accelerator.unwrap_model(straight.model).state_dict()
    final_resumed = resumed.accelerator.unwrap_model(resumed.model).state_dict()
    assert all(torch.equal(final_straight[k], final_resumed[k]) for k in final_straight)
    straight_log, resumed_log = read_log(workdir / f"straight-{variant}"), read_log(killed)
    assert _without_timing(resumed_log) == _without_timing(straight_log)  # no duplicates, nothing lost
    keys = [(r["kind"], r["step"]) for r in resumed_log]
    assert len(keys) == len(set(keys))
    assert resumed_log[-1]["train_cpu_seconds"] >= straight_log[-1]["train_cpu_seconds"] * 0.5  # counts continued
    # DFlare still trains with the options (and saves its own layout)
    evals = [r for r in resumed_log if r["kind"] == "eval"]
    assert evals[-1]["heldout"]["acceptance_length"] > evals[0]["heldout"]["acceptance_length"] + 1.0
    config = json.loads((killed / "config.json").read_text())
    assert config["architectures"] == ["QwenDFlareDraftModel" if variant == "dflare" else "DFlashDraftModel"]


def test_feature_cache_keeps_final_hidden_states_for_distillation(workdir, data_file, target_and_tokenizer):
    target, tokenizer = target_and_tokenizer
    data = workdir / "cache-distill.jsonl"
    data.write_text("".join(data_file.read_text().splitlines(keepends=True)[:8]))
    options = dict(eval_split=0.0, distill_weight=1.0, distill_top_k=4)
    plain = DFlashTrainer(small_args(data, workdir / "distill-plain", **options), target, tokenizer)
    plain.train()
    cache = workdir / "distill-features"
    cached = DFlashTrainer(small_args(data, workdir / "distill-cached", feature_cache=str(cache), **options),
                           target, tokenizer)
    calls = []
    hook = target.register_forward_hook(lambda *a: calls.append(1))
    try:
        cached.train()  # epoch 0 fills the cache (features + final hidden states), epoch 1 runs no target forward
    finally:
        hook.remove()
    assert len(list(cache.glob("*.final.pt"))) == 8 and len(calls) == 4  # 8 samples, 2 per batch, epoch 0 only
    losses = [[log["loss"] for log in t.history] for t in (plain, cached)]
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)


def test_runs_started_before_the_new_options_still_resume(workdir, data_file, target_and_tokenizer):
    target, tokenizer = target_and_tokenizer
    args = small_args(data_file, workdir / "old-run", epochs=1, max_steps=2, eval_split=0.0, save_every=1,
                      position_weighting="fixed")  # what runs before the options used
    DFlashTrainer(args, target, tokenizer).train()
    run_args = Path(args.output_dir) / "run_args.json"
    saved = json.loads(run_args.read_text())
    for name in ("distill_weight", "distill_top_k", "acceptance_loss_weight", "position_weighting",
                 "position_weight_floor", "train_vocab_size", "train_vocab_sampled", "init_from_target"):
        del saved[name]  # as written before these options existed
    run_args.write_text(json.dumps(saved))
    # such a run used the paper's fixed position weights: resuming it asks for them, as the error says
    with pytest.raises(ValueError, match="different run.*position_weighting: saved 'fixed', now 'acceptance'"):
        DFlashTrainer(small_args(data_file, workdir / "old-run", epochs=1, max_steps=2, eval_split=0.0, save_every=1,
                                 resume=True), target, tokenizer)
    resumed = DFlashTrainer(small_args(data_file, workdir / "old-run", epochs=1, max_steps=2, eval_split=0.0,
                                       save_every=1, resume=True, position_weighting="fixed"), target, tokenizer)
    assert resumed.resume_from is not None
    with pytest.raises(ValueError, match="different run.*distill_weight"):
        DFlashTrainer(small_args(data_file, workdir / "old-run", epochs=1, max_steps=2, eval_split=0.0, save_every=1,
                                 distill_weight=0.5, resume=True), target, tokenizer)


def test_stop_at_step_is_a_stage_of_the_same_schedule(workdir, data_file, target_and_tokenizer):
    """--stop-at-step ends the run early on the schedule of --max-steps (not a shorter one), and resuming without it
    finishes the same run: a stage and its continuation are the uninterrupted run, step for step."""
    target, tokenizer = target_and_tokenizer
    whole = DFlashTrainer(small_args(data_file, workdir / "whole", max_steps=6), target, tokenizer)
    whole.train()
    staged = small_args(data_file, workdir / "staged", max_steps=6, stop_at_step=3)
    assert DFlashTrainer(staged, target, tokenizer).train()["steps"] == 3
    rest = DFlashTrainer(dataclasses.replace(staged, stop_at_step=None, resume=True), target, tokenizer)
    rest.train()
    steps = lambda trainer: [h for h in trainer.history if "loss" in h]  # noqa: E731
    assert [h["step"] for h in steps(rest)] == [h["step"] for h in steps(whole)] == list(range(1, 7))
    for mine, theirs in zip(steps(rest), steps(whole)):
        assert mine["lr"] == theirs["lr"] and mine["loss"] == pytest.approx(theirs["loss"], rel=1e-5), mine["step"]
