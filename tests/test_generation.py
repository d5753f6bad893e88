# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""Lossless verification: greedy generate(assistant_model=drafter) equals generate() token for token."""

import os

import pytest
import torch
from conftest import (
    DRAFTER_KINDS,
    VOCAB,
    CollectingStreamer,
    cached_target,
    assert_lossless,
    assert_same,
    make_drafter,
    make_prompt,
    make_target,
    new_tokens,
    plain_generate,
    scripted_drafts,
)
from transformers import TextStreamer, pipeline
from transformers.generation.candidate_generator import DFlashTokenCandidateGenerator

import hf_dflash
from hf_dflash.candidates_dflash import DFlashCandidateGenerator

BLOCK_SIZES = (2, 3, 8, 15, 16)
PROMPT_LENGTHS = (1, 7, 40)


# ----------------------------------------------------------------------------------------------------------------------
# greedy equality
@pytest.mark.parametrize("kind", DRAFTER_KINDS)
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
def test_greedy_matches_plain_generate(target, block_size, kind):
    drafter = make_drafter(target, block_size)
    for length in PROMPT_LENGTHS:
        prompt = make_prompt(length, seed=length)
        assert_lossless(target, drafter, prompt, (kind,), seed=length, max_new_tokens=24)
        stats = drafter.last_stats
        assert stats is not None and stats.block_size == block_size and stats.new_tokens == 24
        assert all(1 <= a <= block_size for a in stats.acceptance_lengths)
        if kind == "oracle":  # every draft accepted: each verification commits a full block (or what is left)
            assert stats.acceptance_lengths == [min(block_size, 23 - block_size * i) for i in range(len(stats.acceptance_lengths))]


@pytest.mark.parametrize("max_new_tokens", [1, 2, 3, 7, 8, 9, 13, 17])
def test_max_new_tokens_reached_mid_block(qwen3_target, max_new_tokens):
    target = qwen3_target
    drafter = make_drafter(target, block_size=8)
    prompt = make_prompt(5, seed=3)

    def check(kind, got, expected, proposals):
        assert got.shape[1] == prompt.shape[1] + max_new_tokens
        # one token from the prefill, every other token from a verification
        assert sum(drafter.last_stats.acceptance_lengths) == max_new_tokens - 1

    assert_lossless(target, drafter, prompt, reference=plain_generate(target, prompt, max_new_tokens=40), check=check,
                    max_new_tokens=max_new_tokens)


def test_acceptance_statistics(qwen3_target):
    target, block_size = qwen3_target, 8
    drafter = make_drafter(target, block_size)
    prompt = make_prompt(6, seed=5)
    expected = plain_generate(target, prompt, max_new_tokens=57)  # 1 + 7 blocks of 8
    with scripted_drafts(new_tokens(expected, prompt)):
        assert_same(target.generate(prompt, assistant_model=drafter, max_new_tokens=57), expected)
    stats = drafter.last_stats
    assert stats.acceptance_lengths == [block_size] * 7
    assert stats.mean_acceptance_length == block_size
    assert stats.num_verifications == 7 and stats.new_tokens == 57
    assert stats.acceptance_by_position() == [1.0] * (block_size - 1)
    assert stats.total_seconds >= stats.prefill_seconds + stats.draft_seconds + stats.verify_seconds > 0

    # noisy oracle: acceptance between the extremes, and tokens still add up
    with scripted_drafts(new_tokens(expected, prompt), corrupt=0.2, seed=1):
        assert_same(target.generate(prompt, assistant_model=drafter, max_new_tokens=57), expected)
    noisy = drafter.last_stats
    assert 1 < noisy.mean_acceptance_length < block_size
    assert sum(noisy.acceptance_lengths) == 56
    positions = noisy.acceptance_by_position()
    assert all(a >= b for a, b in zip(positions, positions[1:]))  # acceptance can only drop along the block

    # random drafter: acceptance length >= 1 always; the stats object is replaced per call
    assert_same(target.generate(prompt, assistant_model=drafter, max_new_tokens=57), expected)
    assert drafter.last_stats is not noisy and drafter.last_stats.new_tokens == 57
    assert sum(drafter.last_stats.acceptance_lengths) == 56


