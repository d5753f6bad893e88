# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""The device tier: the lossless tests that matter, on every device (the `device` fixture: cpu, and cuda where one is
present, marked `cuda`; CI runs the cpu variant with the fast suite, scripts/gpu_run.sh the cuda one on a lent GPU).

Greedy output against plain ``generate()`` for chains, the default policy, trees, left-padded batches, DFlare and
DFlash2 drafters, the pipeline and captured verify forwards (CUDA graphs); the exact sampling law (chi-square, with a planted wrong sampler that must be
rejected); targets and drafters saved and loaded with ``device_map``; a drafter left on the CPU beside the target; a
static cache.
What "the same output" means on each device (hf_dflash/evaluation/near_ties.py, docs/generation.md "Numerics"):
fp32 on the CPU, token-identical; bf16 anywhere and fp32 on CUDA (a 16-row and a 1-row forward may run different
GEMM kernels), identical or first differing at a near-tie of plain's own logits. The rule's own tests plant a fault
(a wrong token committed) that it must flag.
"""

import collections
import contextlib
import functools

import pytest
import torch
from conftest import (
    DEVICES,
    P_THRESHOLD,
    PAD,
    assert_same,
    cached_target,
    chi_square_pvalue,
    drafts_for,
    every_policy_path,
    exact_distribution,
    left_padded,
    make_drafter,
    make_prompt,
    on_device,
    randomized,
)
from transformers import AutoModelForCausalLM, pipeline
from transformers.cache_utils import StaticLayer

from hf_dflash import DFlash2DraftModel, DFlashDraftModel, sampling_dflash
from hf_dflash.evaluation.near_ties import assert_identical_or_near_tie, first_divergences, near_tie_tolerance

BLOCK = 8
NEW_TOKENS = 24
DFLASH2_FIELDS = dict(conv_group_size=16, conv_kernel_size=3, selector_rank=8, selector_top_k=4,
                      output_multiplier=1.5, final_logit_softcapping=6.0)


@functools.lru_cache(maxsize=None)
def device_target(arch: str, device: str, dtype: torch.dtype = torch.float32):
    """The cached tiny `arch` target (conftest.cached_target), copied to `device` in `dtype`."""
    return on_device(cached_target(arch), device, dtype)


def device_drafter(arch: str, device, dtype: torch.dtype = torch.float32, layout: str = "dflash", **overrides):
    """A drafter for the tiny `arch` target, built from the CPU copy (the same weights on every device) and moved:
    "dflash" (1 layer), "dflare" (layer fusion and split context K/V, 2 layers over 3 target features) or "dflash2"
    (convolutions and a candidate selector, every weight random)."""
    target = cached_target(arch)
    if layout == "dflash":
        drafter = make_drafter(target, BLOCK, **overrides)
    elif layout == "dflare":
        torch.manual_seed(1)
        drafter = DFlashDraftModel.from_target(target, num_hidden_layers=2, block_size=BLOCK, layer_fusion=True,
                                               split_context_kv=True, target_layer_ids=[0, 1, 3], **overrides)
    else:
        torch.manual_seed(0)
        drafter = randomized(DFlash2DraftModel.from_target(target, num_hidden_layers=2, block_size=BLOCK,
                                                           target_layer_ids=[0, 2], **DFLASH2_FIELDS, **overrides))
    return drafter.to(device=device, dtype=dtype).eval().requires_grad_(False)


def plain_with_logits(target, prompt, **kwargs):
    """Plain greedy ``generate`` with its logits (what the near-tie rule reads)."""
    return target.generate(prompt, do_sample=False, return_dict_in_generate=True, output_logits=True, **kwargs)


def assert_matches_plain(target, got, plain, prompt_length: int, what: str = "") -> None:
    """fp32 on the CPU: token-identical. Elsewhere (bf16, fp16; fp32 on CUDA): identical, or each row first differs
    at a near-tie of plain's own logits (hf_dflash/evaluation/near_ties.py)."""
    if target.device.type == "cpu" and target.dtype == torch.float32:
        assert_same(got, plain.sequences, what)
    else:
        assert_identical_or_near_tie(got, plain, prompt_length, target.dtype, what=what)


