# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""The few-row CPU matrix kernel (hf_dflash/kernels_cpu.py): it computes what torch's product does, a row's result
never depends on the rows beside it, DFlash calls on a CPU that opt in use it for their few-row verifies and drafter
reads (not for plain steps) and stay lossless, their costs are kept apart, and layers get their own forwards back."""

import threading

import pytest
import torch
from conftest import assert_lossless, cached_target, make_drafter, make_prompt, make_target, plain_generate
from torch import nn

from hf_dflash import kernels_cpu
from hf_dflash.capture_dflash import forward_kernels
from hf_dflash.costs_dflash import cost_tables
from hf_dflash.options_dflash import DFlashCallOptions, resolve_call_options

pytestmark = pytest.mark.skipif(kernels_cpu.unavailable_reason() is not None or kernels_cpu.extension() is None,
                                reason="the kernel cannot be built on this machine (kernels_cpu.unavailable_reason)")


@pytest.fixture
def kernel_rows(monkeypatch):
    """The row counts of every product the kernel computed inside the test."""
    rows, kernel = [], kernels_cpu.few_rows_linear

    def counted(x, weight, bias=None):
        rows.append(x.shape[0])
        return kernel(x, weight, bias)

    monkeypatch.setattr(kernels_cpu, "few_rows_linear", counted)
    return rows


# (out, in): rows of the weight in blocks of 4 and a tail; inputs in chunks of 8 and a tail; SmolLM2's head
SHAPES = [(40, 64), (43, 61), (3, 5), (1, 8), (49152, 576)]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("shape", SHAPES)
def test_the_kernel_computes_what_torch_does(shape, threads):
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        generator = torch.Generator().manual_seed(0)
        weight, bias = torch.randn(*shape, generator=generator), torch.randn(shape[0], generator=generator)
        for rows in range(1, kernels_cpu.MOST_ROWS + 2):
            x = torch.randn(rows, shape[1], generator=generator)
            for b in (None, bias):
                expected = nn.functional.linear(x, weight, b)
                got = kernels_cpu.few_rows_linear(x, weight, b)
                assert torch.allclose(got, expected, rtol=1e-5, atol=1e-5 * shape[1] ** 0.5), (rows, b is None)
    finally:
        torch.set_num_threads(previous)


def test_a_rows_result_does_not_depend_on_the_rows_beside_it():
    """A verify's row i is computed exactly as the same row alone (the sums run in one fixed order per output)."""
    generator = torch.Generator().manual_seed(1)
    weight, x = torch.randn(43, 61, generator=generator), torch.randn(16, 61, generator=generator)
    alone = torch.cat([kernels_cpu.few_rows_linear(x[i : i + 1], weight) for i in range(16)])
    for rows in (2, 3, 5, 16):
        assert torch.equal(kernels_cpu.few_rows_linear(x[:rows], weight), alone[:rows]), rows


def test_only_few_float32_rows_of_plain_linear_layers_take_the_kernel(kernel_rows):
    class Quantized(nn.Linear):  # a subclass computes its own way
        pass

    plain, sub, half = nn.Linear(16, 8), Quantized(16, 8), nn.Linear(16, 8).to(torch.bfloat16)
    with torch.no_grad(), kernels_cpu.few_row_kernels(plain, sub, half) as routed:
        for rows in (1, 2, kernels_cpu.MOST_ROWS, kernels_cpu.MOST_ROWS + 1):
            plain(torch.randn(rows, 16))
            sub(torch.randn(rows, 16))
        half(torch.randn(4, 16, dtype=torch.bfloat16))
        plain(torch.randn(2, 3, 16))  # [batch, width, hidden]: 6 rows
    assert routed == 1 and kernel_rows == [2, kernels_cpu.MOST_ROWS, 6]
    with torch.no_grad():
        plain(torch.randn(4, 16))  # outside the block: torch's product
    assert kernel_rows == [2, kernels_cpu.MOST_ROWS, 6]


def test_layers_get_their_own_forwards_back_even_after_an_error():
    model = nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 4))
    with pytest.raises(RuntimeError, match="stop"):
        with kernels_cpu.few_row_kernels(model, model) as routed:  # a model twice: each layer routed once
            assert routed == 2 and all("forward" in layer.__dict__ for layer in (model[0], model[2]))
            raise RuntimeError("stop")
    assert not any("forward" in layer.__dict__ for layer in model)