def _eos_inside_block(target, prompt, block_size):
    """A token the target emits at new-token index >= 3 that it did not emit before, and that index."""
    reference = new_tokens(plain_generate(target, prompt, max_new_tokens=40), prompt).tolist()
    for index in range(3, len(reference)):
        if reference[index] not in reference[:index] and index % block_size not in (0, 1):
            return reference[index], index
    pytest.skip("greedy output has no fresh token to use as EOS")


@pytest.mark.parametrize("block_size", [4, 16])
def test_eos_inside_accepted_block(target, block_size):
    drafter = make_drafter(target, block_size)
    prompt = make_prompt(9, seed=11)
    eos, index = _eos_inside_block(target, prompt, block_size)

    def check(kind, got, expected, proposals):
        if kind == "oracle":
            # the EOS was a draft, accepted together with the drafts after it, which must be dropped
            assert any(eos in p for p in proposals)
            assert sum(drafter.last_stats.acceptance_lengths) > index

    expected = assert_lossless(target, drafter, prompt, reference=plain_generate(target, prompt, max_new_tokens=40),
                               check=check, max_new_tokens=40, eos_token_id=eos)
    assert expected.shape[1] == prompt.shape[1] + index + 1 and expected[0, -1] == eos  # stops right after EOS


def test_eos_from_generation_config_and_pad(qwen3_target):
    target = make_target("qwen3", seed=0)
    prompt = make_prompt(9, seed=11)
    eos, index = _eos_inside_block(target, prompt, 8)
    reference = plain_generate(target, prompt, max_new_tokens=40)
    target.generation_config.eos_token_id = eos
    target.generation_config.pad_token_id = eos
    drafter = make_drafter(target, 8)
    expected = plain_generate(target, prompt, max_new_tokens=40)
    assert expected.shape[1] == prompt.shape[1] + index + 1
    with scripted_drafts(new_tokens(reference, prompt)):
        assert_same(target.generate(prompt, assistant_model=drafter, max_new_tokens=40), expected)


@pytest.mark.parametrize("min_new_tokens", [0, 6])
def test_eos_with_min_new_tokens(qwen3_target, min_new_tokens):
    target = qwen3_target
    drafter = make_drafter(target, 8)
    prompt = make_prompt(9, seed=11)
    eos, index = _eos_inside_block(target, prompt, 8)
    assert_lossless(target, drafter, prompt, ("oracle", "random"),
                    reference=plain_generate(target, prompt, max_new_tokens=40), max_new_tokens=30, eos_token_id=eos,
                    min_new_tokens=min_new_tokens)


def test_stop_strings_inside_block(target, tokenizer):
    block_size = 8
    drafter = make_drafter(target, block_size)
    prompt = make_prompt(6, seed=21)
    reference = plain_generate(target, prompt, max_new_tokens=40)
    tokens = new_tokens(reference, prompt).tolist()
    # a two-token stop string that makes plain generate stop inside a block (not on its first token)
    for end in range(4, len(tokens)):
        if end % block_size in (0, 1):
            continue
        stop = tokenizer.decode(tokens[end - 1 : end + 1])
        kwargs = dict(max_new_tokens=40, stop_strings=[stop], tokenizer=tokenizer)
        expected = plain_generate(target, prompt, **kwargs)
        if expected.shape[1] == prompt.shape[1] + end + 1:
            break
    else:
        pytest.skip("no usable stop string")
    assert tokenizer.decode(expected[0]).endswith(stop)
    assert_lossless(target, drafter, prompt, reference=reference, **kwargs)


@pytest.mark.parametrize("penalty", [1.3, 0.8])
def test_repetition_penalty_greedy(target, penalty):
    drafter = make_drafter(target, 8)
    for length in (1, 12):
        prompt = make_prompt(length, seed=30 + length)
        assert_lossless(target, drafter, prompt, max_new_tokens=30, repetition_penalty=penalty)


