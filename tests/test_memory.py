# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""What a call keeps alive beyond plain decoding: the prompt's context once, written layer by layer during the
target's prefill (through a DFlash drafter's ``fc``: one state per token; a DFlare drafter's features, [b, n, T*H]),
never a tuple of the selected hidden states and their concatenation at the same time. Counted to the byte (:class:`~hf_dflash.evaluation.memory.PeakTensorMemory`), not
timed; the peak resident memory at 2K-8K-token prompts on SmolLM2 is in BENCHMARKS.md."""

import pytest
import torch
from conftest import FAMILIES, cached_target, family_target, make_drafter, make_prompt, make_target, plain_generate

from hf_dflash import policy_dflash
from hf_dflash.evaluation.memory import PeakTensorMemory
from hf_dflash.candidates_dflash import DFlashCandidateGenerator
from hf_dflash.features_dflash import PromptFeatureWriter
from hf_dflash.modeling_dflash import target_features
from hf_dflash.policy_dflash import CostAwarePolicy, Draft
from hf_dflash.schedules_dflash import FullBlocks


def measured(target, ids, max_new_tokens: int = 4, **kwargs) -> PeakTensorMemory:
    with torch.inference_mode(), PeakTensorMemory() as memory:
        target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False,
                        **kwargs)
    return memory


def peak_bytes(target, ids, **kwargs) -> int:
    return measured(target, ids, **kwargs).peak_bytes


def deep_narrow_target():
    """16 narrow layers: 15 selected layers' features outweigh a layer's transient tensors."""
    return make_target(num_hidden_layers=16, intermediate_size=64, max_position_embeddings=2048)


def test_the_prompt_features_are_held_once():
    """A DFlare drafter (layer fusion: no ``fc``) reads the 15 selected layers themselves: holding them twice (the
    selected hidden states and their concatenation) would set the call's peak at 1.5x."""
    target = deep_narrow_target()
    drafter = make_drafter(target, target_layer_ids=list(range(15)), layer_fusion=True)
    ids = make_prompt(1024)
    features = ids.shape[1] * 15 * target.config.hidden_size * 4  # fp32
    extra = peak_bytes(target, ids, assistant_model=drafter) - peak_bytes(target, ids)
    assert extra <= 1.1 * features, f"the call held {extra / features:.2f}x the prompt's features beyond plain"


def test_a_dflash_prompt_context_is_one_state_per_token():
    """A DFlash drafter's ``fc`` is linear: each selected layer's output is projected by its slice of ``fc`` as the
    layer finishes, so beyond plain the call holds about one hidden state per prompt token and the drafter's context
    cache, not the 15 selected layers (which would be 15 states per token)."""
    target = deep_narrow_target()
    drafter = make_drafter(target, target_layer_ids=list(range(15)))
    ids = make_prompt(1024)
    state = ids.shape[1] * target.config.hidden_size * 4  # fp32: one hidden state per prompt token
    extra = peak_bytes(target, ids, assistant_model=drafter) - peak_bytes(target, ids)
    assert extra <= 4 * state, f"the call held {extra / state:.1f} hidden states per prompt token beyond plain"


@pytest.mark.parametrize("family", FAMILIES)
def test_written_features_equal_the_selected_hidden_states(family):
    """Per family, what the hooks write is what ``output_hidden_states`` returns for the drafter's layers; through a
    DFlash drafter's ``fc``, exactly what the loop fuses from a verify's hidden states (the drafter reads the same
    numbers for the prompt whichever path made them), and ``fc`` of the concatenation up to rounding."""
    target = family_target(family)
    layer_ids = [2, 0, 1]  # in any order: the fused sum runs in the order the layers do
    writer = PromptFeatureWriter.for_target(target, layer_ids)
    drafter = make_drafter(target, target_layer_ids=layer_ids)
    fusing = PromptFeatureWriter.for_target(target, layer_ids, drafter.fc)
    assert writer is not None, "the family's decoder layers were not found: its prompts fall back to hidden states"
    ids = make_prompt(9)
    with torch.no_grad(), writer, fusing:
        outputs = target(input_ids=ids, output_hidden_states=[i + 1 for i in layer_ids])
    features = target_features(outputs.hidden_states, layer_ids)
    torch.testing.assert_close(writer.features, features, rtol=0, atol=0)
    with torch.no_grad():
        torch.testing.assert_close(fusing.features, drafter.fused_features(outputs.hidden_states), rtol=0, atol=0)
        torch.testing.assert_close(fusing.features, drafter.fc(features))


