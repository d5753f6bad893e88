"""Regression tests for bugs other DFlash implementations shipped, each named for what it guards.

Already guarded elsewhere: an EOS inside an accepted block stops exactly there (tests/test_generation.py,
test_eos_inside_accepted_block; trees: tests/test_tree.py, test_eos_inside_tree)."""

import collections

import pytest
import torch
from accelerate.hooks import AlignDevicesHook, add_hook_to_module
from conftest import P_THRESHOLD, chi_square_pvalue, make_drafter, make_prompt, make_target
from transformers import GenerationConfig
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree
from transformers.generation import logits_process as lp

from hf_dflash import sampling_dflash
from hf_dflash.candidates_dflash import DFlashCandidateGenerator
from hf_dflash.training.features import context_features

TEMPERATURE = 0.5


@pytest.fixture(scope="module")
def target():
    return make_target("qwen3", num_hidden_layers=6, initializer_range=0.1)


def test_sampled_drafts_are_scored_with_the_tempered_law_they_were_drawn_with(target, monkeypatch):
    """The q that accepts a sampled draft is softmax(drafter logits / T), the temperature the target's own tokens
    get: not the untempered law (an engine that samples drafts at T but accepts them with q at 1, or never tempers the
    drafts, accepts by the wrong ratio p/q or far fewer drafts)."""
    drafter, logits, probs = make_drafter(target), [], []
    draft_logits, accept = DFlashCandidateGenerator.draft_logits, sampling_dflash.speculative_accept
    monkeypatch.setattr(DFlashCandidateGenerator, "draft_logits",
                        lambda self, hidden: logits.append(draft_logits(self, hidden)) or logits[-1])
    monkeypatch.setattr(sampling_dflash, "speculative_accept",
                        lambda drafts, q, p: probs.append(q) or accept(drafts, q, p))
    torch.manual_seed(0)
    target.generate(make_prompt(10), assistant_model=drafter, max_new_tokens=24, do_sample=True,
                    temperature=TEMPERATURE, top_k=0, top_p=1.0)
    assert len(probs) == len(logits) > 2
    for raw, q in zip(logits, probs):
        expected = (raw[:, 1 : q.shape[1] + 1].float() / TEMPERATURE).softmax(-1)
        torch.testing.assert_close(q, expected)


def test_sampled_drafts_follow_the_q_they_are_scored_with():
    """Each sampled draft is drawn from the q returned with it (chi-square over many rows), here with temperature,
    top-k and top-p."""
    logits = torch.tensor([0.0, 1.0, 2.0, 0.5, -1.0, 1.5])[None, None].expand(4000, 2, -1).contiguous()
    processors = lp.LogitsProcessorList([lp.TemperatureLogitsWarper(TEMPERATURE), lp.TopKLogitsWarper(4),
                                         lp.TopPLogitsWarper(0.95)])
    torch.manual_seed(0)
    drafts, scores = sampling_dflash.choose_drafts(processors, [torch.tensor([1])] * 4000, logits, do_sample=True)
    q = scores[0].softmax(-1)
    assert float(q[0, 4]) == 0.0  # top-k removed the two least likely tokens
    for position in range(2):
        counts = collections.Counter(drafts[:, position].tolist())
        law = {token: float(p) for token, p in enumerate(q[position])}
        assert chi_square_pvalue(counts, law) > P_THRESHOLD


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("num_drafts", [1, 3])
def test_sampled_candidates_keep_their_batch_dimension(target, batch, num_drafts, monkeypatch):
    """With sampling, every cycle's candidates are [batch, 1 + drafts] and their scores [batch, drafts, vocab], also
    for one row and one draft (where a squeeze or a flat multinomial drops the batch axis)."""
    drafter, shapes = make_drafter(target), []
    get_candidates = DFlashCandidateGenerator.get_candidates

    def recording(self, *args, **kwargs):
        candidates, scores = get_candidates(self, *args, **kwargs)
        shapes.append((tuple(candidates.shape), None if scores is None else tuple(scores.shape)))
        return candidates, scores

    monkeypatch.setattr(DFlashCandidateGenerator, "get_candidates", recording)
    prompts = torch.cat([make_prompt(8, seed=s) for s in range(batch)])
    torch.manual_seed(0)
    out = target.generate(prompts, attention_mask=torch.ones_like(prompts), assistant_model=drafter,
                          max_new_tokens=12, do_sample=True, num_assistant_tokens=num_drafts)
    assert out.shape == (batch, 8 + 12) and shapes
    rows = {shape[0][0] for shape in shapes}
    assert all(c[1] == s[1] + 1 and s[0] == c[0] and s[2] == target.config.vocab_size for c, s in shapes if s)
    assert rows <= set(range(1, batch + 1)) and batch in rows  # retired rows leave; none is lost to a squeeze
    generator = DFlashCandidateGenerator(drafter, target, GenerationConfig(do_sample=True,
                                                                           num_assistant_tokens=num_drafts))
    ids = make_prompt(8)
    features = drafter.target_features(target(ids[:, :-1], output_hidden_states=True).hidden_states)
    candidates, scores = generator.get_candidates(ids, features)
    assert candidates.shape == (1, 8 + num_drafts) and scores.shape == (1, num_drafts, target.config.vocab_size)


