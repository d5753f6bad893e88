# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""Hybrid targets (Gated DeltaNet, Mamba and short-convolution layers) after every cycle of DFlash decoding: the
recurrent and convolution states in the target's cache equal those of a fresh target run over the committed tokens.

A verify forward folds every draft into the recurrent states; after a partial acceptance the cache crops them back
(transformers 5.25 on), or the loop restores the states saved before it and re-advances the target through the
committed tokens (before 5.25: hf_dflash/cache_dflash.py `RecurrentStates`, hf_dflash/generation_dflash.py
`readvance`). The tiny Falcon-H1, GraniteMoeHybrid and LFM2
configs forget a state within a few tokens, so comparing outputs (even logits) misses a state that also read
rejected drafts; comparing the states themselves, after each commit, does not.
"""

import pytest
import torch
from conftest import VOCAB, family_target, make_prompt, new_tokens, plain_generate, scripted_drafts
from transformers.cache_utils import DynamicCache

import hf_dflash
from hf_dflash import generation_dflash
from hf_dflash.cache_dflash import LINEAR_ATTENTION_LAYERS, cache_argument, records_recurrent_history
from hf_dflash.rows_dflash import Rows

HYBRIDS = ("qwen3_5", "qwen3_next", "falcon_h1", "granitemoehybrid", "lfm2")  # the hybrid families of FAMILIES
NEW, BLOCK = 24, 6


def cache_states(cache) -> dict:
    """(layer, kind, index) -> the recurrent states and the last `conv_kernel_size` columns of the convolution states
    (what the next forward reads) of every linear-attention layer of `cache`."""
    states = {}
    for i, layer in enumerate(cache.layers):
        if not isinstance(layer, LINEAR_ATTENTION_LAYERS):
            continue
        for j, state in layer.recurrent_states.items():
            if state is not None:
                states[i, "recurrent", j] = state
        for j, state in layer.conv_states.items():
            if state is not None:
                states[i, "conv", j] = state[..., -layer.conv_kernel_size[j] :]
    return states


def fresh_states(target, tokens: torch.Tensor) -> dict:
    """The states of a fresh target cache after one forward over `tokens` [1, n]."""
    cache = DynamicCache(config=target.config)
    with torch.no_grad():
        target(input_ids=tokens, use_cache=True, **{cache_argument(target): cache})
    return cache_states(cache)


@pytest.mark.parametrize("family", HYBRIDS)
def test_states_after_every_commit_equal_a_fresh_run_over_the_committed_tokens(family, monkeypatch):
    """Batch 1, a noisy oracle drafter (full, partial and no acceptances); after each commit the target's cache has
    read every committed token but the new anchor: its states must be a fresh run's over exactly those."""
    target = family_target(family)
    torch.manual_seed(1)
    drafter = hf_dflash.DFlashDraftModel.from_target(target, num_hidden_layers=1, block_size=BLOCK).eval()
    prompt = make_prompt(12, seed=1)
    expected = plain_generate(target, prompt, max_new_tokens=NEW)
    checks, commit, readvance = [], Rows.commit, generation_dflash.readvance

    def checked_commit(rows, accepted, tokens, scores, features, positions, cache, *args, **kwargs):
        running, committed = commit(rows, accepted, tokens, scores, features, positions, cache, *args, **kwargs)
        if running:
            history = rows.histories[0]
            ours, fresh = cache_states(cache), fresh_states(target, history[None, :-1])
            assert ours.keys() == fresh.keys()
            for key, state in fresh.items():  # recurrent states are small (Falcon-H1's ~1e-4): tolerance to scale
                torch.testing.assert_close(
                    ours[key], state, rtol=1e-4, atol=1e-5 * float(state.abs().max()) + 1e-12,
                    msg=lambda m, key=key: f"{family} state {key} after accepting {int(accepted[0])} of "
                                           f"{tokens.shape[1] - 1} drafts (history of {len(history)}): {m}")
            checks.append(int(accepted[0]))
        return running, committed

    readvances = []

    def counted_readvance(*args, **kwargs):
        readvances.append(1)
        return readvance(*args, **kwargs)

    monkeypatch.setattr(Rows, "commit", checked_commit)
    monkeypatch.setattr(generation_dflash, "readvance", counted_readvance)
    with scripted_drafts(new_tokens(expected, prompt), corrupt=0.25, seed=3):
        got = target.generate(prompt, assistant_model=drafter, max_new_tokens=NEW, do_sample=False)
    assert got.tolist() == expected.tolist()
    assert any(0 < n < BLOCK - 1 for n in checks), checks  # partial acceptances were checked
    assert 0 in checks and len(checks) >= 4, checks
    # before transformers 5.25, a state restore and re-advance after each partial acceptance; from 5.25 on the cache
    # crops recurrent states back itself, as it always did LFM2's convolution states
    assert (len(readvances) > 0) == (family != "lfm2" and not records_recurrent_history(DynamicCache())), readvances
