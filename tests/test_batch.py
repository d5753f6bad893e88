"""Batched speculative generation: a left-padded batch, lossless per row, rows keep their own acceptances.

Batched sampling laws (rows that really draft, chi-square per row) are in test_sampling_laws.py."""

import contextlib

import pytest
import torch
from conftest import (
    ARCHS,
    PAD,
    alone,
    cached_target,
    every_policy_path,
    left_padded,
    make_drafter,
    make_prompt,
    per_row_scripts,
    row_new_tokens,
)


@pytest.mark.parametrize("policy", ["full", "cost"])
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("block_size", [4, 16])
def test_random_drafter_batch_equals_each_prompt_alone(arch, block_size, policy):
    """Under the full-block policy, and under the default one made to take each of its paths (plain steps among
    drafter cycles; lookups are a batch-size-1 source)."""
    target = cached_target(arch)
    drafter = make_drafter(target, block_size)
    prompts = [make_prompt(n, seed=10 + n) for n in (3, 11, 7, 1)]
    ids, mask = left_padded(prompts)
    with every_policy_path() if policy == "cost" else contextlib.nullcontext():
        out = target.generate(ids, attention_mask=mask, assistant_model=drafter, max_new_tokens=25, pad_token_id=PAD,
                              dflash_policy=policy)
    if policy == "cost":
        assert 0 in drafter.last_stats.drafts_per_cycle and max(drafter.last_stats.drafts_per_cycle) > 0
    for r, prompt in enumerate(prompts):
        assert row_new_tokens(out, ids, r) == alone(target, prompt, max_new_tokens=25)
    assert torch.equal(out, target.generate(ids, attention_mask=mask, max_new_tokens=25, pad_token_id=PAD))
    stats = drafter.last_stats
    assert len(stats.row_acceptance_lengths) == 4
    assert sum(len(r) for r in stats.row_acceptance_lengths) == stats.num_verifications


@pytest.mark.parametrize("arch", ARCHS)
def test_rows_keep_their_own_acceptances(arch):
    """A perfect row accepts whole blocks while a bad neighbour rejects early; both stay exact."""
    target = cached_target(arch)
    drafter = make_drafter(target, 8)
    prompts = [make_prompt(n, seed=30 + n) for n in (9, 4, 6)]
    expected = [alone(target, p, max_new_tokens=30) for p in prompts]
    ids, mask = left_padded(prompts)
    with per_row_scripts(ids, expected, corrupt=[0.0, 0.6, 0.15]):
        out = target.generate(ids, attention_mask=mask, assistant_model=drafter, max_new_tokens=30, pad_token_id=PAD)
    for r in range(3):
        assert row_new_tokens(out, ids, r) == expected[r]
    per_row = drafter.last_stats.row_acceptance_lengths
    mean = [sum(a) / len(a) for a in per_row]
    assert mean[0] > 6.0 and mean[0] > mean[2] > mean[1]  # the perfect row was not held back by its neighbours
    assert max(per_row[0]) == 8 and min(per_row[1]) == 1


def test_rows_that_finish_early_are_padded():
    target = cached_target("qwen3")
    prompts = [make_prompt(n, seed=50 + n) for n in (5, 8, 2)]
    long_run = alone(target, prompts[1], max_new_tokens=40)
    eos = long_run[6]  # a token that row 1 emits early; other rows may emit it at other times
    drafter = make_drafter(target, 8)
    ids, mask = left_padded(prompts)
    out = target.generate(
        ids, attention_mask=mask, assistant_model=drafter, max_new_tokens=40, eos_token_id=eos, pad_token_id=PAD
    )
    plain = target.generate(ids, attention_mask=mask, max_new_tokens=40, eos_token_id=eos, pad_token_id=PAD)
    assert torch.equal(out, plain)
    for r, prompt in enumerate(prompts):
        assert row_new_tokens(out, ids, r) == alone(target, prompt, max_new_tokens=40, eos_token_id=eos)
    assert eos in out[1].tolist()


@pytest.mark.parametrize("do_sample", [False, True])
def test_batched_repetition_penalty_with_an_attention_mask(do_sample):
    """A left-padded batch with repetition_penalty (transformers gives the processor each row's padding length): each
    row as plain generate gives it (greedy), or at least runs (sampling); a row that stops early (EOS) leaves the
    others their own padding lengths."""
    target = cached_target("qwen3")
    drafter = make_drafter(target, 4)
    prompts = [make_prompt(n, seed=60 + n) for n in (5, 2, 8)]
    ids, mask = left_padded(prompts)
    kwargs = dict(max_new_tokens=16, repetition_penalty=1.5, pad_token_id=PAD, do_sample=do_sample)
    out = target.generate(ids, attention_mask=mask, assistant_model=drafter, **kwargs)
    if not do_sample:
        assert torch.equal(out, target.generate(ids, attention_mask=mask, **kwargs))
        for r, prompt in enumerate(prompts):
            assert row_new_tokens(out, ids, r) == alone(target, prompt, max_new_tokens=16, repetition_penalty=1.5)
        eos = row_new_tokens(out, ids, 1)[3]  # row 1 stops early, the others go on without it
        out = target.generate(ids, attention_mask=mask, assistant_model=drafter, eos_token_id=eos, **kwargs)
        assert torch.equal(out, target.generate(ids, attention_mask=mask, eos_token_id=eos, **kwargs))