def test_target_layer_k_is_read_as_its_output_in_training_and_generation(target, monkeypatch):
    """Layer k's features are the output of decoder layer k (``hidden_states[k + 1]``: index 0 is the embeddings),
    the same in training (training/features.py) and in generate (an engine adding or dropping that +1 on one side
    feeds the drafter features it was not trained on)."""
    layer_ids = [1, 3]
    drafter, prompt = make_drafter(target, target_layer_ids=layer_ids), make_prompt(10, seed=2)
    outputs, contexts, propose = {}, [], DFlashCandidateGenerator.propose

    def keep_first_output(k):
        def hook(module, args, output):
            outputs.setdefault(k, output[0] if isinstance(output, tuple) else output)
        return hook

    def recording(self, histories, context, *args, **kwargs):
        contexts.append(context)
        return propose(self, histories, context, *args, **kwargs)

    monkeypatch.setattr(DFlashCandidateGenerator, "propose", recording)
    hooks = [target.model.layers[k].register_forward_hook(keep_first_output(k)) for k in layer_ids]
    try:
        target.generate(prompt, assistant_model=drafter, max_new_tokens=4, do_sample=False)  # prefill: the prompt
    finally:
        for hook in hooks:
            hook.remove()
    layer_outputs = torch.cat([outputs[k] for k in layer_ids], dim=-1)
    with torch.no_grad():  # the loop hands the drafter its fc of those outputs (one state per token)
        torch.testing.assert_close(contexts[0], drafter.fused_features({k + 1: outputs[k] for k in layer_ids}))
    trained_on = context_features(target, prompt, torch.ones_like(prompt), layer_ids)
    torch.testing.assert_close(trained_on, layer_outputs)


# ----------------------------------------------------------------------------------------------------------------------
# a target split by device_map, on a CPU-only machine
class StandInDevices(TorchFunctionMode):
    """CPU tensors standing for tensors on several devices ("cpu:1", "cpu:2", ...): a tensor's device is the one it
    was created on or moved to (``.to(device)``, ``device=``), else "cpu:0"; an op over tensors of two devices raises
    as CUDA does (0-dim tensors and indexing with tensors of another device are allowed, as in torch). Parameters take
    the device of their module through :meth:`place`. Inside the mode ``tensor.device`` reports the stand-in device,
    so code that moves tensors by ``.device`` moves them as it would on GPUs."""

    def place(self, module: torch.nn.Module, device: str) -> None:
        for tensor in [*module.parameters(), *module.buffers()]:
            tensor.stand_in_device = torch.device(device)

    @staticmethod
    def device_of(tensor: torch.Tensor) -> torch.device:
        return getattr(tensor, "stand_in_device", torch.device("cpu", 0))

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__self__", None) is torch.Tensor.device:  # the `device` property's getter
            return self.device_of(args[0])
        tensors = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        devices = {self.device_of(t) for t in tensors if t.dim() > 0}
        moved = requested_device(func, args, kwargs)
        if moved is None and len(devices) > 1 and func not in INDEXING:
            raise RuntimeError(f"Expected all tensors to be on the same device, but found {sorted(map(str, devices))} "
                               f"in {getattr(func, '__name__', func)}")
        result = func(*args, **kwargs)
        if moved is not None and args and result is args[0]:  # a move torch skips (same real device): the copy it would make
            result = result.clone()
        device = moved if moved is not None else (self.device_of(tensors[0]) if tensors else torch.device("cpu", 0))
        for output in pytree.tree_leaves(result):
            if isinstance(output, torch.Tensor):
                output.stand_in_device = torch.device(device.type, device.index or 0)
        return result