def assert_lossless_on(target, drafter, prompt, kinds=("random", "oracle", "noisy"), assisted=None, **kwargs):
    """For each drafter kind (conftest.drafts_for), ``generate(assistant_model=drafter, **assisted, **kwargs)``
    matches plain ``generate(**kwargs)`` (:func:`assert_matches_plain`). Returns each kind's stats, for the kinds
    whose output was token-identical."""
    plain = plain_with_logits(target, prompt, **kwargs)
    identical = {}
    for kind in kinds:
        with drafts_for(kind, plain.sequences, prompt):
            got = target.generate(prompt, assistant_model=drafter, do_sample=False, **(assisted or {}), **kwargs)
        assert_matches_plain(target, got, plain, prompt.shape[1], f"{target.device} {target.dtype}, {kind!r}: ")
        assert drafter.last_stats.num_verifications > 0
        if got.tolist() == plain.sequences.tolist():
            identical[kind] = drafter.last_stats
    return identical


# ----------------------------------------------------------------------------------------------------------------------
# greedy: chains, the default policy, trees, batches, drafter layouts, the pipeline
@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_chains_match_plain(device, arch):
    target, drafter = device_target(arch, device), device_drafter(arch, device)
    prompt = make_prompt(9, seed=1).to(device)
    identical = assert_lossless_on(target, drafter, prompt, max_new_tokens=NEW_TOKENS)
    if "oracle" in identical:  # (not after a near-tie on CUDA: the oracle proposes plain's continuation)
        assert max(identical["oracle"].acceptance_lengths) == BLOCK  # its whole blocks are accepted


@pytest.mark.parametrize("paths", ["its own choices", "every path"])
def test_default_policy_matches_plain(device, paths):
    """dflash_policy="cost" (the library's default): as it chooses on this device (its costs measured here), and made
    to take each of its paths in turn (plain steps, lookup chains, full blocks)."""
    target, drafter = device_target("qwen3", device), device_drafter("qwen3", device)
    prompt = make_prompt(11, seed=2).to(device)
    with every_policy_path() if paths == "every path" else contextlib.nullcontext():
        assert_lossless_on(target, drafter, prompt, ("random", "oracle"),
                           dict(dflash_policy="cost", prompt_lookup_num_tokens=3), max_new_tokens=NEW_TOKENS)


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_trees_match_plain(device, arch):
    """A tree of 8 nodes; "ranked" drafts put the target's token second (a chain rejects it, the tree finds it)."""
    target, drafter = device_target(arch, device), device_drafter(arch, device)
    prompt = make_prompt(7, seed=3).to(device)
    assert_lossless_on(target, drafter, prompt, ("random", "oracle", "ranked"), dict(dflash_tree_budget=8),
                       max_new_tokens=NEW_TOKENS)
    assert max(drafter.last_stats.drafts_per_cycle) <= 8


@pytest.mark.parametrize("policy", ["full", "cost"])
def test_left_padded_batch_matches_plain(device, policy):
    """Four prompts of lengths 3, 11, 7 and 1, left-padded, against plain ``generate`` of the same batch."""
    target, drafter = device_target("llama", device), device_drafter("llama", device)
    ids, mask = (t.to(device) for t in left_padded([make_prompt(n, seed=10 + n) for n in (3, 11, 7, 1)]))
    kwargs = dict(attention_mask=mask, max_new_tokens=NEW_TOKENS, pad_token_id=PAD)
    plain = plain_with_logits(target, ids, **kwargs)
    with every_policy_path() if policy == "cost" else contextlib.nullcontext():
        got = target.generate(ids, assistant_model=drafter, dflash_policy=policy, do_sample=False, **kwargs)
    assert_matches_plain(target, got, plain, ids.shape[1], f"batch, policy {policy}: ")
    assert len(drafter.last_stats.row_acceptance_lengths) == 4


@pytest.mark.skipif(not hasattr(StaticLayer, "crop"), reason="transformers 5.23: static layers have no crop")
@pytest.mark.parametrize("call", ["chain", "default policy", "tree", "batch"])
def test_a_static_cache_matches_plain(device, call):
    """``cache_implementation="static"`` (plain's and ours, compiling left off: the tier checks tokens, and the
    compiled paths are the benchmark's): chains, the default policy, trees and a left-padded batch."""
    target, drafter = device_target("qwen3", device), device_drafter("qwen3", device)
    kwargs = dict(max_new_tokens=NEW_TOKENS, cache_implementation="static", disable_compile=True)
    assisted = {"default policy": dict(dflash_policy="cost"), "tree": dict(dflash_tree_budget=8)}.get(call, {})
    if call == "batch":
        ids, mask = (t.to(device) for t in left_padded([make_prompt(n, seed=20 + n) for n in (5, 12, 2)]))
        plain = plain_with_logits(target, ids, attention_mask=mask, pad_token_id=PAD, **kwargs)
        got = target.generate(ids, assistant_model=drafter, attention_mask=mask, pad_token_id=PAD, do_sample=False,
                              **kwargs)
        assert_matches_plain(target, got, plain, ids.shape[1], "static cache, batch: ")
        return
    with every_policy_path() if call == "default policy" else contextlib.nullcontext():
        assert_lossless_on(target, drafter, make_prompt(9, seed=21).to(device), ("random", "oracle"), assisted,
                           **kwargs)