def test_the_last_layer_and_asked_hidden_states_keep_the_hidden_states_path():
    """transformers returns the last layer's output after the final norm: a drafter reading it, and a call that asks
    for the hidden states, take them from the forward's outputs (and stay lossless)."""
    target = make_target()
    assert PromptFeatureWriter.for_target(target, [0, 3]) is None
    drafter = make_drafter(target, target_layer_ids=[1, 3])
    ids = make_prompt(12)
    plain = target.generate(ids, max_new_tokens=8, do_sample=False)
    assert target.generate(ids, max_new_tokens=8, do_sample=False, assistant_model=drafter).tolist() == plain.tolist()
    asked = target.generate(ids, max_new_tokens=8, do_sample=False, assistant_model=make_drafter(target),
                            output_hidden_states=True, return_dict_in_generate=True)
    assert asked.sequences.tolist() == plain.tolist() and asked.hidden_states is not None


def test_plain_steps_do_not_copy_the_prompts_features(monkeypatch):
    """While the policy takes plain steps the drafter reads nothing, and the prompt's features wait: each step's
    features are kept beside them, not joined to them (which copied the prompt's features at every step)."""
    monkeypatch.setitem(policy_dflash.POLICIES, "plain steps", lambda *args: FullBlocks(0))
    target = make_target(num_hidden_layers=16, intermediate_size=64, max_position_embeddings=2048)
    drafter = make_drafter(target, target_layer_ids=list(range(15)))
    ids = make_prompt(1024)
    features = ids.shape[1] * 15 * target.config.hidden_size * 4
    plain = measured(target, ids, max_new_tokens=16).allocated_bytes
    ours = measured(target, ids, max_new_tokens=16, assistant_model=drafter, dflash_policy="plain steps")
    assert drafter.last_stats.drafts_per_cycle == [0] * 15
    extra = ours.allocated_bytes - plain
    assert extra < 2 * features, f"15 plain steps allocated {extra / features:.1f}x the prompt's features beyond plain"


def test_plain_steps_features_are_fused_once_when_the_drafter_reads_them(monkeypatch):
    """A plain step's target states wait unfused: the drafter's ``fc`` runs once per drafter read, over every step
    since (fused at every step, it cost ~1% of a plain step of SmolLM2-135M on a CPU), and what the drafter reads is
    a fresh target forward's features of the committed text at those positions."""
    target = cached_target("qwen3")
    drafter = make_drafter(target, block_size=6)
    prompt = make_prompt(10, seed=4)
    schedule = iter([0, 0, 0, 5, 0, 0, 5, 0, 5] + [0] * 40)
    monkeypatch.setattr(CostAwarePolicy, "choose", lambda self, *args, **kwargs: Draft(next(schedule)))
    fused, read, fuse, propose = [], [], type(drafter).fuse, DFlashCandidateGenerator.propose

    def counted_fuse(self, states):
        fused.append(states[0].shape[1])
        return fuse(self, states)

    def checked_propose(self, histories, context, context_positions, *args, **kwargs):
        with torch.no_grad():
            hidden = target(histories[0][None], output_hidden_states=True).hidden_states
        torch.testing.assert_close(context, fuse(drafter, drafter.selected_states(hidden))[:, context_positions[0]],
                                   rtol=1e-4, atol=1e-5)
        read.append(context.shape[1])
        return propose(self, histories, context, context_positions, *args, **kwargs)

    monkeypatch.setattr(type(drafter), "fuse", counted_fuse)
    monkeypatch.setattr(DFlashCandidateGenerator, "propose", checked_propose)
    got = target.generate(prompt, assistant_model=drafter, max_new_tokens=24, do_sample=False, dflash_policy="cost")
    assert got.tolist() == plain_generate(target, prompt, max_new_tokens=24).tolist()
    assert drafter.last_stats.drafts_per_cycle[:3] == [0, 0, 0] and len(read) == 3
    assert len(fused) == len(read), f"fc ran {len(fused)} times for {len(read)} drafter reads: {fused}"
    assert fused[0] == 3, "the first read fuses the three plain steps' states together"