def test_other_processors_greedy(qwen3_target):
    """A mix of vectorised (suppress tokens) and per-position (no-repeat n-gram, bad words, min length) processors."""
    target = qwen3_target
    drafter = make_drafter(target, 8)
    prompt = make_prompt(10, seed=41)
    first = new_tokens(plain_generate(target, prompt, max_new_tokens=30), prompt).tolist()
    assert_lossless(
        target,
        drafter,
        prompt,
        max_new_tokens=30,
        suppress_tokens=[first[2]],
        bad_words_ids=[[first[4], first[5]]],
        no_repeat_ngram_size=3,
        sequence_bias={(first[7],): 1.5},
    )


def test_left_padding_attention_mask(qwen3_target):
    """A single left-padded prompt: same tokens, same max_length accounting, same history for the processors."""
    target = qwen3_target
    drafter = make_drafter(target, 8)
    prompt = make_prompt(8, seed=51)
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), prompt], dim=1)
    mask = torch.cat([torch.zeros(1, 3, dtype=torch.long), torch.ones_like(prompt)], dim=1)
    for kwargs in (dict(max_new_tokens=20), dict(max_new_tokens=20, repetition_penalty=1.5)):
        expected = assert_lossless(target, drafter, padded, attention_mask=mask, **kwargs)
        assert expected.shape[1] == padded.shape[1] + 20


# ----------------------------------------------------------------------------------------------------------------------
# return_dict_in_generate outputs
@pytest.mark.parametrize("kind", ["oracle", "noisy"])
def test_dict_outputs_match_plain_generate(target, kind):
    drafter = make_drafter(target, 8)
    prompt = make_prompt(7, seed=61)
    kwargs = dict(
        max_new_tokens=19,
        return_dict_in_generate=True,
        output_scores=True,
        output_logits=True,
        output_hidden_states=True,
        repetition_penalty=1.2,
    )

    def check(kind, got, expected, proposals):
        assert type(got) is type(expected)
        assert len(got.scores) == len(expected.scores) == len(got.logits) == len(expected.logits) == 19
        for a, b in zip(got.scores, expected.scores):
            assert a.shape == b.shape == (1, VOCAB)
            torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
        for a, b in zip(got.logits, expected.logits):
            torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
        assert len(got.hidden_states) == len(expected.hidden_states) == 19
        layers = target.config.num_hidden_layers + 1
        for step, (a, b) in enumerate(zip(got.hidden_states, expected.hidden_states)):
            assert len(a) == len(b) == layers
            for x, y in zip(a, b):
                assert x.shape == y.shape == (1, prompt.shape[1] if step == 0 else 1, target.config.hidden_size)
                torch.testing.assert_close(x, y, atol=1e-4, rtol=1e-4)
        assert got.past_key_values.get_seq_length() == expected.past_key_values.get_seq_length()

    assert_lossless(target, drafter, prompt, (kind,), check=check, **kwargs)


def test_dict_outputs_scores_only(qwen3_target):
    target = qwen3_target
    drafter = make_drafter(target, 16)
    prompt = make_prompt(3, seed=62)
    kwargs = dict(max_new_tokens=12, return_dict_in_generate=True, output_scores=True)
    expected = plain_generate(target, prompt, **kwargs)
    got = target.generate(prompt, assistant_model=drafter, **kwargs)
    assert_same(got.sequences, expected.sequences)
    assert got.logits is None and got.hidden_states is None and len(got.scores) == 12
    torch.testing.assert_close(torch.stack(got.scores), torch.stack(expected.scores), atol=1e-4, rtol=1e-4)