@pytest.mark.skipif(not hasattr(StaticLayer, "crop"), reason="transformers 5.23: static layers have no crop")
@pytest.mark.parametrize("device", [DEVICES[1]], indirect=True)  # on the CPU: tests/test_captured.py
@pytest.mark.parametrize("paths", ["full blocks", "every path"])
def test_captured_verify_matches_plain(device, paths):
    """``dflash_compile=True`` with its default settings: on CUDA, inductor under mode="reduce-overhead", every verify
    width and the drafter's forward replayed as CUDA graphs (whose outputs the next replay overwrites: the loop must
    keep copies)."""
    target, drafter = device_target("qwen3", device), device_drafter("qwen3", device)
    assisted = dict(dflash_compile=True, dflash_policy="full" if paths == "full blocks" else "cost")
    with every_policy_path() if paths == "every path" else contextlib.nullcontext():
        assert_lossless_on(target, drafter, make_prompt(9, seed=22).to(device), ("random", "oracle", "noisy"),
                           assisted, max_new_tokens=NEW_TOKENS)


@pytest.mark.parametrize("layout", ["dflare", "dflash2"])
def test_drafter_layouts_match_plain(device, layout):
    target, drafter = device_target("qwen3", device), device_drafter("qwen3", device, layout=layout)
    assert drafter.config.is_dflare if layout == "dflare" else isinstance(drafter, DFlash2DraftModel)
    assert_lossless_on(target, drafter, make_prompt(10, seed=4).to(device), max_new_tokens=NEW_TOKENS)


def test_pipeline_matches_plain(device, tokenizer):
    """``pipeline("text-generation")`` with a drafter, as a chain and as a tree, gives plain's text."""
    target, drafter = device_target("qwen3", device), device_drafter("qwen3", device)
    generator = pipeline("text-generation", model=target, tokenizer=tokenizer)
    prompt = "t5 t17 t33 t2 t9 t5 t17"
    expected = generator(prompt, max_new_tokens=20, do_sample=False)
    for assisted in (dict(), dict(dflash_tree_budget=8)):
        got = generator(prompt, max_new_tokens=20, do_sample=False, assistant_model=drafter, **assisted)
        assert got == expected, assisted
        assert drafter.last_stats.new_tokens == 20


# ----------------------------------------------------------------------------------------------------------------------
# sampling: the exact law of plain sampling on this device (the method of tests/test_sampling_laws.py, smaller)
LAW_VOCAB = 8
LAW_TOKENS = 3  # the first new tokens compared: the prefill's token, then drafts of the first cycle and beyond
LAW_PROMPTS = (torch.tensor([[1, 2, 3]]), torch.tensor([[5, 4, 6, 7, 1, 2]]), torch.tensor([[6]]))
SAMPLING = dict(temperature=0.7, top_k=6)


def law_target():
    """Clearly non-uniform next-token laws over 8 tokens (max probability ~0.25-0.6), as in test_sampling_laws.py."""
    return cached_target("qwen3", vocab_size=LAW_VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, initializer_range=0.15, seed=0)


def sampled_rows(target, drafter, calls: int, seed: int):
    """`calls` sampled generate calls on 48 left-padded rows (each of LAW_PROMPTS 16 times), 3 drafts per cycle: per
    prompt, a Counter of its first LAW_TOKENS new tokens; and every call's acceptance lengths."""
    rows = [LAW_PROMPTS[r % len(LAW_PROMPTS)] for r in range(16 * len(LAW_PROMPTS))]
    ids, mask = (t.to(target.device) for t in left_padded(rows))
    counts, lengths = [collections.Counter() for _ in LAW_PROMPTS], []
    torch.manual_seed(seed)
    for _ in range(calls):
        out = target.generate(ids, attention_mask=mask, assistant_model=drafter, max_new_tokens=6, do_sample=True,
                              pad_token_id=PAD, **SAMPLING)
        for r, tokens in enumerate(out[:, ids.shape[1]:].tolist()):
            counts[r % len(LAW_PROMPTS)][tuple(tokens[:LAW_TOKENS])] += 1
        lengths += drafter.last_stats.acceptance_lengths
    return counts, lengths


@pytest.fixture(scope="module")
def exact_laws():
    """Each prompt's exact law of plain sampling (the fp32 CPU target's: other devices differ by ~1e-6 in p)."""
    return [exact_distribution(law_target(), prompt, LAW_TOKENS, **SAMPLING) for prompt in LAW_PROMPTS]


