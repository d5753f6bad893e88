# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""The decoding loop on a static target cache (``cache_implementation="static"``, or a StaticCache passed in) is
lossless exactly as on the dynamic one: every check runs over both caches.

On a static cache the target's verify writes into preallocated K/V, a rejected draft is given back by rewinding the
layer's length (``crop(-n)``), a tree's mask spans the cache's whole length and its accepted path's K/V move within
the layer, finished batch rows are selected out of the layer, and a batch's padding slots are squeezed out when the
cache runs short (hf_dflash/cache_dflash.py). Targets a static cache cannot serve raise a ValueError before any work.
"""

import contextlib

import pytest
import torch
from conftest import (
    ARCHS,
    PAD,
    VOCAB,
    alone,
    assert_lossless,
    assert_same,
    cached_target,
    every_policy_path,
    family_target,
    left_padded,
    make_drafter,
    make_prompt,
    needs_static_crop,
    new_tokens,
    per_row_scripts,
    row_new_tokens,
    scripted_drafts,
)
from transformers.cache_utils import DynamicCache, StaticCache, StaticLayer

from hf_dflash import generation_dflash
from hf_dflash.cache_dflash import cache_argument, compact_slots
from hf_dflash.candidates_dflash import DFlashCandidateGenerator

# cache_implementation: the dynamic cache (transformers' default), and the static one
CACHES = (None, pytest.param("static", marks=needs_static_crop))
NEW = 30


def plain_on_both_caches(target, prompt, **kwargs):
    """Plain ``generate`` on the static cache; it must equal plain ``generate`` on the dynamic one."""
    kwargs.setdefault("do_sample", False)
    static = target.generate(prompt, cache_implementation="static", **kwargs)
    assert_same(static, target.generate(prompt, **kwargs), "plain generate, static against dynamic cache: ")
    return static


@contextlib.contextmanager
def caches_used():
    """Yields the list of the target caches the DFlash loop decodes on, one per call."""
    used, original = [], generation_dflash.empty_target_cache

    def recording(*args, **kwargs):
        used.append(original(*args, **kwargs))
        return used[-1]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(generation_dflash, "empty_target_cache", recording)
        yield used


def assert_cache_kind(used, cache_implementation) -> None:
    kind = StaticCache if cache_implementation == "static" else DynamicCache
    assert used and all(type(cache) is kind for cache in used), [type(c).__name__ for c in used]


# ----------------------------------------------------------------------------------------------------------------------
# greedy: chains, the default policy, trees, batches, each identical to plain generate on both caches
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("cache_implementation", CACHES)
@pytest.mark.parametrize("block_size", [8, 16])
def test_chains_match_plain(arch, cache_implementation, block_size):
    """Random (bad), oracle (good) and noisy drafters; the oracle's whole blocks are accepted. Blocks of 16: a verify
    of 9..15 rows is padded to 16 on this CPU (conftest), but not past a static cache's end (the last block here)."""
    target, drafter = cached_target(arch), make_drafter(cached_target(arch), block_size)
    prompt = make_prompt(9, seed=1)
    reference = plain_on_both_caches(target, prompt, max_new_tokens=NEW)
    accepted = {}
    with caches_used() as used:
        assert_lossless(target, drafter, prompt, reference=reference, max_new_tokens=NEW,
                        cache_implementation=cache_implementation,
                        check=lambda kind, *_: accepted.setdefault(kind, drafter.last_stats.acceptance_lengths))
    assert_cache_kind(used, cache_implementation)
    assert max(accepted["oracle"]) == block_size and min(accepted["random"]) == 1


@pytest.mark.parametrize("cache_implementation", CACHES)
def test_default_policy_matches_plain(cache_implementation):
    """dflash_policy="cost" made to take each of its paths in turn: its own choice, plain steps, lookup chains and
    full blocks."""
    target = cached_target("qwen3")
    drafter = make_drafter(target, 8)
    prompt = make_prompt(11, seed=2)
    reference = plain_on_both_caches(target, prompt, max_new_tokens=NEW)
    with every_policy_path() as made, caches_used() as used:
        assert_lossless(target, drafter, prompt, ("random", "oracle"), reference=reference, max_new_tokens=NEW,
                        assisted=dict(dflash_policy="cost", prompt_lookup_num_tokens=3),
                        cache_implementation=cache_implementation)
    assert_cache_kind(used, cache_implementation)
    assert {d.count for d in made} >= {0, 7} and any(d.from_lookup for d in made)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("cache_implementation", CACHES)
