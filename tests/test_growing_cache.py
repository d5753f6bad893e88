# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""On a CPU the loop's dynamic target cache writes each forward's keys and values in place (``GrowingLayer``:
buffers with room to grow, views of the slots written) where transformers' ``DynamicLayer`` concatenates the whole
cache at every forward. It must hold exactly what transformers' layer holds, through every way the loop changes a
cache (crops after rejected drafts, rows retired from a batch, slots moved), give bit-identical logits, and be what a
CPU call decodes on, without a new buffer per forward. Every other CPU test of the loop (chains, policies, trees,
batches, families) runs on it too."""

import pytest
import torch
from conftest import cached_target, make_drafter, make_prompt, plain_generate
from transformers.cache_utils import DynamicCache, DynamicLayer

from hf_dflash import cache_dflash
from hf_dflash.cache_dflash import GrowingLayer, cache_argument, grow_in_place, move_slots


def states(width: int, batch: int = 2, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(batch, 2, width, 4, generator=generator), torch.randn(batch, 2, width, 3, generator=generator)


@pytest.mark.parametrize("most_slots", [None, 12, 1000])
def test_a_growing_layer_holds_what_transformers_layer_holds(most_slots):
    """Prefill, verify blocks, crops of rejected drafts, a finished row selected out, slots moved (a batch squeezing
    its padding), and enough tokens to outgrow the buffers: after each, the same keys and values (values of another
    head size, as in multi-head latent attention)."""
    plain, growing = DynamicLayer(), GrowingLayer()
    growing.most_slots = most_slots
    GrowingLayer.GROWTH, growth = 5, GrowingLayer.GROWTH  # outgrown within the test
    try:
        steps = [("update", 7), ("update", 4), ("crop", 3), ("update", 1), ("update", 6), ("crop", 5), ("select", 0),
                 ("update", 3), ("move", 0), ("update", 9), ("crop", 1), ("update", 2)]
        for seed, (step, width) in enumerate(steps):
            for layer in (plain, growing):
                if step == "update":
                    got = layer.update(*states(width, batch=layer.keys.shape[0] if layer.is_initialized else 2,
                                               seed=seed))
                    assert got[0] is layer.keys and got[1] is layer.values
                elif step == "crop":
                    layer.crop(-width)
                elif step == "select":
                    layer.batch_select_indices(torch.tensor([1]))
                else:  # keep every other slot, in order
                    held = layer.keys.shape[-2]
                    move_slots(layer, torch.arange(0, held, 2)[None], held)
            assert torch.equal(growing.keys, plain.keys) and torch.equal(growing.values, plain.values), (seed, step)
    finally:
        GrowingLayer.GROWTH = growth


def test_a_layer_past_its_bound_grows_as_without_one(monkeypatch):
    """A batch's padding slots can take a call past the slots it was sized for: past its bound a layer makes room
    again, rather than a new buffer at every forward."""
    grown = []
    regrow = GrowingLayer._grown
    monkeypatch.setattr(GrowingLayer, "_grown", lambda self, *args: grown.append(args[-1]) or regrow(self, *args))
    layer = GrowingLayer()
    layer.most_slots = 4
    for seed in range(40):
        layer.update(*states(1, seed=seed))
    assert grown == [1, 1, 5, 5], f"new buffers (keys, values) at slots {grown}"


def test_verify_logits_are_bit_identical_on_a_growing_cache():
    """The target's logits over a prompt and verify blocks of 1-16 rows, each block's drafts then cropped, are bit for
    bit those on transformers' dynamic cache: attention reads the same values, from a view of a larger buffer."""
    target = cached_target("llama")
    prompt = make_prompt(40)
    caches = {"plain": DynamicCache(config=target.config), "growing": DynamicCache(config=target.config)}
    grow_in_place(caches["growing"])
    logits = {}
    with torch.no_grad():
        for name, cache in caches.items():
            keyword = {cache_argument(target): cache}
            logits[name] = [target(input_ids=prompt, **keyword).logits]
            for width in (1, 3, 16, 2, 7):
                block = make_prompt(width, seed=width)
                logits[name].append(target(input_ids=block, **keyword).logits)
                cache.crop(-(width - 1))  # one row kept: the rest were rejected drafts
    assert all(type(layer) is GrowingLayer for layer in caches["growing"].layers)
    for plain, growing in zip(logits["plain"], logits["growing"]):
        assert torch.equal(plain, growing)


def test_a_cpu_call_decodes_on_buffers_it_does_not_reallocate(monkeypatch):
    """A call writes its target cache in place: each layer's buffer is made once, at the prompt (its room is the
    call's max_length and a block), and the output is plain generate's."""
    target = cached_target("qwen3")
    drafter = make_drafter(target)
    prompt = make_prompt(30)
    grown = []
    regrow = GrowingLayer._grown
    monkeypatch.setattr(GrowingLayer, "_grown", lambda self, *args: grown.append(self) or regrow(self, *args))
    with torch.no_grad():
        out = target.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=40, do_sample=False,
                              assistant_model=drafter, return_dict_in_generate=True)
    layers = out.past_key_values.layers
    assert all(type(layer) is GrowingLayer for layer in layers)
    assert len(grown) == 2 * len(layers), "a layer's keys or values were copied into a new buffer during the call"
    assert torch.equal(out.sequences, plain_generate(target, prompt, max_new_tokens=40))


def test_gpus_keep_transformers_layers(monkeypatch):
    """Only CPU calls swap the layers (measured there): a target elsewhere keeps transformers' own."""
    target = cached_target("qwen3")
    monkeypatch.setattr(type(target), "device", property(lambda self: torch.device("cuda")), raising=False)
    cache = cache_dflash.empty_target_cache(target, {}, block_size=8, max_length=40)
    assert not any(type(layer) is GrowingLayer for layer in cache.layers)
