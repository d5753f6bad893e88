# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""Every target family with published DFlash drafters (and more), as tiny random configs: greedy batch 1, a
left-padded batch with rows of different lengths and acceptances, sampling, a prompt longer than a small sliding
window and generation across it, EOS inside a block. README's support matrix is this file's FAMILIES.

Hybrid families (Qwen3.5, Qwen3-Next, Falcon-H1, GraniteMoeHybrid) keep recurrent states that a verify forward
advances through every draft; sliding-window families (Mistral, Gemma 2/3/4, gpt-oss, Qwen2 with
use_sliding_window) keep only a window of cache slots. Scripted drafters accept some drafts and reject others, so
every cycle kind (full acceptance, partial acceptance with a rewind, rejection) runs.
"""

import contextlib
import functools

import pytest
import torch
from conftest import FAMILIES, VOCAB, WINDOW, every_policy_path, family_target, plain_generate

import hf_dflash
from hf_dflash.candidates_dflash import DFlashCandidateGenerator


def family_drafter(target):
    torch.manual_seed(1)
    return hf_dflash.DFlashDraftModel.from_target(target, num_hidden_layers=1, block_size=6).eval()


def prompt(length: int, seed: int) -> torch.Tensor:
    return torch.randint(1, VOCAB, (1, length), generator=torch.Generator().manual_seed(seed))


def left_padded(*prompts) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(p.shape[1] for p in prompts)
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, p in enumerate(prompts):
        ids[row, width - p.shape[1] :], mask[row, width - p.shape[1] :] = p[0], 1
    return ids, mask


class ScriptedRows:
    """Inside the block every DFlash drafter proposes, for each row, the reference continuation of that row (its new
    tokens in a plain run). With `corrupt`, row r's c-th proposal has one wrong token, at draft index (c + r) % 4
    (the first draft: nothing accepted; later: a partial acceptance), except when (c + r) % 3 == 2: all right (a
    full acceptance). Draft scores are a point mass on the proposal, so q stays exact for sampling too."""

    def __init__(self, reference: torch.Tensor, prompt_length: int, corrupt: bool = True):
        self.continuations = [row[prompt_length:].tolist() for row in reference]
        self.prompt_length, self.corrupt = prompt_length, corrupt
        self.proposals = [0] * len(self.continuations)
        self.original = DFlashCandidateGenerator.propose

    def __enter__(self):
        scripted = self

        def propose(generator, histories, context, context_positions, anchor_positions, slot_mask=None,
                    num_drafts=None):
            drafts, scores = scripted.original(generator, histories, context, context_positions, anchor_positions,
                                               slot_mask, num_drafts)
            drafts = drafts.clone()
            for r, history in enumerate(histories):
                done = history[scripted.prompt_length :].tolist()
                row = next((i for i, c in enumerate(scripted.continuations) if c[: len(done)] == done), None)
                assert row is not None, "this row already differs from its plain generate() continuation"
                continuation, count = scripted.continuations[row], scripted.proposals[row]
                for j in range(drafts.shape[1]):
                    if len(done) + j < len(continuation):
                        drafts[r, j] = continuation[len(done) + j]
                wrong = (count + row) % 4  # rows differ: in a batch they accept different numbers of drafts
                if scripted.corrupt and (count + row) % 3 != 2 and wrong < drafts.shape[1]:
                    drafts[r, wrong] = (int(drafts[r, wrong]) + 1) % VOCAB
                scripted.proposals[row] += 1
            point_mass = torch.full_like(scores, float("-inf"))
            point_mass.scatter_(2, drafts[..., None], 0.0)
            return drafts, point_mass

        DFlashCandidateGenerator.propose = propose
        return self

    def __exit__(self, *exc):
        DFlashCandidateGenerator.propose = self.original


def recurrent_states(output) -> list[torch.Tensor]:
    """The recurrent / convolution states of the cache a generate() call returned (none for attention-only caches)."""
    cache = getattr(output, "cache", None) or output.past_key_values
    states = []
    for layer in cache.layers:
        for kind in ("recurrent_states", "conv_states"):
            states += [s[..., -4:] if kind == "conv_states" else s for s in getattr(layer, kind, {}).values()
                       if s is not None]
    return states


NEW = 24  # new tokens: with 12-token prompts, generation crosses the 8-token window


def repetitive_prompt(length: int, seed: int) -> torch.Tensor:
    """A prompt that repeats a 4-token phrase: prompt lookup finds continuations in it."""
    return prompt(4, seed).repeat(1, length // 4 + 1)[:, :length]


@pytest.mark.parametrize("policy", ["full", "cost"])
@pytest.mark.parametrize("family", FAMILIES)
def test_family_is_lossless(family, policy):
    """Per family: greedy batch 1 (drafts accepted fully, partly and not at all), a left-padded batch of two rows of
    different lengths and acceptances (each row also equal to its prompt generated alone), sampling whose target law
    is a point mass (top_k=1: the sampler, its residuals and rewinds must give greedy), and EOS inside a block. The
    12-token prompts are longer than the 8-token sliding window of the windowed families. Under the full-block policy
    and under the default one, made to take each of its paths (its own choice, plain steps, lookup chains at batch
    size 1, full blocks)."""
    target = family_target(family)
    drafter = family_drafter(target)
    paths = every_policy_path if policy == "cost" else functools.partial(contextlib.nullcontext, [])
    generate = functools.partial(target.generate, assistant_model=drafter, dflash_policy=policy)

    ids = prompt(12, seed=1) if policy == "full" else repetitive_prompt(12, seed=1)
    dict_output = dict(return_dict_in_generate=True, output_logits=True)
    expected = plain_generate(target, ids, max_new_tokens=NEW, **dict_output)
    with ScriptedRows(expected.sequences, ids.shape[1], corrupt=True), paths() as choices:
        got = generate(ids, max_new_tokens=NEW, do_sample=False, **dict_output)
    assert got.sequences.tolist() == expected.sequences.tolist(), "greedy, batch 1"
    # the logits too: a tiny random target may keep its argmax under a slightly wrong state (e.g. a recurrent state
    # that also read rejected drafts), its logits do not
    torch.testing.assert_close(torch.stack(got.logits), torch.stack(expected.logits), rtol=1e-5, atol=1e-5)
    # and the recurrent states the target ends with (they hold the same tokens: all but the last)
    for ours, plain in zip(recurrent_states(got), recurrent_states(expected)):
        torch.testing.assert_close(ours, plain, rtol=1e-4, atol=1e-7)
    stats = drafter.last_stats
    lengths = stats.acceptance_lengths
    assert 1 in lengths and len(set(lengths)) > 2, lengths  # rejected and partly accepted cycles
    if policy == "full":
        assert 6 in lengths, lengths  # and fully accepted ones
    else:
        assert 0 in stats.drafts_per_cycle and stats.lookup_cycles > 0, (choices, stats.drafts_per_cycle)

    batch, mask = left_padded(prompt(12, seed=2), prompt(7, seed=3))
    expected = plain_generate(target, batch, attention_mask=mask, max_new_tokens=NEW, pad_token_id=0)
    with ScriptedRows(expected, batch.shape[1], corrupt=True), paths():
        got = generate(batch, attention_mask=mask, max_new_tokens=NEW, do_sample=False, pad_token_id=0)
        sampled = generate(batch, attention_mask=mask, max_new_tokens=NEW, do_sample=True, top_k=1, pad_token_id=0)
    if policy == "cost":
        assert 0 in drafter.last_stats.drafts_per_cycle, "plain steps in a batch"
    assert got.tolist() == expected.tolist(), "greedy, left-padded batch"
    assert sampled.tolist() == expected.tolist(), "sampling (point-mass law), left-padded batch"
    alone = plain_generate(target, batch[1:, batch.shape[1] - 7 :], max_new_tokens=NEW)
    assert got[1, batch.shape[1] :].tolist() == alone[0, 7:].tolist(), "a padded row equals its prompt alone"

    free = plain_generate(target, ids, max_new_tokens=NEW)[0, 12:].tolist()
    eos = next((t for i, t in enumerate(free) if i >= 3 and t not in free[:i]), free[1])  # first emitted mid-way
    expected = plain_generate(target, ids, max_new_tokens=NEW, eos_token_id=eos)
    with ScriptedRows(torch.tensor([ids[0].tolist() + free]), 12, corrupt=False), paths():
        got = generate(ids, max_new_tokens=NEW, do_sample=False, eos_token_id=eos)
    assert got.tolist() == expected.tolist() and got[0, -1] == eos, "EOS inside a block"


def test_sliding_window_batch_regression_mistral():
    """The bug this file was written for: in a left-padded batch a row's rejected drafts stayed in the cache as
    masked slots, so a window of W slots held fewer than W real tokens and both rows drifted from plain decoding."""
    target = family_target("mistral")
    drafter = family_drafter(target)
    ids, mask = left_padded(prompt(14, seed=7), prompt(10, seed=8))
    expected = plain_generate(target, ids, attention_mask=mask, max_new_tokens=24, pad_token_id=0)
    with ScriptedRows(expected, ids.shape[1], corrupt=True):  # rows accept different numbers of drafts
        got = target.generate(ids, attention_mask=mask, assistant_model=drafter, max_new_tokens=24, do_sample=False,
                              pad_token_id=0)
    assert got.tolist() == expected.tolist()


# ----------------------------------------------------------------------------------------------------------------------
# drafters with sliding-window layers (newer published drafters: Qwen3.5/3.6, gemma-4)
def sliding_drafter(target, window: int = 4):
    torch.manual_seed(1)
    return hf_dflash.DFlashDraftModel.from_target(
        target, num_hidden_layers=2, block_size=4, layer_types=["sliding_attention", "full_attention"],
        sliding_window=window,
    ).eval()


def test_from_target_builds_sliding_window_layers_and_they_round_trip(tmp_path):
    drafter = sliding_drafter(family_target("qwen3"))
    assert drafter.config.layer_types == ["sliding_attention", "full_attention"] and drafter.config.sliding_window == 4
    drafter.save_pretrained(tmp_path)
    loaded = hf_dflash.DFlashDraftModel.from_pretrained(tmp_path)
    assert loaded.config.layer_types == drafter.config.layer_types and loaded.config.sliding_window == 4


def test_sliding_layers_ignore_context_beyond_their_window():
    """Only the first (sliding) layer runs: the block's output must not change when context features further than
    the window from every query change, and must change when a feature inside the window does."""
    target = family_target("qwen3")
    drafter = sliding_drafter(target, window=4)
    drafter.layers = drafter.layers[:1]  # the sliding layer alone
    width = len(drafter.config.target_layer_ids) * 64
    context = torch.randn(1, 10, width, generator=torch.Generator().manual_seed(0))
    block = target.get_input_embeddings()(torch.tensor([[5, 95, 95, 95]]))
    positions = torch.arange(14)[None]  # context 0..9, block 10..13: the anchor at 10 sees keys 7..13

    def run(features):
        return drafter(noise_embeds=block, context_hidden_states=features, position_ids=positions).last_hidden_state

    base = run(context)
    far = context.clone()
    far[:, :7] += 1.0  # positions 0..6: outside every query's window
    torch.testing.assert_close(run(far), base)
    near = context.clone()
    near[:, 8] += 1.0
    assert not torch.allclose(run(near), base)

    # masked slots (left padding, rejected drafts) take no window place: two junk slots inserted before position 8
    # leave the output as it is
    junk = torch.randn(1, 2, width, generator=torch.Generator().manual_seed(1))
    padded = torch.cat([context[:, :8], junk, context[:, 8:]], dim=1)
    slots = torch.ones(1, 16, dtype=torch.bool)
    slots[0, 8:10] = False
    slot_positions = torch.cat([torch.arange(8), torch.tensor([7, 7]), torch.arange(8, 14)])[None]
    out = drafter(noise_embeds=block, context_hidden_states=padded, position_ids=slot_positions,
                  attention_mask=slots).last_hidden_state
    torch.testing.assert_close(out, base)


@pytest.mark.parametrize("family", ["qwen3", "gemma3"])
def test_sliding_window_drafter_is_lossless_and_drafts_as_without_cache(family):
    """In generate, the drafter reads its context from a cache across cycles (and left padding in a batch); its
    window must cover the same positions as a fresh forward over the whole context would."""
    target = family_target(family)
    drafter = sliding_drafter(target, window=4)
    batch, mask = left_padded(prompt(12, seed=9), prompt(7, seed=10))
    expected = plain_generate(target, batch, attention_mask=mask, max_new_tokens=NEW, pad_token_id=0)
    got = target.generate(batch, attention_mask=mask, assistant_model=drafter, max_new_tokens=NEW, do_sample=False,
                          pad_token_id=0)
    assert got.tolist() == expected.tolist()

    ids = prompt(12, seed=9)
    seen = []
    original = DFlashCandidateGenerator.propose

    def spy(generator, histories, context, context_positions, anchor_positions, slot_mask=None, num_drafts=None):
        seen.append((histories[0].clone(), context_positions.clone()))
        return original(generator, histories, context, context_positions, anchor_positions, slot_mask, num_drafts)

    DFlashCandidateGenerator.propose = spy
    try:
        target.generate(ids, assistant_model=drafter, max_new_tokens=NEW, do_sample=False)
    finally:
        DFlashCandidateGenerator.propose = original
    history = seen[-1][0]  # the last drafting call: its context is every committed token but the anchor
    out = target(input_ids=history[None, :-1], output_hidden_states=True)
    features = hf_dflash.modeling_dflash.target_features(out.hidden_states, drafter.config.target_layer_ids)
    anchor = len(history) - 1
    block = target.get_input_embeddings()(
        torch.tensor([[int(history[-1])] + [drafter.config.mask_token_id] * 3]))
    fresh = drafter(noise_embeds=block, context_hidden_states=features, position_ids=torch.arange(anchor + 4)[None])
    generator = DFlashCandidateGenerator(drafter, target, target.generation_config)
    cached = generator.cache
    first = target(input_ids=history[None, :-1], output_hidden_states=True)  # same features, fed in two parts
    split = anchor - 3
    part1 = hf_dflash.modeling_dflash.target_features(first.hidden_states, drafter.config.target_layer_ids)
    drafter(noise_embeds=block, context_hidden_states=part1[:, :split], position_ids=torch.arange(split + 4)[None],
            past_key_values=cached)
    cached.crop(-4)
    incremental = drafter(noise_embeds=block, context_hidden_states=part1[:, split:],
                          position_ids=torch.cat([torch.arange(split, anchor), torch.arange(anchor, anchor + 4)])[None],
                          past_key_values=cached)
    torch.testing.assert_close(incremental.last_hidden_state, fresh.last_hidden_state, rtol=1e-4, atol=1e-5)


def test_training_blocks_of_a_sliding_drafter_see_what_inference_sees():
    """The one-forward training layout (all blocks of a sequence at once, block mask + window) gives each block what
    a generation-time drafter call gives it: context before its anchor, within the window of sliding layers."""
    from hf_dflash.training.features import context_features
    from hf_dflash.training.loss import block_hidden_states
    from hf_dflash.training.recipe import make_block_batch

    target = family_target("qwen3")
    drafter = sliding_drafter(target, window=5)
    ids = prompt(24, seed=11)[0]
    sample = {"index": 0, "input_ids": ids, "loss_mask": torch.arange(24) >= 6}
    batch = make_block_batch([sample], [torch.tensor([6, 11, 17])], block_size=4,
                             mask_token_id=drafter.config.mask_token_id, pad_token_id=0)
    layer_ids = drafter.config.target_layer_ids
    features = context_features(target, batch.input_ids, batch.attention_mask, layer_ids)
    embed = target.get_input_embeddings()
    with torch.no_grad():
        hidden = block_hidden_states(drafter, embed, features, batch)
        for j, anchor in enumerate([6, 11, 17]):
            block = torch.tensor([[int(ids[anchor])] + [drafter.config.mask_token_id] * 3])
            alone = drafter(noise_embeds=embed(block), context_hidden_states=features[:, :anchor],
                            position_ids=torch.arange(anchor + 4)[None]).last_hidden_state
            torch.testing.assert_close(hidden[0, j], alone[0], atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("family", ["qwen3_5", "gemma3", "gpt_oss", "falcon_h1", "mistral"])
def test_regenerate_and_train_on_family(family, tmp_path):
    """`hf-dflash regenerate` and `train` run on hybrid, Gemma and sliding-window targets: the target regenerates
    responses (batched, left-padded), a drafter trains on them and measures tau with real generate()."""
    import json

    from conftest import make_tokenizer

    from hf_dflash.data import RegenerationArguments, regenerate
    from hf_dflash.training import DFlashTrainer, DFlashTrainingArguments

    target, tokenizer = family_target(family), make_tokenizer(VOCAB)
    tokenizer.pad_token = "<unk>"
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": " ".join(f"t{(7 * i + j) % 90 + 2}" for j in range(5 + i % 4))})
                               + "\n" for i in range(10)))
    data = tmp_path / "train.jsonl"
    counts = regenerate(RegenerationArguments(target=family, prompts=str(prompts), output=str(data),
                                              max_new_tokens=24, batch_size=4, block_size=4), target, tokenizer)
    assert counts["kept"] == 10
    args = DFlashTrainingArguments(target=family, data=str(data), output_dir=str(tmp_path / "out"), num_layers=1,
                                   block_size=4, epochs=1, num_anchors=8, batch_size=2, max_steps=3, eval_split=0.2,
                                   num_eval_prompts=2, eval_max_new_tokens=8, save_every=0)
    results = DFlashTrainer(args, target, tokenizer).train()
    assert results["steps"] == 3 and results["tau"] >= 1.0
    loaded = hf_dflash.DFlashDraftModel.from_pretrained(tmp_path / "out")
    ids = prompt(9, seed=12)
    assert (target.generate(ids, assistant_model=loaded, max_new_tokens=12, do_sample=False).tolist()
            == plain_generate(target, ids, max_new_tokens=12).tolist())