# ----------------------------------------------------------------------------------------------------------------------
# streamers
def test_streamer_collects_the_output(target):
    drafter = make_drafter(target, 8)
    prompt = make_prompt(5, seed=71)
    streamer = CollectingStreamer()

    def check(kind, got, expected, proposals):
        assert streamer.tokens == got[0].tolist() and streamer.ended
        if kind == "oracle":  # whole blocks are streamed at once
            assert streamer.puts == 2 + drafter.last_stats.num_verifications
        streamer.reset()  # empty for the next kind

    assert_lossless(target, drafter, prompt, ("oracle", "noisy"), assisted=dict(streamer=streamer), check=check,
                    max_new_tokens=26)


def test_text_streamer(qwen3_target, tokenizer, capsys):
    target = qwen3_target
    drafter = make_drafter(target, 8)
    prompt = make_prompt(5, seed=72)
    expected = plain_generate(target, prompt, max_new_tokens=20, streamer=TextStreamer(tokenizer))
    plain_text = capsys.readouterr().out
    with scripted_drafts(new_tokens(expected, prompt), corrupt=0.3):
        got = target.generate(prompt, assistant_model=drafter, max_new_tokens=20, streamer=TextStreamer(tokenizer))
    assert_same(got, expected)
    assert capsys.readouterr().out == plain_text == tokenizer.decode(expected[0]) + "\n"


# ----------------------------------------------------------------------------------------------------------------------
# routing: speculation_type, ordinary assistants, the opt-out
def test_speculation_type_dflash(qwen3_target):
    target = make_target("qwen3", seed=0)
    drafter = make_drafter(target, 8)
    prompt = make_prompt(6, seed=81)
    expected = plain_generate(target, prompt, max_new_tokens=20)
    with scripted_drafts(new_tokens(expected, prompt), corrupt=0.2):
        got = target.generate(prompt, assistant_model=drafter, max_new_tokens=20, speculation_type="dflash")
    assert_same(got, expected)
    assert drafter.last_stats.new_tokens == 20  # our loop ran

    target.generation_config.speculation_type = "dflash"
    drafter.last_stats = None
    got = target.generate(prompt, assistant_model=drafter, max_new_tokens=20)
    assert_same(got, expected)
    assert drafter.last_stats.new_tokens == 20


def test_ordinary_assistant_goes_to_transformers(qwen3_target):
    target = qwen3_target
    assistant = make_target("qwen3", num_hidden_layers=1, hidden_size=32, num_attention_heads=2, seed=5)
    prompt = make_prompt(6, seed=82)
    expected = plain_generate(target, prompt, max_new_tokens=20)
    calls = []
    original = DFlashCandidateGenerator.propose
    try:
        DFlashCandidateGenerator.propose = lambda *a, **k: calls.append(1) or original(*a, **k)
        got = target.generate(prompt, assistant_model=assistant, max_new_tokens=20, do_sample=False)
    finally:
        DFlashCandidateGenerator.propose = original
    assert_same(got, expected)
    assert not calls and not hasattr(assistant, "last_stats")


def test_builtin_generation_opt_out(qwen3_target):
    target = qwen3_target
    drafter = make_drafter(target, 8)
    prompt = make_prompt(6, seed=83)
    expected = plain_generate(target, prompt, max_new_tokens=20)
    used = []
    original = DFlashTokenCandidateGenerator.get_candidates

    def spy(self, *args, **kwargs):
        used.append(1)
        return original(self, *args, **kwargs)

    DFlashTokenCandidateGenerator.get_candidates = spy
    try:
        with hf_dflash.builtin_generation():
            got = target.generate(prompt, assistant_model=drafter, max_new_tokens=20, speculation_type="dflash")
        assert used and drafter.last_stats is None  # transformers' own DFlash generator ran, not our loop
        assert_same(got, expected)

        # routing is back after the context manager
        used.clear()
        got = target.generate(prompt, assistant_model=drafter, max_new_tokens=20)
        assert_same(got, expected)
        assert not used and drafter.last_stats.new_tokens == 20

        hf_dflash.disable_dflash_generation()
        hf_dflash.disable_dflash_generation()  # idempotent
        drafter.last_stats = None
        got = target.generate(prompt, assistant_model=drafter, max_new_tokens=20, speculation_type="dflash")
        assert used and drafter.last_stats is None
        assert_same(got, expected)
    finally:
        DFlashTokenCandidateGenerator.get_candidates = original
        hf_dflash.enable_dflash_generation()
        hf_dflash.enable_dflash_generation()  # idempotent: wraps once
    from transformers import GenerationMixin

    assert not hasattr(GenerationMixin.generate._hf_dflash_original, "_hf_dflash_original")
    assert not hasattr(GenerationMixin._assisted_decoding._hf_dflash_original, "_hf_dflash_original")