def test_another_threads_forwards_keep_torchs_product_while_a_call_routes_the_layers(kernel_rows):
    layer, inside, done = nn.Linear(16, 8), threading.Event(), threading.Event()

    def routed_call():
        with kernels_cpu.few_row_kernels(layer):
            inside.set()
            done.wait(60)

    thread = threading.Thread(target=routed_call)
    thread.start()
    inside.wait(60)
    with torch.no_grad():
        layer(torch.randn(4, 16))  # this thread is outside the block
    done.set()
    thread.join(60)
    assert kernel_rows == [] and "forward" not in layer.__dict__


@pytest.mark.parametrize("kind", ["qwen3", "llama"])
def test_dflash_calls_on_a_cpu_verify_with_the_kernel_and_stay_lossless(kind, kernel_rows):
    """Verifies and the drafter's context reads of 2-7 rows take the kernel; plain steps keep torch's one-row
    product; the output is plain generate's with drafters good and bad."""
    target = cached_target(kind)
    drafter, prompt = make_drafter(target), make_prompt(12, seed=3)
    assert_lossless(target, drafter, prompt, max_new_tokens=24,
                    assisted={"num_assistant_tokens": 4, "dflash_cpu_kernels": True})
    assert kernel_rows and min(kernel_rows) >= 2 and max(kernel_rows) <= kernels_cpu.MOST_ROWS


def test_the_kernel_is_opt_in_per_call_and_per_process(kernel_rows, monkeypatch):
    target = cached_target("qwen3")
    drafter, prompt = make_drafter(target), make_prompt(12, seed=3)
    expected = plain_generate(target, prompt, max_new_tokens=12, do_sample=False)

    def rows_used(**switch) -> list[int]:
        kernel_rows.clear()
        got = target.generate(prompt, assistant_model=drafter, max_new_tokens=12, do_sample=False,
                              num_assistant_tokens=4, **switch)
        assert torch.equal(got, expected)
        return list(kernel_rows)

    monkeypatch.delenv(kernels_cpu.ENVIRONMENT_SWITCH, raising=False)
    assert rows_used() == [] and rows_used(dflash_cpu_kernels=True) != []
    monkeypatch.setenv(kernels_cpu.ENVIRONMENT_SWITCH, "1")
    assert rows_used() != [] and rows_used(dflash_cpu_kernels=False) == []


def test_the_policys_costs_with_the_kernel_are_a_table_of_their_own():
    """Costs measured with the kernel must not price forwards without it (nor the reverse): a call's table says
    which kernel its forwards ran with."""
    target = make_target("qwen3", seed=11)
    drafter, prompt = make_drafter(target), make_prompt(12, seed=3)
    for kernels in (True, False):
        target.generate(prompt, assistant_model=drafter, max_new_tokens=8, do_sample=False, dflash_policy="cost",
                        dflash_cpu_kernels=kernels)
    keys = list(cost_tables(target))
    assert len(keys) == 2 and ["few-row kernel" in key for key in keys] == [True, False], keys


def test_a_bad_switch_value_is_refused_with_the_fix():
    from transformers import GenerationConfig

    with pytest.raises(ValueError, match=r"dflash_cpu_kernels='yes'.*True.*False"):
        resolve_call_options(GenerationConfig(), {"dflash_cpu_kernels": "yes"})


def test_captured_forwards_keep_torchs_product():
    target = cached_target("qwen3")

    def serves(options) -> bool:
        with forward_kernels(target, target, options) as on:
            return on

    assert not serves(DFlashCallOptions(compile=True, cpu_kernels=True))
    assert not serves(DFlashCallOptions(cpu_kernels=False)) and serves(DFlashCallOptions(cpu_kernels=True))


def test_where_the_kernel_cannot_be_built_torchs_product_serves(monkeypatch, kernel_rows):
    monkeypatch.setattr(kernels_cpu, "extension", lambda: None)
    layer = nn.Linear(16, 8)
    with torch.no_grad(), kernels_cpu.few_row_kernels(layer) as routed:
        layer(torch.randn(4, 16))
    assert routed == 0 and kernel_rows == []
    x, weight = torch.randn(3, 16), torch.randn(8, 16)
    assert torch.equal(kernels_cpu.few_rows_linear(x, weight), nn.functional.linear(x, weight))