@pytest.mark.parametrize("budget", [6, 40])
def test_trees_match_plain(arch, cache_implementation, budget):
    """Trees of 6 and of 40 nodes (more than a static cache has left near the end of the call: the tree is cut to
    what fits), the n-gram branch included; "ranked" drafts put the target's token second behind a decoy (a chain
    rejects it, the tree finds it)."""
    target, drafter = cached_target(arch), make_drafter(cached_target(arch), 8)
    prompt = make_prompt(7, seed=3)
    reference = plain_on_both_caches(target, prompt, max_new_tokens=NEW)
    with caches_used() as used:
        assert_lossless(target, drafter, prompt, ("random", "oracle", "ranked", "half-ranked"), reference=reference,
                        assisted=dict(dflash_tree_budget=budget, prompt_lookup_num_tokens=3), max_new_tokens=NEW,
                        cache_implementation=cache_implementation)
    assert_cache_kind(used, cache_implementation)
    assert max(drafter.last_stats.drafts_per_cycle) <= budget + 3


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("cache_implementation", CACHES)
def test_batch_rows_finishing_at_different_times_match_plain(arch, cache_implementation):
    """A left-padded batch whose rows stop at an EOS at different times (finished rows leave the cache), and rows
    that accept very differently (a perfect row next to bad ones: their rejected slots fill a static cache, which is
    then compacted)."""
    target, drafter = cached_target(arch), make_drafter(cached_target(arch), 8)
    prompts = [make_prompt(n, seed=50 + n) for n in (5, 8, 2)]
    eos = alone(target, prompts[1], max_new_tokens=NEW)[6]
    ids, mask = left_padded(prompts)
    kwargs = dict(attention_mask=mask, max_new_tokens=NEW, pad_token_id=PAD, eos_token_id=eos, do_sample=False)
    plain = plain_on_both_caches(target, ids, **kwargs)
    with caches_used() as used:
        got = target.generate(ids, assistant_model=drafter, cache_implementation=cache_implementation, **kwargs)
    assert_same(got, plain, "rows finishing early: ")
    assert_cache_kind(used, cache_implementation)
    assert len({len(row_new_tokens(got, ids, r)) for r in range(3)}) > 1  # the rows did finish at different times

    prompts = [make_prompt(n, seed=30 + n) for n in (9, 4, 6)]
    expected = [alone(target, p, max_new_tokens=NEW) for p in prompts]
    ids, mask = left_padded(prompts)
    compactions, compact = [], generation_dflash.compact_slots
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(generation_dflash, "compact_slots", lambda *a, **k: compactions.append(1) or compact(*a, **k))
        with per_row_scripts(ids, expected, corrupt=[0.0, 0.6, 0.15]):
            got = target.generate(ids, attention_mask=mask, assistant_model=drafter, max_new_tokens=NEW,
                                  pad_token_id=PAD, cache_implementation=cache_implementation)
    assert [row_new_tokens(got, ids, r) for r in range(3)] == expected
    assert bool(compactions) == (cache_implementation == "static")