def test_builtin_generation_inside_disabled_stays_disabled(qwen3_target):
    from transformers import GenerationMixin

    hf_dflash.disable_dflash_generation()
    try:
        with hf_dflash.builtin_generation():
            pass
        assert not hasattr(GenerationMixin.generate, "_hf_dflash_original")
    finally:
        hf_dflash.enable_dflash_generation()
    assert hasattr(GenerationMixin.generate, "_hf_dflash_original")


def test_pipeline_text_generation(qwen3_target, tokenizer):
    target = qwen3_target
    drafter = make_drafter(target, 8)
    generator = pipeline("text-generation", model=target, tokenizer=tokenizer)
    prompt = "t5 t17 t33 t2 t9"
    expected = generator(prompt, max_new_tokens=20, do_sample=False)
    got = generator(prompt, max_new_tokens=20, do_sample=False, assistant_model=drafter)
    assert got == expected
    assert drafter.last_stats is not None and drafter.last_stats.new_tokens == 20
    assert expected[0]["generated_text"].startswith(prompt) and len(expected[0]["generated_text"]) > len(prompt)


def test_generate_with_input_ids_keyword_and_generation_config(qwen3_target):
    from transformers import GenerationConfig

    target = qwen3_target
    drafter = make_drafter(target, 8)
    prompt = make_prompt(6, seed=84)
    config = GenerationConfig(max_new_tokens=15, do_sample=False)
    expected = target.generate(input_ids=prompt, generation_config=config)
    assert_same(target.generate(input_ids=prompt, generation_config=config, assistant_model=drafter), expected)
    assert_same(target.generate(prompt, config, assistant_model=drafter), expected)
    assert drafter.last_stats.new_tokens == 15


def test_drafter_cache_stays_in_step_over_long_generation(llama_target):
    """Many cycles with mixed acceptance; the generator raises if its context and the anchor position disagree."""
    target = llama_target
    drafter = make_drafter(target, 5, num_hidden_layers=2)
    prompt = make_prompt(4, seed=91)
    expected = plain_generate(target, prompt, max_new_tokens=120)
    with scripted_drafts(new_tokens(expected, prompt), corrupt=0.25, seed=3):
        assert_same(target.generate(prompt, assistant_model=drafter, max_new_tokens=120), expected)
    assert drafter.last_stats.num_verifications > 24


def test_dict_outputs_attentions(qwen3_target):
    target = make_target("qwen3", seed=0, attn_implementation="eager")  # sdpa returns no attention weights
    drafter = make_drafter(target, 8)
    prompt = make_prompt(5, seed=63)
    kwargs = dict(max_new_tokens=12, return_dict_in_generate=True, output_attentions=True)
    expected = plain_generate(target, prompt, **kwargs)
    with scripted_drafts(new_tokens(expected.sequences, prompt), corrupt=0.3):
        got = target.generate(prompt, assistant_model=drafter, **kwargs)
    assert_same(got.sequences, expected.sequences)
    assert len(got.attentions) == len(expected.attentions) == 12
    for a, b in zip(got.attentions, expected.attentions):
        assert len(a) == len(b) == target.config.num_hidden_layers
        for x, y in zip(a, b):
            assert x.shape == y.shape
            torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-4)


