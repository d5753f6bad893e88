# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""The numeric promise: in fp32, greedy decoding with a drafter is token-identical to plain greedy decoding.

A verify forward scores up to 16 positions at once, plain decoding scores one; in fp32 the two computations differ
by ~1e-6 on these targets (measured: at most 1.2e-6) while the closest top-2 logits of a greedy step are rarely
closer than ~2e-5, so argmax ties break the same way. In bf16/fp16 the rounding step is ~1e-3..1e-2 of the logits,
so near-ties can break differently (README, "Numerics"); a verify pass that rounds its logits to bf16 fails here.
"""

import pytest
import torch
from conftest import (
    ARCHS,
    alone,
    cached_target,
    left_padded,
    make_drafter,
    make_prompt,
    new_tokens,
    row_new_tokens,
    scripted_drafts,
)

VOCAB = 256  # a wider vocabulary: more near-ties per step
NEW = 32
PROMPT_LENGTHS = [1 + (7 * i) % 40 for i in range(16)]


def tie_target(arch: str):
    return cached_target(arch, vocab_size=VOCAB, seed=5)


@pytest.mark.parametrize("arch", ARCHS)
def test_fp32_greedy_is_token_identical_over_many_prompts(arch):
    """16 prompts, a block of 16: a random drafter (16-row verifies committing 1-2 tokens) and an oracle (16-row
    verifies committing whole blocks) both reproduce plain greedy exactly, near-ties included."""
    target = tie_target(arch)
    assert target.dtype == torch.float32
    drafter = make_drafter(target, block_size=16)
    closest = float("inf")
    for i, length in enumerate(PROMPT_LENGTHS):
        prompt = make_prompt(length, vocab_size=VOCAB, seed=200 + i)
        plain = target.generate(prompt, max_new_tokens=NEW, do_sample=False, output_logits=True,
                                return_dict_in_generate=True)
        top2 = torch.stack(plain.logits, 1)[0].topk(2, dim=-1).values
        closest = min(closest, float((top2[:, 0] - top2[:, 1]).min()))
        expected = new_tokens(plain, prompt).tolist()
        got = target.generate(prompt, assistant_model=drafter, max_new_tokens=NEW, do_sample=False)
        assert new_tokens(got, prompt).tolist() == expected, f"random drafter, prompt {i}"
        with scripted_drafts(expected):
            got = target.generate(prompt, assistant_model=drafter, max_new_tokens=NEW, do_sample=False)
        assert new_tokens(got, prompt).tolist() == expected, f"oracle drafter, prompt {i}"
        assert max(drafter.last_stats.acceptance_lengths) == 16
    assert closest < 1e-3  # the runs met near-ties that bf16 rounding would break


@pytest.mark.parametrize("arch", ARCHS)
def test_fp32_greedy_batch_is_token_identical_to_each_prompt_alone(arch):
    target = tie_target(arch)
    drafter = make_drafter(target, block_size=16)
    prompts = [make_prompt(length, vocab_size=VOCAB, seed=300 + i) for i, length in enumerate(PROMPT_LENGTHS[:8])]
    ids, mask = left_padded(prompts)
    out = target.generate(ids, attention_mask=mask, assistant_model=drafter, max_new_tokens=NEW, pad_token_id=0)
    for r, prompt in enumerate(prompts):
        assert row_new_tokens(out, ids, r) == alone(target, prompt, max_new_tokens=NEW), f"row {r}"
