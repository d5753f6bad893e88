# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""Captured forwards (``dflash_compile=True``: the target's verify compiled with torch.compile at a fixed set of
widths over a static cache, hf_dflash/capture_dflash.py) are lossless exactly as the eager loop: the same tokens as
plain ``generate``, with drafters good and bad, on every path the default policy takes. Compiles are counted and a
recompile is a warning; the paths that stay eager say so and stay lossless; bad switches raise before any work.

One test compiles with inductor (the backend users get: ~10 s a graph for these tiny models on one thread, 85 s in
all on a slow 2-core VM: it runs in the slow tier, which .ci/run runs after the fast suite); the others use the
"aot_eager" backend through transformers' CompileConfig (the same capture by dynamo, without code
generation), so the fast suite stays fast. On CUDA (tests/test_devices.py's tier) the graphs are replayed.
"""

import logging

import pytest
import torch
from conftest import (
    DRAFTER_KINDS,
    assert_lossless,
    cached_target,
    every_policy_path,
    left_padded,
    make_drafter,
    make_prompt,
    make_target,
    needs_static_crop,
)
from transformers import CompileConfig, DynamicCache, StaticCache
from transformers.cache_utils import StaticLayer

from hf_dflash.capture_dflash import CapturedDraft, CapturedForward, CapturedVerify, capture_requested
from hf_dflash.options_dflash import DFlashCallOptions
from hf_dflash.policy_dflash import CostAwarePolicy
from hf_dflash.timing_dflash import captured_widths

NEW = 30
# dynamo's capture without inductor's code generation: seconds, not minutes
AOT_EAGER = CompileConfig(backend="aot_eager", fullgraph=True, dynamic=False)


def warnings_logged(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith("hf_dflash") and r.levelno == logging.WARNING]


@pytest.fixture(scope="module")
def qwen3():
    target = cached_target("qwen3")
    return target, make_drafter(target, block_size=8)


@pytest.mark.slow
@needs_static_crop
def test_captured_verify_is_lossless_with_inductor(qwen3):
    target, drafter = qwen3
    compiled = []

    def check(kind, got, expected, proposals):
        compiled.append(drafter.last_stats.graphs_compiled)

    assert_lossless(target, drafter, make_prompt(12), max_new_tokens=NEW, assisted={"dflash_compile": True},
                    check=check)
    assert compiled[0] >= 1, "the first call compiles the verify forward"
    assert compiled[1:] == [0] * (len(DRAFTER_KINDS) - 1), "later calls (same cache length) reuse the graphs"


@pytest.mark.slow  # ~20 s of compiling
@needs_static_crop
def test_a_fresh_target_is_captured_from_its_first_call():
    """A target no forward has asked for hidden states yet: transformers installs its recording hooks at the first
    forward that asks, which must not be the compiled one (dynamo cannot trace the lock; the call would run eager)."""
    target = make_target(seed=7)
    drafter = make_drafter(target, block_size=8)
    ids = make_prompt(12)
    expected = target.generate(ids, max_new_tokens=12, do_sample=False)
    got = target.generate(ids, max_new_tokens=12, do_sample=False, assistant_model=drafter, dflash_compile=True,
                          compile_config=AOT_EAGER)
    assert got.tolist() == expected.tolist()
    assert drafter.last_stats.graphs_compiled >= 1, "the first call ran its verify eagerly"


def test_every_policy_path_is_lossless_captured(qwen3):
    target, drafter = qwen3
    with every_policy_path() as choices:
        assert_lossless(target, drafter, make_prompt(14, seed=3), max_new_tokens=NEW, compile_config=AOT_EAGER,
                        assisted={"dflash_compile": True, "dflash_policy": "cost"})
    assert {d.count for d in choices} >= {0, drafter.config.block_size - 1}, "plain steps and full blocks ran"
    assert any(d.from_lookup for d in choices), "prompt-lookup chains ran"


@needs_static_crop
def test_a_compile_config_captures_where_transformers_would_compile(qwen3):
    """transformers compiles plain decoding on accelerators, or anywhere with ``_compile_all_devices``."""
    target, drafter = qwen3
    everywhere = CompileConfig(backend="aot_eager", fullgraph=True, dynamic=False)
    everywhere._compile_all_devices = True
    assert not capture_requested(DFlashCallOptions(compile=None, compile_config=AOT_EAGER), torch.device("cpu"))
    assert capture_requested(DFlashCallOptions(compile=None, compile_config=AOT_EAGER), torch.device("cuda"))
    prompt = make_prompt(10, seed=5)
    torch._dynamo.reset()
    for config, graphs in ((AOT_EAGER, 0), (everywhere, 1)):
        assert_lossless(target, drafter, prompt, kinds=("noisy",), max_new_tokens=NEW, compile_config=config)
        assert (drafter.last_stats.graphs_compiled > 0) == bool(graphs), config


@pytest.mark.parametrize("case", ["batch", "tree", "dynamic cache", "static layers without crop"])
def test_paths_that_stay_eager_say_so_and_stay_lossless(qwen3, case, caplog, monkeypatch):
    """Each says why; transformers 5.23 (whose static layers cannot be cropped: taken away here on later versions)
    names the version that captures."""
    target, drafter = qwen3
    if case == "static layers without crop":
        monkeypatch.delattr(StaticLayer, "crop", raising=False)
    prompt, kwargs = make_prompt(10, seed=7), {"max_new_tokens": 20, "compile_config": AOT_EAGER}
    assisted = {"dflash_compile": True}
    if case == "batch":
        prompt, mask = left_padded([make_prompt(10, seed=7), make_prompt(6, seed=8)])
        kwargs["attention_mask"] = mask
    elif case == "tree":
        assisted["dflash_tree_budget"] = 6
    with caplog.at_level(logging.WARNING, logger="hf_dflash"):
        if case == "dynamic cache":
            expected = target.generate(prompt, do_sample=False, **kwargs)
            got = target.generate(prompt, assistant_model=drafter, do_sample=False, past_key_values=DynamicCache(),
                                  **assisted, **kwargs)
            assert got.tolist() == expected.tolist()
        else:
            assert_lossless(target, drafter, prompt, kinds=("random",), assisted=assisted, **kwargs)
    assert drafter.last_stats.graphs_compiled == 0
    eager = [message for message in warnings_logged(caplog) if "runs eagerly" in message]
    assert eager, warnings_logged(caplog)
    if case == "static layers without crop":
        assert "transformers >= 5.24" in eager[0], eager[0]


@needs_static_crop
def test_a_recompile_is_a_warning(qwen3, caplog):
    """A graph compiled again for a width and cache length it was compiled for is never silent."""
    target, drafter = qwen3
    torch._dynamo.reset()
    verify = CapturedVerify(target, widest=2, settings=AOT_EAGER.to_dict())
    cache = StaticCache(config=target.config, max_cache_len=32)
    ids = make_prompt(6)
    kwargs = {"past_key_values": cache, "use_cache": True, "output_hidden_states": [1, 2]}
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="hf_dflash"):
        target(input_ids=ids, **kwargs)  # the prefill, eager: the cache's tensors are made here
        for attempt in range(2):
            if attempt:
                torch._dynamo.reset()  # what a changed guard does: the graph is compiled again
            verify(32, input_ids=ids[:, :1], position_ids=torch.tensor([[6]]), **kwargs)
            cache.crop(-1)
    assert verify.graphs == 2
    assert [m for m in warnings_logged(caplog) if "compiled again at width 1" in m], warnings_logged(caplog)


def static_verify(target, verify, cache_length: int, **kwargs):
    """A prefill (eager) then one captured width-1 verify over a fresh static cache of `cache_length` slots."""
    cache = StaticCache(config=target.config, max_cache_len=cache_length)
    ids = make_prompt(6)
    forward = {"past_key_values": cache, "use_cache": True, "output_hidden_states": [1, 2], **kwargs}
    with torch.no_grad():
        target(input_ids=ids, **forward)
        return verify(cache_length, input_ids=ids[:, :1], position_ids=torch.tensor([[6]]), **forward)


@pytest.mark.slow  # ~12 s of compiling
def test_more_graphs_than_dynamos_limit_still_capture(qwen3):
    """Widths times cache lengths pass dynamo's limit of graphs per forward (8 by default; which, under fullgraph,
    raises): the captured verify raises its own limit and keeps compiling. The limit is lowered to 2 here so that 3
    graphs pass it (compiling 9 took most of a minute)."""
    target, _ = qwen3
    torch._dynamo.reset()
    verify = CapturedVerify(target, widest=2, settings=AOT_EAGER.to_dict())
    with torch._dynamo.config.patch(recompile_limit=2):  # dynamo's own patch (monkeypatch's undo deletes the key)
        for cache_length in (16, 24, 32):
            static_verify(target, verify, cache_length)
    assert verify.graphs == 3 and not verify.failed


def test_a_forward_that_cannot_be_captured_runs_eagerly_with_a_warning(qwen3, caplog, monkeypatch):
    target, _ = qwen3
    verify = CapturedVerify(target, widest=2, settings=AOT_EAGER.to_dict())
    monkeypatch.setitem(verify.entry, "failed", False)  # restored after the test: the compiled call is shared

    def refuse(**inputs):
        raise torch._dynamo.exc.FailOnRecompileLimitHit("Hard failure due to fullgraph=True")

    monkeypatch.setitem(verify.entry, "call", refuse)
    with caplog.at_level(logging.WARNING, logger="hf_dflash"):
        outputs = static_verify(target, verify, 16)
    assert verify.failed and outputs.logits.shape[1] == 1
    assert any("runs eagerly" in m for m in warnings_logged(caplog)), warnings_logged(caplog)


def test_captured_widths_cover_every_verify():
    assert captured_widths(16) == (1, 2, 4, 8, 16)
    assert captured_widths(11) == (1, 2, 4, 8, 11)  # a 10-token prompt lookup beyond a block of 8


@pytest.mark.parametrize("kwargs, message", [
    ({"dflash_compile": "yes"}, "dflash_compile='yes'"),
    ({"dflash_compile": True, "disable_compile": True}, "disable_compile=True"),
])
def test_bad_compile_switches_raise_before_any_work(qwen3, kwargs, message):
    target, drafter = qwen3
    with pytest.raises(ValueError, match=message):
        target.generate(make_prompt(8), assistant_model=drafter, max_new_tokens=4, **kwargs)


@needs_static_crop
def test_the_drafters_forward_runs_captured_at_a_blocks_width(qwen3, monkeypatch):
    """With the verify captured, the drafter's forward runs compiled at one shape (its context padded to a block's
    width) over its own static cache; a wider context (the prompt's) runs eagerly on the same cache. Lossless on
    every path of the default policy, with drafters good and bad."""
    target, drafter = qwen3
    widths, run = [], CapturedForward.run

    def spy(self, width, cache_length, **inputs):
        if self.name == "drafter":
            widths.append(inputs["context_hidden_states"].shape[1])
        return run(self, width, cache_length, **inputs)

    monkeypatch.setattr(CapturedForward, "run", spy)
    with every_policy_path():
        assert_lossless(target, drafter, make_prompt(14, seed=3), max_new_tokens=NEW, compile_config=AOT_EAGER,
                        assisted={"dflash_compile": True, "dflash_policy": "cost"})
    assert widths and set(widths) == {drafter.config.block_size}


@needs_static_crop
def test_the_captured_drafter_reads_what_the_eager_one_reads(qwen3):
    """Cycle after cycle (contexts of 1 to a block's tokens, and a prompt wider than a block first), the captured
    drafter's states equal the eager drafter's on a growing dynamic cache: the padding's slots are masked and given
    back, the next context overwrites them."""
    target, drafter = qwen3
    torch._dynamo.reset()
    captured = CapturedDraft(drafter, context_slots=64, settings=AOT_EAGER.to_dict())
    cache, block, hidden = DynamicCache(), drafter.config.block_size, target.config.hidden_size
    generator = torch.Generator().manual_seed(0)
    start = 0
    with torch.no_grad():
        for n in (11, 1, 3, block, 2, block - 1):
            context = torch.randn(1, n, hidden, generator=generator)
            embeds = torch.randn(1, block, hidden, generator=generator)
            positions = torch.arange(start, start + n + block)[None]
            eager = drafter(noise_embeds=embeds, context_hidden_states=context, position_ids=positions,
                            context_fused=True, past_key_values=cache).last_hidden_state
            cache.crop(-block)
            got = captured(embeds, context, positions)
            torch.testing.assert_close(got, eager, rtol=1e-4, atol=1e-5, msg=lambda m: f"context of {n}: {m}")
            start += n
    assert captured.length == start and captured.graphs == 1


@pytest.mark.slow  # ~20 s of compiling
@needs_static_crop
def test_a_drafter_forward_that_compiled_is_not_its_cost(qwen3, monkeypatch):
    """The cycle whose drafter forward compiled a graph does not teach the policy that drafting costs the compile."""
    target, drafter = qwen3
    torch._dynamo.reset()
    compiles, draft_costs = [], []
    count, observe = CapturedForward._count, CostAwarePolicy.observe_costs

    def counted(self, new, width, cache_length, seconds):
        if self.name == "drafter":
            compiles.append(seconds)
        return count(self, new, width, cache_length, seconds)

    def observed(self, batch, device, width, target_seconds, draft_seconds=None):
        draft_costs.append(draft_seconds)
        return observe(self, batch, device, width, target_seconds, draft_seconds)

    monkeypatch.setattr(CapturedForward, "_count", counted)
    monkeypatch.setattr(CostAwarePolicy, "observe_costs", observed)
    target.generate(make_prompt(12), max_new_tokens=NEW, do_sample=False, assistant_model=drafter,
                    dflash_compile=True, compile_config=AOT_EAGER, dflash_policy="cost")
    measured = [seconds for seconds in draft_costs if seconds is not None]
    assert compiles and measured and max(measured) < 0.5 * min(compiles), (compiles, measured)