@pytest.fixture()
def law_models(device):
    """The law target and an untrained block-4 drafter for it, on this device."""
    return on_device(law_target(), device), make_drafter(law_target(), block_size=4, seed=3).to(device)


def pvalues(counts, laws) -> list[float]:
    """Per prompt, the chi-square p-value of its samples against its law (0 where a sample has probability 0)."""
    return [0.0 if any(law.get(cell, 0.0) <= 0.0 for cell in counted) else chi_square_pvalue(counted, law)
            for counted, law in zip(counts, laws)]


def test_sampling_follows_the_law(law_models, exact_laws):
    """48 rows of 3 prompts, the drafter's own samples: chains of accepted drafts and rejections, and each prompt's
    first tokens follow its exact law (chi-square, Bonferroni over the prompts)."""
    counts, lengths = sampled_rows(*law_models, calls=30, seed=0)
    assert 1 in lengths and max(lengths) >= 3, collections.Counter(lengths)
    assert min(pvalues(counts, exact_laws)) > P_THRESHOLD / len(LAW_PROMPTS), pvalues(counts, exact_laws)


def test_sampling_check_rejects_a_wrong_sampler(law_models, exact_laws, monkeypatch):
    """Negative control: every draft accepted, whatever p and q say, must be caught on this device too."""
    def always_accept(drafts, q, p):
        bonus = torch.multinomial(p[:, drafts.shape[1]], 1)
        return torch.full((drafts.shape[0],), drafts.shape[1], device=drafts.device), torch.cat([drafts, bonus], 1)

    monkeypatch.setattr(sampling_dflash, "speculative_accept", always_accept)
    counts, lengths = sampled_rows(*law_models, calls=20, seed=1)
    assert set(lengths) == {4, 1}  # every cycle accepted its 3 drafts; then one token was left (a plain step)
    assert min(pvalues(counts, exact_laws)) < P_THRESHOLD / len(LAW_PROMPTS)


TREE_SAMPLES = 800


@pytest.mark.parametrize("device", [DEVICES[1]], indirect=True)  # on the CPU: tests/test_tree.py, 1,500 samples
def test_sampled_trees_follow_the_law(device, exact_laws):
    """Batch 1, trees of 6 drafted nodes (block 4): the first 3 new tokens of 5 follow the exact law, with rejections
    and multi-token acceptances."""
    target, drafter = on_device(law_target(), device), make_drafter(law_target(), block_size=4, seed=3).to(device)
    prompt = LAW_PROMPTS[1].to(device)
    counts, lengths, widths = collections.Counter(), [], []
    torch.manual_seed(2)
    for _ in range(TREE_SAMPLES):
        out = target.generate(prompt, assistant_model=drafter, dflash_tree_budget=6, max_new_tokens=5, do_sample=True,
                              **SAMPLING)
        counts[tuple(out[0, prompt.shape[1]:][:LAW_TOKENS].tolist())] += 1
        lengths += drafter.last_stats.acceptance_lengths
        widths += drafter.last_stats.drafts_per_cycle
    assert min(lengths) == 1 and max(lengths) >= 3 and max(widths) == 6
    assert pvalues([counts], [exact_laws[1]])[0] > P_THRESHOLD


# ----------------------------------------------------------------------------------------------------------------------
# loading with device_map; a drafter on another device than its target
def test_saved_target_and_drafter_load_with_a_device_map(device, tiny_folder):
    """The saved tiny target and drafter, loaded with ``device_map`` set to this device, generate plain's tokens.
    Hub kernels stay off (docs/gpu.md): the target's load says so, as a user's must on a box without network; the
    drafter's loader does by itself."""
    target = AutoModelForCausalLM.from_pretrained(tiny_folder / "target", device_map=device.type,
                                                  use_kernels=False).eval()
    drafter = DFlashDraftModel.from_pretrained(tiny_folder / "drafter", device_map=device.type).eval()
    assert target.device.type == drafter.device.type == device.type
    prompt = make_prompt(8, vocab_size=target.config.vocab_size, seed=5).to(device)
    assert_lossless_on(target, drafter, prompt, ("random", "oracle"), max_new_tokens=NEW_TOKENS,
                       pad_token_id=target.config.pad_token_id)