INDEXING = (torch.Tensor.__getitem__, torch.Tensor.__setitem__, torch.Tensor.copy_)


def requested_device(func, args, kwargs) -> torch.device | None:
    """The device a ``.to(...)`` call or a factory's ``device=`` asks for (None: none asked)."""
    asked = kwargs.get("device")
    if asked is None and func is torch.Tensor.to:
        asked = next((a for a in args[1:] if isinstance(a, (torch.device, str))), None)
        other = next((a for a in args[1:] if isinstance(a, torch.Tensor)), None)
        asked = StandInDevices.device_of(other) if asked is None and other is not None else asked
    return None if asked is None else torch.device(asked)


def split_by_device_map(target, devices: StandInDevices) -> dict:
    """Split `target` as ``from_pretrained(device_map=...)`` does with accelerate: each block runs on its device (its
    inputs moved there by an AlignDevicesHook), the model's outputs come back to the device of its inputs; the first
    half of the layers on "cpu:0" (with the embeddings, where the prompts are), the rest on "cpu:1" (with the norm and
    LM head)."""
    half = len(target.model.layers) // 2
    device_map = {"model.embed_tokens": "cpu:0", "model.rotary_emb": "cpu:0", "model.norm": "cpu:1",
                  "lm_head": "cpu:1", **{f"model.layers.{i}": "cpu:0" if i < half else "cpu:1"
                                         for i in range(len(target.model.layers))}}
    for name, device in device_map.items():
        module = target.get_submodule(name)
        devices.place(module, device)
        add_hook_to_module(module, AlignDevicesHook(execution_device=torch.device(device)))
    add_hook_to_module(target, AlignDevicesHook(execution_device=torch.device("cpu:0"), io_same_device=True))
    target.hf_device_map = device_map
    return device_map


@pytest.mark.parametrize("draft_vocabulary", [False, True])
def test_a_target_split_by_device_map_keeps_the_drafters_tensors_on_its_device(draft_vocabulary):
    """A target split over two devices by device_map, the drafter on a third: every tensor the drafter receives (the
    target's embeddings and features, positions, masks) is on the drafter's device, its states reach the LM head on
    the head's device (also through a draft vocabulary's gathered rows), and the output is the target's own. On a
    CPU-only machine the devices are stood in for (:class:`StandInDevices`), and an op over two devices raises as on
    GPUs."""
    target = make_target("qwen3", num_hidden_layers=6, initializer_range=0.1)
    drafter = make_drafter(target)
    if draft_vocabulary:
        drafter.set_draft_vocabulary(list(range(0, 96, 2)), lm_head=target.get_output_embeddings())
    prompt, received = make_prompt(10, seed=3), []
    expected = target.generate(prompt, max_new_tokens=16, do_sample=False)
    devices = StandInDevices()

    def record_devices(module, args, kwargs):
        received.extend((name, devices.device_of(value)) for name, value in kwargs.items()
                        if isinstance(value, torch.Tensor))

    hook = drafter.register_forward_pre_hook(record_devices, with_kwargs=True)
    with devices:
        split_by_device_map(target, devices)
        devices.place(drafter, "cpu:2")
        # the stand-in devices follow torch's functions, which the few-row CPU kernel is not (it would not run on
        # a split over GPUs either)
        got = target.generate(prompt, assistant_model=drafter, max_new_tokens=16, do_sample=False,
                              dflash_cpu_kernels=False)
        plain = target.generate(prompt, max_new_tokens=16, do_sample=False)  # the split target alone
    hook.remove()
    assert got.tolist() == plain.tolist() == expected.tolist()
    assert drafter.last_stats.drafted_verifications > 0 and received
    assert {name for name, _ in received} >= {"noise_embeds", "context_hidden_states", "position_ids"}
    assert {str(device) for _, device in received} == {"cpu:2"}, received