def test_candidate_generator_api(qwen3_target):
    """DFlashCandidateGenerator is a transformers CandidateGenerator: get_candidates(input_ids, ...) works alone."""
    from transformers import GenerationConfig
    from transformers.generation.candidate_generator import CandidateGenerator

    target, drafter = qwen3_target, make_drafter(qwen3_target, 8)
    generator = DFlashCandidateGenerator(drafter, target, GenerationConfig())
    assert isinstance(generator, CandidateGenerator)
    prompt = make_prompt(10, seed=7)
    hidden = target(prompt[:, :-1], output_hidden_states=True).hidden_states
    candidates, scores = generator.get_candidates(prompt, context_hidden_states=drafter.fused_features(hidden))
    assert candidates.shape == (1, 10 + 7) and torch.equal(candidates[:, :10], prompt)
    assert scores.shape == (1, 7, target.config.vocab_size)
    assert torch.equal(candidates[0, 10:], scores[0].argmax(-1))
    assert generator.cache.get_seq_length() == 9  # context K/V only: the block's were dropped


# ----------------------------------------------------------------------------------------------------------------------
# draft length: num_assistant_tokens caps the drafts verified per cycle; the "heuristic" schedule adapts it
@pytest.mark.parametrize("kind", DRAFTER_KINDS)
@pytest.mark.parametrize("settings", [dict(num_assistant_tokens=1), dict(num_assistant_tokens=3),
                                      dict(num_assistant_tokens=4, num_assistant_tokens_schedule="heuristic"),
                                      dict(num_assistant_tokens_schedule="heuristic_transient")])
def test_draft_length_settings_stay_lossless(target, kind, settings):
    drafter = make_drafter(target, block_size=8)
    prompt = make_prompt(7, seed=11)
    assert_lossless(target, drafter, prompt, (kind,), seed=2, assisted=settings, max_new_tokens=30)
    lengths = drafter.last_stats.acceptance_lengths
    assert sum(lengths) == 29
    if settings.get("num_assistant_tokens_schedule") is None:  # constant cap: never more than cap + 1 per cycle
        assert max(lengths) <= settings["num_assistant_tokens"] + 1
        if kind == "oracle":
            assert lengths[:-1] == [settings["num_assistant_tokens"] + 1] * (len(lengths) - 1)


def test_heuristic_draft_length_grows_with_good_drafts_and_shrinks_with_bad(qwen3_target):
    target = qwen3_target
    drafter = make_drafter(target, block_size=16)
    prompt = make_prompt(5, seed=4)
    expected = plain_generate(target, prompt, max_new_tokens=60)
    settings = dict(num_assistant_tokens=2, num_assistant_tokens_schedule="heuristic", max_new_tokens=60)
    with scripted_drafts(new_tokens(expected, prompt)):
        assert_same(target.generate(prompt, assistant_model=drafter, **settings), expected)
    # every draft accepted: 2, 4, 6, ... drafts per cycle, capped at B-1 = 15
    assert drafter.last_stats.acceptance_lengths[:4] == [3, 5, 7, 9]
    wrong = [(t + 1) % VOCAB for t in new_tokens(expected, prompt).tolist()]
    with scripted_drafts(torch.tensor(wrong)):
        assert_same(target.generate(prompt, assistant_model=drafter, **settings), expected)
    # every draft rejected: 2, 1, 1, ... drafts verified; each cycle commits one token
    assert set(drafter.last_stats.acceptance_lengths) == {1}