@pytest.mark.parametrize("cache_implementation", CACHES)
def test_a_batch_whose_rows_swap_acceptances_near_the_end_fits(cache_implementation):
    """Row 0 accepts whole blocks, then nothing from its 16th new token on; row 1 nothing, then whole blocks from its
    8th. Near the end the row with the most real slots has unread padding slots (drafts it rejected while row 1
    accepted them), which compaction cannot squeeze out of the drafter's cache: the static cache's block of headroom
    takes them."""
    target, drafter = cached_target("qwen3"), make_drafter(cached_target("qwen3"), 8)
    prompts = [make_prompt(6, seed=70), make_prompt(6, seed=71)]
    expected = [alone(target, p, max_new_tokens=NEW) for p in prompts]
    ids = torch.cat(prompts)
    original = DFlashCandidateGenerator.propose

    def propose(self, histories, context, context_positions, anchor_positions, slot_mask=None, num_drafts=None):
        drafts, scores = original(self, histories, context, context_positions, anchor_positions, slot_mask, num_drafts)
        drafts = drafts.clone()
        for r, history in enumerate(histories):
            row = next(i for i in range(2) if torch.equal(history[:6], ids[i]))
            done = len(history) - 6
            good = done < 16 if row == 0 else done >= 8
            for j in range(drafts.shape[1]):
                token = expected[row][done + j] if done + j < NEW else 0
                drafts[r, j] = token if good else (token + 1) % VOCAB
        return drafts, torch.full_like(scores, float("-inf")).scatter(2, drafts[..., None], 0.0)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(DFlashCandidateGenerator, "propose", propose)
        got = target.generate(ids, assistant_model=drafter, max_new_tokens=NEW, pad_token_id=PAD,
                              cache_implementation=cache_implementation)
    assert [row_new_tokens(got, ids, r) for r in range(2)] == expected
    per_row = drafter.last_stats.row_acceptance_lengths
    assert max(per_row[0]) == 8 and max(per_row[1]) == 8 and min(per_row[0]) == min(per_row[1]) == 1


@pytest.mark.parametrize("cache_implementation", CACHES)
def test_default_policy_batch_matches_plain(cache_implementation):
    target = cached_target("llama")
    drafter = make_drafter(target, 4)
    ids, mask = left_padded([make_prompt(n, seed=10 + n) for n in (3, 11, 7, 1)])
    kwargs = dict(attention_mask=mask, max_new_tokens=NEW, pad_token_id=PAD, do_sample=False)
    plain = plain_on_both_caches(target, ids, **kwargs)
    with every_policy_path():
        got = target.generate(ids, assistant_model=drafter, dflash_policy="cost",
                              cache_implementation=cache_implementation, **kwargs)
    assert_same(got, plain, "batch under the default policy: ")


@needs_static_crop
def test_a_static_cache_passed_in_is_decoded_on_and_returned():
    target = cached_target("qwen3")
    drafter = make_drafter(target, 8)
    prompt = make_prompt(9, seed=4)
    reference = plain_on_both_caches(target, prompt, max_new_tokens=NEW)
    cache = StaticCache(config=target.config, max_cache_len=prompt.shape[1] + NEW)
    with scripted_drafts(new_tokens(reference, prompt), corrupt=0.3, seed=1):
        out = target.generate(prompt, assistant_model=drafter, max_new_tokens=NEW, do_sample=False,
                              return_dict_in_generate=True, **{cache_argument(target): cache})
    assert_same(out, reference)
    assert getattr(out, cache_argument(type(out))) is cache
    assert int(cache.get_seq_length()) == reference.shape[1] - 1  # every committed token but the last, no draft left


# ----------------------------------------------------------------------------------------------------------------------
# sampling: the same seeded draws on both caches
@needs_static_crop
@pytest.mark.parametrize("budget", [None, 6])
def test_seeded_sampling_is_the_same_on_both_caches(budget):
    """Speculative sampling draws the same random numbers on both caches (a chain, and a tree well inside the cache),
    so the same seed gives the same tokens; the sampling laws themselves are tested on the dynamic cache
    (tests/test_sampling_laws.py)."""
    target = cached_target("qwen3")
    drafter = make_drafter(target, 6)
    prompt = make_prompt(8, seed=5)
    kwargs = dict(do_sample=True, temperature=1.3, top_k=20, max_new_tokens=20, dflash_tree_budget=budget)
    outputs = []
    for cache_implementation in (None, "static"):
        torch.manual_seed(7)
        outputs.append(target.generate(prompt, assistant_model=drafter, cache_implementation=cache_implementation,
                                       **kwargs))
    assert_same(outputs[1], outputs[0], "seeded sampling, static against dynamic cache: ")


