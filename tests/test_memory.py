# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""What a call keeps alive beyond plain decoding: the prompt's features (the drafter's context, [b, n, T*H]) once,
written layer by layer during the target's prefill, never a tuple of the selected hidden states and their
concatenation at the same time. Counted to the byte (:class:`~hf_dflash.evaluation.memory.PeakTensorMemory`), not
timed; the peak resident memory at 2K-8K-token prompts on SmolLM2 is in BENCHMARKS.md."""

import pytest
import torch
from conftest import FAMILIES, family_target, make_drafter, make_prompt, make_target

from hf_dflash import policy_dflash
from hf_dflash.evaluation.memory import PeakTensorMemory
from hf_dflash.features_dflash import PromptFeatureWriter
from hf_dflash.modeling_dflash import target_features
from hf_dflash.schedules_dflash import FullBlocks


def measured(target, ids, max_new_tokens: int = 4, **kwargs) -> PeakTensorMemory:
    with torch.inference_mode(), PeakTensorMemory() as memory:
        target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False,
                        **kwargs)
    return memory


def peak_bytes(target, ids, **kwargs) -> int:
    return measured(target, ids, **kwargs).peak_bytes


def test_the_prompt_features_are_held_once():
    """A deep target with narrow layers and 15 selected ones: the features outweigh a layer's transient tensors, so
    holding them twice (the selected hidden states and their concatenation) would set the call's peak at 1.5x."""
    target = make_target(num_hidden_layers=16, intermediate_size=64, max_position_embeddings=2048)
    drafter = make_drafter(target, target_layer_ids=list(range(15)))
    ids = make_prompt(1024)
    features = ids.shape[1] * 15 * target.config.hidden_size * 4  # fp32
    extra = peak_bytes(target, ids, assistant_model=drafter) - peak_bytes(target, ids)
    assert extra <= 1.1 * features, f"the call held {extra / features:.2f}x the prompt's features beyond plain"


@pytest.mark.parametrize("family", FAMILIES)
def test_written_features_equal_the_selected_hidden_states(family):
    """Per family, what the hooks write is what ``output_hidden_states`` returns for the drafter's layers."""
    target = family_target(family)
    layer_ids = [0, 2]
    writer = PromptFeatureWriter.for_target(target, layer_ids)
    assert writer is not None, "the family's decoder layers were not found: its prompts fall back to hidden states"
    ids = make_prompt(9)
    with torch.no_grad(), writer:
        outputs = target(input_ids=ids, output_hidden_states=[i + 1 for i in layer_ids])
    torch.testing.assert_close(writer.features, target_features(outputs.hidden_states, layer_ids), rtol=0, atol=0)


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
