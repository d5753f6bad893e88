# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""Threads generating at once (a server): each gets plain generate's output, no call writes process-wide state, and
the state threads do share (the stateful target's lifted refusal) survives calls that overlap."""

import contextlib
import importlib.util
import os
import threading

import pytest
import torch
from conftest import (
    assert_same,
    cached_target,
    family_target,
    make_drafter,
    make_prompt,
    plain_generate,
)
from transformers.integrations import sdpa_attention

from hf_dflash import attention_dflash
from hf_dflash.attention_dflash import grouped_heads_switched_on
from hf_dflash.candidates_dflash import DFlashCandidateGenerator
from hf_dflash.generation_dflash import _rewindable_target

JOIN_SECONDS = 300  # far beyond what these tiny targets need, even on a loaded 2-core machine


def run_together(*jobs):
    """Each job (a function of no argument) in its own thread, all released at once; their results, in order. A job's
    error is raised here; a thread still running after JOIN_SECONDS fails the test."""
    start, results, errors = threading.Barrier(len(jobs)), [None] * len(jobs), []

    def run(index, job):
        try:
            start.wait(JOIN_SECONDS)
            results[index] = job()
        except BaseException as error:  # noqa: BLE001 (re-raised in the test's thread)
            errors.append(error)

    threads = [threading.Thread(target=run, args=(i, job), daemon=True) for i, job in enumerate(jobs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(JOIN_SECONDS)
    assert not any(thread.is_alive() for thread in threads), f"a thread still runs after {JOIN_SECONDS} s"
    if errors:
        raise errors[0]
    return results


@contextlib.contextmanager
def oracle_drafts(references):
    """Inside the block, a DFlash drafter whose history begins one of `references` (plain generate outputs [1, n])
    proposes that reference's next tokens as point masses; other histories keep the drafter's own drafts. Stateless,
    so threads may draft through it at once."""
    original = DFlashCandidateGenerator.propose

    def propose(self, histories, *args, **kwargs):
        drafts, scores = original(self, histories, *args, **kwargs)
        history = histories[0]
        reference = next((r[0] for r in references if len(r[0]) > len(history)
                          and torch.equal(r[0, : len(history)], history)), None)
        if reference is None:
            return drafts, scores
        drafts = drafts.clone()
        for j in range(min(drafts.shape[1], len(reference) - len(history))):
            drafts[0, j] = reference[len(history) + j]
        return drafts, torch.full_like(scores, float("-inf")).scatter(2, drafts[..., None], 0.0)

    DFlashCandidateGenerator.propose = propose
    try:
        yield
    finally:
        DFlashCandidateGenerator.propose = original


def test_a_call_leaves_the_environment_alone_while_it_runs(qwen3_target):
    """No forward of a DFlash call sees os.environ changed (another thread's attention would read it), and the call
    attends with grouped key/value heads all the same."""
    environment, seen = dict(os.environ), []
    user_set = "TRANSFORMERS_SDPA_FORCE_GQA" in environment  # a value the user set decides alone
    drafter = make_drafter(qwen3_target)
    handle = qwen3_target.register_forward_pre_hook(
        lambda *args: seen.append((dict(os.environ) == environment, grouped_heads_switched_on())))
    try:
        qwen3_target.generate(make_prompt(9), assistant_model=drafter, max_new_tokens=12, do_sample=False)
    finally:
        handle.remove()
    assert seen and all(untouched for untouched, _ in seen), "os.environ changed while the call ran"
    assert user_set or all(grouped for _, grouped in seen), "the call attended without grouped heads"


def test_a_plain_thread_keeps_transformers_attention_while_a_drafter_call_runs(qwen3_target, monkeypatch):
    """A plain generate runs from start to end while another thread's DFlash call is held mid-way (its grouped-head
    attention switched on): its masked attention stays transformers' own (no grouped heads), and both threads get
    plain generate's tokens."""
    monkeypatch.delenv("TRANSFORMERS_SDPA_FORCE_GQA", raising=False)
    drafter = make_drafter(qwen3_target)
    prompts = make_prompt(9, seed=1), make_prompt(11, seed=2)
    padding = torch.ones_like(prompts[1])
    padding[0, :2] = 0  # a padded prompt: the plain call's forwards are masked
    expected = (plain_generate(qwen3_target, prompts[0], max_new_tokens=16),
                plain_generate(qwen3_target, prompts[1], attention_mask=padding, max_new_tokens=16))
    drafting = {}  # "thread": the drafting thread's id, once it runs
    drafter_started, plain_done, grouped_in_plain = threading.Event(), threading.Event(), []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def recording_sdpa(*args, **kwargs):
        if threading.get_ident() != drafting.get("thread") and kwargs.get("attn_mask") is not None:
            grouped_in_plain.append(kwargs.get("enable_gqa", False))
        return sdpa(*args, **kwargs)

    def hold_the_drafter_call(module, args):
        if threading.get_ident() == drafting.get("thread") and drafter_started.is_set():
            assert plain_done.wait(JOIN_SECONDS)  # the plain thread runs all of its call meanwhile
        drafter_started.set()

    def with_drafter():
        drafting["thread"] = threading.get_ident()
        return qwen3_target.generate(prompts[0], assistant_model=drafter, max_new_tokens=16, do_sample=False)

    def plain():
        assert drafter_started.wait(JOIN_SECONDS)
        try:
            return plain_generate(qwen3_target, prompts[1], attention_mask=padding, max_new_tokens=16)
        finally:
            plain_done.set()

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recording_sdpa)
    handle = qwen3_target.register_forward_pre_hook(hold_the_drafter_call)
    try:
        got = run_together(with_drafter, plain)
    finally:
        handle.remove()
    assert grouped_in_plain and not any(grouped_in_plain), "the plain thread attended with grouped heads"
    for output, reference in zip(got, expected, strict=True):
        assert_same(output, reference)


def test_a_second_copy_of_the_attention_module_shares_the_one_switch():
    """A remote-code copy of the payload loads beside the installed package: it wraps transformers' rule no second
    time and switches the same ContextVar, whichever copy's loop runs."""
    rule = sdpa_attention.use_gqa_in_sdpa
    spec = importlib.util.spec_from_file_location("remote_copy_attention_dflash", attention_dflash.__file__)
    remote = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(remote)
    assert sdpa_attention.use_gqa_in_sdpa is rule and remote._SWITCH is attention_dflash._SWITCH
    with remote.grouped_query_attention("cpu"):
        assert attention_dflash.grouped_heads_switched_on() or remote.FORCE_GQA in os.environ


PAIRS = {
    "drafter and plain": ({"dflash_policy": "cost"}, None),
    "two drafters": ({"dflash_policy": "cost"}, {"dflash_policy": "full"}),
    "one drafter shared": ({"dflash_policy": "cost"}, {"dflash_policy": "cost"}),
}


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
@pytest.mark.parametrize("pair", PAIRS)
def test_two_threads_generating_at_once_get_plain_generate_output(arch, pair):
    """Two threads, each generating three prompts in turn on one shared target, released together: with a drafter
    (oracle drafts, so drafts are accepted, and the default cost-aware policy learning as it goes) or without one;
    two drafters, or one drafter shared by both threads (its policy memory and stats shared too)."""
    target = cached_target(arch)
    options = PAIRS[pair]
    drafters = [make_drafter(target, 8, seed=1), make_drafter(target, 8, seed=2)]
    if pair == "one drafter shared":
        drafters[1] = drafters[0]
    prompts = [[make_prompt(length, seed=10 * thread + length) for length in (5, 9, 14)] for thread in (0, 1)]
    expected = [[plain_generate(target, prompt, max_new_tokens=24) for prompt in mine] for mine in prompts]

    def generating(thread: int):
        def job():
            extra = options[thread]
            assisted = {} if extra is None else {"assistant_model": drafters[thread], **extra}
            return [target.generate(p, max_new_tokens=24, do_sample=False, **assisted) for p in prompts[thread]]
        return job

    with oracle_drafts([reference for mine in expected for reference in mine]):
        got = run_together(generating(0), generating(1))
    for thread in (0, 1):
        for output, reference in zip(got[thread], expected[thread], strict=True):
            assert_same(output, reference, f"thread {thread} ({pair}): ")
    if pair == "two drafters":  # each drafter's last_stats is its own thread's last call: oracle drafts accepted
        assert drafters[1].last_stats.mean_acceptance_length > 2


@pytest.mark.parametrize("family", ["qwen3_5", "falcon_h1"])
def test_two_threads_drafting_for_one_hybrid_target_get_plain_generate_output(family):
    """A hybrid (recurrent) target, which transformers 5.23-5.24 marks stateful: two threads' DFlash calls overlap on
    it, each thread three in turn, and each gets plain generate's tokens; the target ends as it was."""
    target = family_target(family)
    drafters = [make_drafter(target, 8, seed=1), make_drafter(target, 8, seed=2)]
    prompts = [make_prompt(9, seed=1), make_prompt(12, seed=2)]
    expected = [plain_generate(target, prompt, max_new_tokens=24) for prompt in prompts]

    def generating(thread: int):
        return lambda: [target.generate(prompts[thread], assistant_model=drafters[thread], max_new_tokens=24,
                                        do_sample=False) for _ in range(3)]

    with oracle_drafts(expected):
        got = run_together(generating(0), generating(1))
    for thread in (0, 1):
        for output in got[thread]:
            assert_same(output, expected[thread], f"thread {thread}: ")
    assert "_is_stateful" not in vars(target)


class Stateful:
    """Stands for a recurrent target: transformers (5.23-5.24) refuses assisted generation when `_is_stateful`."""

    _is_stateful = True


def test_overlapping_calls_share_the_lifted_stateful_refusal():
    """Two DFlash calls on one stateful target overlap (a thread starts while another runs, and ends first): the
    refusal stays lifted until the last one ends, then the target is as it was, the instance's own value included."""
    target = Stateful()
    first, second = _rewindable_target(target), _rewindable_target(target)
    first.__enter__()
    second.__enter__()  # another thread's call starts
    first.__exit__(None, None, None)  # the first call ends while the second runs
    assert target._is_stateful is False, "the refusal came back under a running call"
    second.__exit__(None, None, None)
    assert target._is_stateful is True and "_is_stateful" not in vars(target)
    target._is_stateful = True  # an instance's own value is restored, not dropped
    with _rewindable_target(target), _rewindable_target(target):
        assert target._is_stateful is False
    assert vars(target)["_is_stateful"] is True


def test_four_threads_share_the_lifted_stateful_refusal():
    """Four threads' DFlash calls on one stateful target, started one after another and ending in the same order:
    each still finds the refusal lifted as it ends, and the last leaves the target as it was."""
    target = Stateful()
    entered, ended = [threading.Event() for _ in range(4)], [threading.Event() for _ in range(4)]

    def call(index: int):
        def job() -> bool:
            try:
                assert index == 0 or entered[index - 1].wait(JOIN_SECONDS)
                with _rewindable_target(target):
                    entered[index].set()
                    assert entered[-1].wait(JOIN_SECONDS)  # all four in flight
                    assert index == 0 or ended[index - 1].wait(JOIN_SECONDS)  # the earlier calls have ended
                    return target._is_stateful is False
            finally:
                ended[index].set()
        return job

    assert run_together(*(call(i) for i in range(4))) == [True] * 4
    assert target._is_stateful is True and "_is_stateful" not in vars(target)