# ----------------------------------------------------------------------------------------------------------------------
# the parts
@needs_static_crop
def test_compacting_moves_each_rows_real_slots_and_keeps_the_unread_ones():
    """Row 0 keeps slots 0, 2 (real) of the drafter-read prefix, row 1 only slot 3; the last slot (unread by the
    drafter) follows the compacted prefix in both rows. The static target cache is rewritten in place and rewound."""
    config = cached_target("qwen3").config
    target_cache, drafter_cache = StaticCache(config=config, max_cache_len=8), DynamicCache()
    keys = torch.arange(5.0).reshape(1, 1, 5, 1).repeat(2, 2, 1, 16) + torch.tensor([0.0, 10.0]).reshape(2, 1, 1, 1)
    for layer in range(config.num_hidden_layers):
        target_cache.update(keys, -keys, layer)
        drafter_cache.update(keys[:, :, :4], -keys[:, :, :4], layer)
    address = target_cache.layers[0].keys.data_ptr()
    mask = torch.tensor([[True, False, True, False, True], [False, False, False, True, False]])
    new_mask = compact_slots([target_cache, drafter_cache], mask, unread=1).tolist()
    assert new_mask == [[True, True, True], [False, True, False]]
    assert int(target_cache.get_seq_length()) == 3 and drafter_cache.get_seq_length() == 2
    real = lambda keys: [[k for k, m in zip(row, row_mask) if m] for row, row_mask in zip(keys.tolist(), new_mask)]
    assert real(target_cache.layers[0].keys[:, 0, :3, 0]) == [[0.0, 2.0, 4.0], [13.0]]
    assert target_cache.layers[0].keys[1, 0, 2, 0].item() == 14.0  # the unread slot, padding in row 1, follows
    assert target_cache.layers[0].values[1, 1, 1, 0].item() == -13.0
    assert real(drafter_cache.layers[0].keys[:, 0, :, 0]) == [[0.0, 2.0], [13.0]]
    assert target_cache.layers[0].keys.data_ptr() == address


# ----------------------------------------------------------------------------------------------------------------------
# what a static cache cannot serve: a ValueError naming the fix, before any target forward
def refused(target, prompt, match, **kwargs):
    drafter = make_drafter(target, 4)
    calls = []
    handle = target.register_forward_pre_hook(lambda *args: calls.append(1))
    try:
        with pytest.raises(ValueError, match=match):
            target.generate(prompt, assistant_model=drafter, max_new_tokens=8, do_sample=False, **kwargs)
    finally:
        handle.remove()
    assert not calls


@needs_static_crop
@pytest.mark.parametrize("family", ["qwen3_next", "lfm2"])
def test_hybrid_targets_are_refused(family):
    refused(family_target(family), make_prompt(6), r"hybrid .*drop cache_implementation=\"static\"",
            cache_implementation="static")


@needs_static_crop
@pytest.mark.parametrize("family", ["mistral", "gemma3"])
def test_sliding_window_targets_are_refused(family):
    refused(family_target(family), make_prompt(6), r"sliding-window .*drop cache_implementation=\"static\"",
            cache_implementation="static")


@needs_static_crop
def test_a_static_cache_too_short_is_refused():
    target, prompt = cached_target("qwen3"), make_prompt(6)
    short = StaticCache(config=target.config, max_cache_len=10)
    refused(target, prompt, r"max_cache_len=10 .*needs 13", **{cache_argument(target): short})
    batch, mask = left_padded([prompt, make_prompt(3)])
    exact = StaticCache(config=target.config, max_cache_len=13)  # enough for one row, not for a batch's padding
    refused(target, batch, r"max_cache_len=13 .*needs 17", attention_mask=mask, pad_token_id=PAD,
            **{cache_argument(target): exact})


def test_static_layers_that_cannot_be_cropped_are_refused(monkeypatch):
    """transformers 5.23's static layers have no crop: nothing could give a rejected draft's slots back (on later
    versions the crop is taken away here)."""
    monkeypatch.delattr(StaticLayer, "crop", raising=False)
    refused(cached_target("qwen3"), make_prompt(6), r"transformers >= 5.24", cache_implementation="static")


@needs_static_crop
def test_the_drafters_context_cache_stays_dynamic():
    """Documented in docs/generation.md: the drafter appends a context of varying length every cycle and reads no
    cache-derived mask."""
    target = cached_target("qwen3")
    drafter = make_drafter(target, 4)
    caches, original = [], DFlashCandidateGenerator.propose

    def recording(self, *args, **kwargs):
        caches.append(type(self.cache))
        return original(self, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(DFlashCandidateGenerator, "propose", recording)
        target.generate(make_prompt(5), assistant_model=drafter, max_new_tokens=8, cache_implementation="static")
    assert caches and set(caches) == {DynamicCache}
