# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""DFlare drafters with several layers, against a forward written here from their modules: layer d attends to the
context mixed with ITS fusion weights (row d of `layer_fusion_weights`), and the context's K/V come from the layer's
`k_proj_target` / `v_proj_target` (the block's own from `k_proj` / `v_proj`). End-to-end losslessness cannot see
either: the target verifies every draft, so a wrongly wired drafter only drafts worse."""

import pytest
import torch
from conftest import cached_target, make_drafter
from transformers.cache_utils import DynamicCache

VARIANTS = {
    "dflare": dict(layer_fusion=True, split_context_kv=True),
    "fusion-only": dict(layer_fusion=True, split_context_kv=False),
    "split-kv-only": dict(layer_fusion=False, split_context_kv=True),
    "dflash": dict(layer_fusion=False, split_context_kv=False),
}
BLOCK, CONTEXT = 4, 7


def dflare_drafter(num_layers: int, **switches):
    """A drafter over the shared tiny Qwen3 (4 layers, all of them features: T = 4 for L = 2 or 3 layers), with
    random fusion weights (every layer mixes the features its own way) and every weight moved off its init."""
    drafter = make_drafter(cached_target("qwen3"), block_size=BLOCK, num_hidden_layers=num_layers,
                           target_layer_ids=[0, 1, 2, 3], **switches)
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, parameter in drafter.named_parameters():
            scale = 2.0 if name == "layer_fusion_weights" else 0.05
            parameter.add_(scale * torch.randn(parameter.shape, generator=generator))
    return drafter


def inputs(drafter):
    """Block embeddings [1, BLOCK, H] and context features [1, CONTEXT, T*H] whose T parts differ in scale."""
    generator = torch.Generator().manual_seed(3)
    hidden, features = drafter.config.hidden_size, len(drafter.config.target_layer_ids)
    noise = torch.randn(1, BLOCK, hidden, generator=generator)
    scales = torch.arange(1, features + 1, dtype=torch.float).repeat_interleave(hidden)
    return noise, torch.randn(1, CONTEXT, features * hidden, generator=generator) * scales


def expected_contexts(drafter, features):
    """Per drafter layer: hidden_norm(sum_t softmax(w_d)_t * feature_t) (DFlare), or hidden_norm(fc(features))."""
    if drafter.fc is not None:
        return [drafter.hidden_norm(drafter.fc(features))] * len(drafter.layers)
    parts = features.view(*features.shape[:2], len(drafter.config.target_layer_ids), -1).unbind(2)
    return [drafter.hidden_norm(sum(w * part for w, part in zip(weights.softmax(-1), parts)))
            for weights in drafter.layer_fusion_weights]


def rope(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


def reference_forward(drafter, noise, features):
    """The drafter's last hidden state [1, BLOCK, H], computed from its modules without its forward methods: context
    K/V by *_proj_target when split_context_kv, block K/V by k_proj / v_proj; block queries attend to context and
    block (no mask); RoPE at positions 0..CONTEXT-1 (context), then CONTEXT.. (block)."""
    config = drafter.config
    split = config.split_context_kv
    q_len, kv_len = noise.shape[1], features.shape[1] + noise.shape[1]
    cos, sin = (t[:, None] for t in drafter.rotary_emb(noise, torch.arange(kv_len)[None]))
    hidden = noise
    for layer, context in zip(drafter.layers, expected_contexts(drafter, features)):
        attn = layer.self_attn
        x = layer.input_layernorm(hidden)
        key = torch.cat([(attn.k_proj_target if split else attn.k_proj)(context), attn.k_proj(x)], dim=1)
        value = torch.cat([(attn.v_proj_target if split else attn.v_proj)(context), attn.v_proj(x)], dim=1)
        query = attn.q_norm(attn.q_proj(x).view(1, q_len, -1, attn.head_dim)).transpose(1, 2)
        key = attn.k_norm(key.view(1, kv_len, -1, attn.head_dim)).transpose(1, 2)
        value = value.view(1, kv_len, -1, attn.head_dim).transpose(1, 2)
        query, key = rope(query, cos[..., -q_len:, :], sin[..., -q_len:, :]), rope(key, cos, sin)
        groups = config.num_attention_heads // config.num_key_value_heads
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
        weights = (query @ key.transpose(-1, -2) * attn.head_dim**-0.5).softmax(-1)
        hidden = hidden + attn.o_proj((weights @ value).transpose(1, 2).reshape(1, q_len, -1))
        hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
    return drafter.norm(hidden)


@pytest.mark.parametrize("num_layers", [2, 3])
def test_fusion_gives_each_layer_its_own_mix(num_layers):
    drafter = dflare_drafter(num_layers, layer_fusion=True, split_context_kv=True)
    _, features = inputs(drafter)
    with torch.no_grad():
        contexts = drafter.project_context(features)
        expected = expected_contexts(drafter, features)
    assert len(contexts) == num_layers
    for d in range(num_layers):
        torch.testing.assert_close(contexts[d], expected[d], rtol=1e-5, atol=1e-6, msg=f"drafter layer {d}")
    assert not torch.allclose(expected[0], expected[-1], atol=1e-3)  # the layers' mixes do differ


@pytest.mark.parametrize("num_layers", [2, 3])
@pytest.mark.parametrize("variant", VARIANTS)
def test_forward_matches_a_forward_written_from_the_modules(variant, num_layers):
    """One forward, and the same context fed in two drafter calls through a cache (as generate feeds it), both equal
    the reference; the reference with another wiring (layers' mixes reversed, context K/V by the block's
    projections) does not, so the comparison can tell."""
    drafter = dflare_drafter(num_layers, **VARIANTS[variant])
    noise, features = inputs(drafter)
    positions = torch.arange(CONTEXT + BLOCK)[None]
    with torch.no_grad():
        expected = reference_forward(drafter, noise, features)
        got = drafter(noise_embeds=noise, context_hidden_states=features, position_ids=positions).last_hidden_state
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5, msg="one forward")

        cache, split = DynamicCache(), 3
        drafter(noise_embeds=noise, context_hidden_states=features[:, :split],
                position_ids=torch.cat([positions[:, :split], positions[:, CONTEXT:]], dim=1), past_key_values=cache)
        cache.crop(-BLOCK)  # keep the context K/V only, as the candidate generator does
        cached = drafter(noise_embeds=noise, context_hidden_states=features[:, split:],
                         position_ids=positions[:, split:], past_key_values=cache).last_hidden_state
        torch.testing.assert_close(cached, expected, rtol=1e-4, atol=1e-5, msg="context fed through the cache")

        if drafter.config.layer_fusion:
            weights = drafter.layer_fusion_weights.clone()
            drafter.layer_fusion_weights.copy_(weights.flip(0))
            assert not torch.allclose(reference_forward(drafter, noise, features), got, atol=1e-3)
            drafter.layer_fusion_weights.copy_(weights)
        if drafter.config.split_context_kv:
            drafter.config.split_context_kv = False
            assert not torch.allclose(reference_forward(drafter, noise, features), got, atol=1e-3)
            drafter.config.split_context_kv = True