# ----------------------------------------------------------------------------------------------------------------------
# no deprecation warnings from our own calls (transformers 5.24 renamed `past_key_values` to `cache`)
def test_our_calls_log_no_deprecation_warnings(qwen3_target):
    import logging as std_logging

    from transformers.utils import logging

    class Collect(std_logging.Handler):
        def __init__(self):
            super().__init__()
            self.messages = []

        def emit(self, record):
            self.messages.append(record.getMessage())

    handler = Collect()
    root = logging.get_logger("transformers")
    root.addHandler(handler)
    std_logging.Logger.warning_once.cache_clear()  # transformers logs each deprecation once per process
    try:
        drafter = make_drafter(qwen3_target)
        prompt = make_prompt(9)
        qwen3_target.generate(prompt, assistant_model=drafter, max_new_tokens=12, do_sample=False)
        qwen3_target.generate(prompt, assistant_model=drafter, max_new_tokens=12, do_sample=True, top_k=5,
                              return_dict_in_generate=True, output_scores=True)
        batch = torch.cat([make_prompt(9, seed=1), make_prompt(9, seed=2)])
        mask = torch.ones_like(batch)
        mask[1, :3] = 0
        qwen3_target.generate(batch, attention_mask=mask, assistant_model=drafter, max_new_tokens=12, do_sample=False)
    finally:
        root.removeHandler(handler)
    deprecations = [m for m in handler.messages if "deprecat" in m.lower()]
    assert not deprecations, deprecations


def test_builtin_generation_gives_the_drafter_its_context_cache(qwen3_target):
    """transformers' own DFlash generator passes the drafter's cache as `cache=` (5.24): it must be used, so
    later drafts read the context K/V of earlier cycles instead of drafting from no context."""
    drafter = make_drafter(qwen3_target, 8)
    prompt = make_prompt(6, seed=83)
    seen = []

    def record(module, args, kwargs, output):
        cache = output.get("cache", output.get("past_key_values"))
        seen.append(0 if cache is None else cache.get_seq_length())

    handle = drafter.register_forward_hook(record, with_kwargs=True)
    try:
        with hf_dflash.builtin_generation():
            got = qwen3_target.generate(prompt, assistant_model=drafter, max_new_tokens=20, speculation_type="dflash")
    finally:
        handle.remove()
    assert_same(got, plain_generate(qwen3_target, prompt, max_new_tokens=20))
    assert len(seen) > 1 and max(seen) > 0, seen


def test_verify_forwards_attend_with_grouped_key_value_heads_on_cpu(monkeypatch):
    """During the DFlash loop on CPU, transformers' SDPA keeps grouped key/value heads under a mask (a masked verify
    otherwise copies every cached key and value once per query head: after a 4K-token prompt, a 2-row verify cost 2.0
    plain steps instead of 1.45), with logits bitwise equal to transformers' own TRANSFORMERS_SDPA_FORCE_GQA=1 path;
    plain generate keeps transformers' rule, the environment is never written, and a value the user set decides."""
    from hf_dflash.attention_dflash import FORCE_GQA

    monkeypatch.delenv(FORCE_GQA, raising=False)
    target = cached_target("qwen3")
    drafter = make_drafter(target)
    prompt, masked = make_prompt(9), []  # enable_gqa of each masked SDPA call
    padding = torch.ones_like(prompt)
    padding[0, 0] = 0  # a padded prompt: plain generate's forwards are masked too
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def recording_sdpa(*args, **kwargs):
        if kwargs.get("attn_mask") is not None:
            masked.append(kwargs.get("enable_gqa", False))
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recording_sdpa)
    environment = dict(os.environ)
    plain = plain_generate(target, prompt, attention_mask=padding, max_new_tokens=12)
    assert masked and not any(masked)
    masked.clear()
    logits = {"attention_mask": padding, "max_new_tokens": 12, "do_sample": False, "return_dict_in_generate": True,
              "output_logits": True}
    ours = target.generate(prompt, assistant_model=drafter, **logits)
    assert masked and all(masked) and dict(os.environ) == environment
    assert torch.equal(ours.sequences, plain)
    monkeypatch.setenv(FORCE_GQA, "1")  # transformers' own switch: the path this one must equal bit for bit
    forced = target.generate(prompt, assistant_model=drafter, **logits)
    assert all(torch.equal(a, b) for a, b in zip(ours.logits, forced.logits, strict=True))
    monkeypatch.setenv(FORCE_GQA, "0")
    masked.clear()
    target.generate(prompt, assistant_model=drafter, attention_mask=padding, max_new_tokens=12, do_sample=False)
    assert masked and not any(masked) and os.environ[FORCE_GQA] == "0"