@pytest.mark.parametrize("layout", ["dflash", "dflash2"])
def test_a_drafter_left_on_the_cpu_beside_the_target(device, layout):
    """The target on this device, the drafter on the CPU: the drafter reads the target's features and embeddings
    moved to the CPU, the target's LM head scores its states on the target's device, and the output is plain's."""
    target = device_target("qwen3", device)
    drafter = device_drafter("qwen3", "cpu", layout=layout)
    assert drafter.device.type == "cpu"
    assert_lossless_on(target, drafter, make_prompt(9, seed=6).to(device), max_new_tokens=NEW_TOKENS)


# ----------------------------------------------------------------------------------------------------------------------
# bf16: identical, or the first difference is a near-tie of plain's own logits
BF16_CALLS = {
    "chain": dict(),
    "tree": dict(dflash_tree_budget=8),
    "default policy": dict(dflash_policy="cost"),
}


@pytest.mark.parametrize("call", sorted(BF16_CALLS))
def test_bf16_matches_plain_up_to_near_ties(device, call):
    target = device_target("qwen3", device, torch.bfloat16)
    drafter = device_drafter("qwen3", device, torch.bfloat16)
    for seed in range(2):
        prompt = make_prompt(9 + seed, seed=20 + seed).to(device)
        assert_lossless_on(target, drafter, prompt, ("random", "oracle"), BF16_CALLS[call], max_new_tokens=NEW_TOKENS)


def test_bf16_batch_matches_plain_up_to_near_ties(device):
    target = device_target("llama", device, torch.bfloat16)
    drafter = device_drafter("llama", device, torch.bfloat16)
    ids, mask = (t.to(device) for t in left_padded([make_prompt(n, seed=30 + n) for n in (5, 12, 2)]))
    kwargs = dict(attention_mask=mask, max_new_tokens=NEW_TOKENS, pad_token_id=PAD)
    plain = plain_with_logits(target, ids, **kwargs)
    got = target.generate(ids, assistant_model=drafter, do_sample=False, **kwargs)
    assert_identical_or_near_tie(got, plain, ids.shape[1], torch.bfloat16, what="bf16 batch: ")


@contextlib.contextmanager
def every_draft_accepted():
    """A planted fault: greedy verification accepts every draft, right or wrong."""
    def accept_all(drafts, target_scores):
        choice = target_scores.argmax(dim=-1)
        k = drafts.shape[1]
        return torch.full((drafts.shape[0],), k, device=drafts.device), torch.cat([drafts, choice[:, k:]], dim=1)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sampling_dflash, "greedy_accept", accept_all)
        yield


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_the_near_tie_rule_flags_a_wrong_token(device, dtype):
    """With the fault planted, noisy drafts (a share of wrong tokens) are committed: the rule must flag a first
    difference that is not a near-tie (the wrong token's logit is far below plain's)."""
    target, drafter = device_target("qwen3", device, dtype), device_drafter("qwen3", device, dtype)
    prompt = make_prompt(9, seed=7).to(device)
    plain = plain_with_logits(target, prompt, max_new_tokens=NEW_TOKENS)
    with every_draft_accepted(), drafts_for("noisy", plain.sequences, prompt, corrupt=0.5):
        got = target.generate(prompt, assistant_model=drafter, max_new_tokens=NEW_TOKENS, do_sample=False)
    divergences = first_divergences(got, plain, prompt.shape[1], dtype)
    assert divergences and not divergences[0].near_tie, divergences
    with pytest.raises(AssertionError, match="NOT a near-tie"):
        assert_identical_or_near_tie(got, plain, prompt.shape[1], dtype)


def test_the_near_tie_rule_on_plain_logits(device):
    """At each step of a plain bf16 run, committing plain's runner-up instead of its token is a near-tie exactly when
    plain's top-two gap is within the tolerance, and committing the token ranked 20th is flagged."""
    target = device_target("qwen3", device, torch.bfloat16)
    prompt = make_prompt(9, seed=8).to(device)
    plain = plain_with_logits(target, prompt, max_new_tokens=NEW_TOKENS)
    start, ties = prompt.shape[1], 0
    for step, logits in enumerate(plain.logits):
        ranked = logits[0].float().sort(descending=True, stable=True)  # ties: plain's argmax takes the first
        for rank in (1, 20):
            got = plain.sequences.clone()
            got[0, start + step] = ranked.indices[rank]
            verdict = first_divergences(got, plain, start, torch.bfloat16)[0]
            top, taken = float(ranked.values[0]), float(ranked.values[rank])
            assert (verdict.step, verdict.gap) == (step, top - taken)
            assert verdict.near_tie == (top - taken <= near_tie_tolerance(max(abs(top), abs(taken)), torch.bfloat16))
            assert rank == 1 or not verdict.near_tie, verdict.describe()
            ties += verdict.near_tie
    assert ties < len(plain.logits)  # most steps are not near-ties
