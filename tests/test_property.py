# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""Property: for random tiny targets, prompts, block sizes and drafters, greedy DFlash output == plain generate."""

from conftest import (
    DRAFTER_KINDS,
    assert_lossless,
    cached_target,
    make_drafter,
    make_prompt,
    new_tokens,
    plain_generate,
)
from hypothesis import given, settings
from hypothesis import strategies as st


@st.composite
def target_configs(draw):
    heads = draw(st.sampled_from([2, 4]))
    return dict(
        arch=draw(st.sampled_from(["qwen3", "llama"])),
        num_hidden_layers=draw(st.integers(1, 4)),
        num_attention_heads=heads,
        num_key_value_heads=draw(st.sampled_from([k for k in (1, 2, 4) if heads % k == 0])),
        hidden_size=draw(st.sampled_from([32, 48, 64])),
        vocab_size=draw(st.integers(50, 200)),
        seed=draw(st.integers(0, 3)),
    )


@settings(max_examples=200, deadline=None)
@given(
    config=target_configs(),
    prompt_length=st.integers(1, 20),
    prompt_seed=st.integers(0, 10_000),
    block_size=st.integers(2, 16),
    drafter_layers=st.integers(1, 2),
    kind=st.sampled_from(DRAFTER_KINDS),
    corrupt=st.sampled_from([0.1, 0.3, 0.7]),
    max_new_tokens=st.integers(1, 24),
    eos_pick=st.one_of(st.none(), st.integers(0, 23)),
    repetition_penalty=st.sampled_from([None, None, 1.3]),
    data=st.data(),
)
def test_greedy_equals_plain_generate(
    config, prompt_length, prompt_seed, block_size, drafter_layers, kind, corrupt, max_new_tokens, eos_pick,
    repetition_penalty, data,
):
    target = cached_target(**config)
    vocab = config["vocab_size"]
    prompt = make_prompt(prompt_length, vocab_size=vocab, seed=prompt_seed)
    kwargs = dict(max_new_tokens=max_new_tokens)
    if repetition_penalty is not None:
        kwargs["repetition_penalty"] = repetition_penalty
    reference = plain_generate(target, prompt, **kwargs)
    continuation = new_tokens(reference, prompt)
    if eos_pick is not None and eos_pick < continuation.shape[0]:
        kwargs["eos_token_id"] = int(continuation[eos_pick])
    # feature layers: the default rule, or any 1-3 layers of the target (the number of features need not equal
    # the drafter's depth)
    depth = config["num_hidden_layers"]
    layer_ids = data.draw(
        st.one_of(st.none(), st.lists(st.integers(0, depth - 1), min_size=1, max_size=3)), label="target_layer_ids"
    )
    if layer_ids is None and depth < 3:
        layer_ids = [depth // 2]  # the z-lab default rule needs a deeper target for more than one feature
    drafter = make_drafter(
        target, block_size, num_hidden_layers=drafter_layers, seed=prompt_seed, target_layer_ids=layer_ids
    )
    expected = assert_lossless(target, drafter, prompt, (kind,), reference=reference, seed=prompt_seed,
                               corrupt=corrupt, **kwargs)
    stats = drafter.last_stats
    assert stats.new_tokens == expected.shape[1] - prompt.shape[1]
    assert all(1 <= a <= block_size for a in stats.acceptance_lengths)
    assert sum(stats.acceptance_lengths) >= stats.new_tokens - 1
