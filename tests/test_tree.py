# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""Tree verification (``generate(..., dflash_tree_budget=N)``, hf_dflash/tree_dflash.py) is lossless.

Greedy: token-identical to plain ``generate()`` for random, oracle and ranked drafters (a ranked drafter puts the
target's token second behind a decoy: a chain rejects it, a tree finds it), every budget and block size, with EOS,
stop strings and max_new_tokens inside a tree. Sampling: the committed tokens follow the exact law of plain sampling
(chi-square at P_THRESHOLD on tiny vocabularies, end to end and on synthetic laws), and wrong sibling rules fail the
same harness. Calls a tree cannot serve (batches, hybrid and sliding-window targets, bad budgets) raise ValueErrors.
"""

import collections
import dataclasses
import itertools
import math
import random

import pytest
import torch
import transformers as T
from conftest import (
    ARCHS,
    P_THRESHOLD,
    CollectingStreamer,
    assert_lossless,
    assert_same,
    cached_target,
    chi_square_pvalue,
    exact_distribution,
    install_cost_table,
    make_drafter,
    make_prompt,
    make_target,
    new_tokens,
    plain_generate,
    ranked_drafts,
    scripted_drafts,
)
from transformers import pipeline

from hf_dflash import lookup_dflash, tree_dflash
from hf_dflash.costs_dflash import CostTable
from hf_dflash.policy_dflash import CostAwarePolicy, Draft
from hf_dflash.tree_dflash import build_tree, greedy_path, sample_path, tree_shape


def tree_generate(target, drafter, prompt, budget, **kwargs):
    kwargs.setdefault("do_sample", False)
    return target.generate(prompt, assistant_model=drafter, dflash_tree_budget=budget, **kwargs)


# random: the drafter's own proposals; oracle: the target's continuation (point masses: the tree is a chain);
# ranked / half-ranked: the target's token second always / half of the time (conftest.drafts_for)
TREE_KINDS = ("random", "oracle", "ranked", "half-ranked")


# ----------------------------------------------------------------------------------------------------------------------
# building the tree
def test_tree_shape_is_best_first_by_joint_probability():
    # position 1: ranks 0.6, 0.3, 0.1; position 2: 0.9, 0.1
    ranked = [[0.6, 0.3, 0.1], [0.9, 0.1]]
    log = [[float(torch.tensor(p).log()) for p in row] for row in ranked]
    parents, depths, ranks = tree_shape(log, budget=4)
    # best-first: a (0.6), a.a (0.54), b (0.3), b.a (0.27); a.b (0.06) and c (0.1) wait
    assert parents == [-1, 0, 1, 0, 3] and depths == [0, 1, 2, 1, 2] and ranks == [0, 0, 0, 1, 0]
    assert tree_shape(log, budget=1) == ([-1, 0], [0, 1], [0, 0])
    parents, depths, _ = tree_shape(log, budget=100)  # every path: 3 + 3 * 2 nodes
    assert len(parents) == 1 + 3 + 6 and max(depths) == 2
    # zero-probability ranks never enter
    assert len(tree_shape([[0.0, float("-inf")], [0.0, float("-inf")]], budget=10)[0]) == 3


def test_greedy_tree_tokens_masks_and_paths():
    scores = torch.tensor([[5.0, 4.0, 0.0, -9.0], [0.0, 0.0, 7.0, 6.0]])  # position 1 prefers 0 then 1
    tree = build_tree(torch.tensor(3), scores, budget=4, do_sample=False)
    assert tree.tokens.tolist()[0] == 3 and tree.parents[0] == -1
    assert tree.paths()[1:] == [[0], [0, 2], [1], [0, 3]] or tree.paths()[1:] == [[0], [0, 2], [0, 3], [1]]
    seen = tree.ancestors()
    for i, parent in enumerate(tree.parents):
        chain = {i}
        while parent >= 0:
            chain.add(parent)
            parent = tree.parents[parent]
        assert set(torch.nonzero(seen[i]).flatten().tolist()) == chain
    # the target chooses 1 after the anchor and 2 after it: the path is node "1" only (1 has no child 2 here)
    target = torch.full((len(tree), 4), -1.0)
    target[0, 1] = 1.0
    for i in range(1, len(tree)):
        target[i, 2] = 1.0
    path, last = greedy_path(tree, target)
    assert [tree.tokens[i].item() for i in path] == [1] and last == 2


# ----------------------------------------------------------------------------------------------------------------------
# greedy: token-identical to plain generate
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("block_size", [4, 8, 16])
@pytest.mark.parametrize("budget", [1, 4, 16, 64])
def test_greedy_tree_matches_plain(arch, block_size, budget):
    target = cached_target(arch)
    drafter = make_drafter(target, block_size)

    def check(kind, got, expected, proposals):
        stats = drafter.last_stats
        assert sum(stats.acceptance_lengths) == stats.new_tokens - 1  # the prefill chose the first token alone
        assert all(1 <= a <= block_size for a in stats.acceptance_lengths)
        assert all(n <= budget for n in stats.drafts_per_cycle)

    for seed in range(2):
        prompt = make_prompt(7 + 5 * seed, seed=seed)
        assert_lossless(target, drafter, prompt, TREE_KINDS, assisted=dict(dflash_tree_budget=budget), check=check,
                        max_new_tokens=36)


@pytest.mark.parametrize("arch", ARCHS)
def test_tree_finds_the_second_choice_that_a_chain_rejects(arch):
    target = cached_target(arch)
    drafter = make_drafter(target, 8)
    prompt = make_prompt(9, seed=3)
    expected = plain_generate(target, prompt, max_new_tokens=48)
    taus = {}
    for budget in (None, 4, 16, 64):
        with ranked_drafts(new_tokens(expected, prompt), second=0.5, seed=1):
            got = tree_generate(target, drafter, prompt, budget, max_new_tokens=48)
        assert_same(got, expected)
        taus[budget] = drafter.last_stats.mean_acceptance_length
    # (budget 4 spends its nodes on the decoys' chain, 0.73 ** depth > 0.27: best-first, as DDTree builds it)
    assert taus[None] <= taus[4] <= taus[16] <= taus[64] and taus[16] > 1.5 * taus[None], taus
    # a point-mass (oracle) drafter gives a chain: the tree accepts exactly what the chain does
    with scripted_drafts(new_tokens(expected, prompt), corrupt=0.3):
        tree_generate(target, drafter, prompt, 16, max_new_tokens=48)
        tree = list(drafter.last_stats.acceptance_lengths)
    with scripted_drafts(new_tokens(expected, prompt), corrupt=0.3):
        tree_generate(target, drafter, prompt, None, max_new_tokens=48)
    assert tree == drafter.last_stats.acceptance_lengths


def test_budget_from_generation_config(qwen3_target):
    target, drafter, prompt = qwen3_target, make_drafter(qwen3_target, 8), make_prompt(9, seed=3)
    expected = plain_generate(target, prompt, max_new_tokens=30)
    config = T.GenerationConfig(max_new_tokens=30, do_sample=False, dflash_tree_budget=8)
    with ranked_drafts(new_tokens(expected, prompt)):
        assert_same(target.generate(prompt, assistant_model=drafter, generation_config=config), expected)
    assert max(drafter.last_stats.drafts_per_cycle) == 8


def _eos_inside_tree(target, prompt):
    """A token of the greedy continuation that plain generate meets first at new-token index >= 3."""
    reference = new_tokens(plain_generate(target, prompt, max_new_tokens=40), prompt).tolist()
    for index in range(3, len(reference)):
        if reference[index] not in reference[:index]:
            return reference[index], index
    pytest.skip("no usable EOS token")


@pytest.mark.parametrize("arch", ARCHS)
def test_eos_inside_tree(arch):
    target = cached_target(arch)
    drafter = make_drafter(target, 8)
    prompt = make_prompt(9, seed=11)
    eos, index = _eos_inside_tree(target, prompt)
    expected = assert_lossless(target, drafter, prompt, TREE_KINDS, assisted=dict(dflash_tree_budget=16),
                               reference=plain_generate(target, prompt, max_new_tokens=40), max_new_tokens=40,
                               eos_token_id=eos)
    assert expected.shape[1] == prompt.shape[1] + index + 1


@pytest.mark.parametrize("arch", ARCHS)
def test_max_new_tokens_inside_tree(arch):
    target = cached_target(arch)
    drafter = make_drafter(target, 8)
    prompt = make_prompt(8, seed=5)
    reference = plain_generate(target, prompt, max_new_tokens=20)
    for max_new_tokens in range(1, 20):

        def check(kind, got, expected, proposals):
            assert drafter.last_stats.new_tokens == max_new_tokens

        assert_lossless(target, drafter, prompt, ("ranked", "half-ranked"), reference=reference,
                        assisted=dict(dflash_tree_budget=16), check=check, max_new_tokens=max_new_tokens)


def test_stop_strings_inside_tree(target, tokenizer):
    drafter = make_drafter(target, 8)
    prompt = make_prompt(6, seed=21)
    reference = plain_generate(target, prompt, max_new_tokens=40)
    tokens = new_tokens(reference, prompt).tolist()
    for end in range(4, len(tokens)):  # a two-token stop string that stops plain generate at new token `end`
        stop = tokenizer.decode(tokens[end - 1 : end + 1])
        kwargs = dict(max_new_tokens=40, stop_strings=[stop], tokenizer=tokenizer)
        expected = plain_generate(target, prompt, **kwargs)
        if expected.shape[1] == prompt.shape[1] + end + 1:
            break
    else:
        pytest.skip("no usable stop string")
    assert_lossless(target, drafter, prompt, TREE_KINDS, reference=reference, assisted=dict(dflash_tree_budget=16),
                    **kwargs)


@pytest.mark.parametrize("processors", [
    dict(repetition_penalty=1.3),  # one call for the whole tree
    dict(no_repeat_ngram_size=2, repetition_penalty=0.8),  # one call per node, with its exact history
    dict(suppress_tokens=[5, 7], min_new_tokens=6, eos_token_id=9),
])
def test_processors_in_tree_greedy(qwen3_target, processors):
    target = qwen3_target
    drafter = make_drafter(target, 8)
    prompt = make_prompt(10, seed=41)
    assert_lossless(target, drafter, prompt, TREE_KINDS, assisted=dict(dflash_tree_budget=16), max_new_tokens=30,
                    **processors)


def test_scores_logits_and_hidden_states_of_the_committed_path(qwen3_target):
    target = qwen3_target
    drafter = make_drafter(target, 8)
    prompt = make_prompt(9, seed=2)
    kwargs = dict(max_new_tokens=20, return_dict_in_generate=True, output_scores=True, output_logits=True,
                  output_hidden_states=True, repetition_penalty=1.2)
    expected = plain_generate(target, prompt, **kwargs)
    with ranked_drafts(new_tokens(expected, prompt), second=0.5):
        got = tree_generate(target, drafter, prompt, 16, **kwargs)
    assert_same(got.sequences, expected.sequences)
    assert max(drafter.last_stats.acceptance_lengths) > 2
    for name in ("scores", "logits"):
        assert len(getattr(got, name)) == 20
        for a, b in zip(getattr(got, name), getattr(expected, name)):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    assert len(got.hidden_states) == 20
    for a, b in zip(got.hidden_states[1:], expected.hidden_states[1:]):
        for x, y in zip(a, b):
            torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-4)


def test_pipeline_and_streamer(qwen3_target, tokenizer):
    target = qwen3_target
    drafter = make_drafter(target, 8)
    generator = pipeline("text-generation", model=target, tokenizer=tokenizer)
    prompt = "t5 t17 t33 t2 t9 t5 t17 t33"
    expected = generator(prompt, max_new_tokens=20, do_sample=False)
    got = generator(prompt, max_new_tokens=20, do_sample=False, assistant_model=drafter, dflash_tree_budget=8,
                    prompt_lookup_num_tokens=5)
    assert got == expected and drafter.last_stats.new_tokens == 20
    ids = make_prompt(9, seed=2)
    streamer = CollectingStreamer()
    out = tree_generate(target, drafter, ids, 8, max_new_tokens=20, streamer=streamer)
    assert streamer.tokens == out[0].tolist() and streamer.ended


def test_eager_attention_target():
    target = make_target("llama", seed=4, attn_implementation="eager")
    assert target.config._attn_implementation == "eager"
    drafter = make_drafter(target, 8)
    prompt = make_prompt(9, seed=6)
    assert_lossless(target, drafter, prompt, TREE_KINDS, assisted=dict(dflash_tree_budget=16), max_new_tokens=30)
    # attention weights of the committed path: over the cache and its ancestors only, as plain decoding's
    kwargs = dict(max_new_tokens=12, return_dict_in_generate=True, output_attentions=True)
    expected = plain_generate(target, prompt, **kwargs)
    with ranked_drafts(new_tokens(expected, prompt), second=0.5):
        got = tree_generate(target, drafter, prompt, 16, **kwargs)
    assert max(drafter.last_stats.acceptance_lengths) > 2
    for a, b in zip(got.attentions[1:], expected.attentions[1:]):
        for x, y in zip(a, b):
            torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-5)


def test_tree_verifies_at_most_budget_nodes_in_one_target_forward(qwen3_target):
    target = qwen3_target
    drafter = make_drafter(target, 16)
    prompt = make_prompt(9, seed=3)
    widths = []
    hook = target.register_forward_pre_hook(lambda m, a, kw: widths.append(kw["input_ids"].shape[1]), with_kwargs=True)
    try:
        tree_generate(target, drafter, prompt, 64, max_new_tokens=30)
    finally:
        hook.remove()
    stats = drafter.last_stats
    assert len(widths) == 1 + stats.num_verifications  # prefill, then one forward per cycle
    # 64 nodes + the anchor per cycle (0 drafts: the last step, where no draft fits under max_length)
    assert 64 in stats.drafts_per_cycle and set(stats.drafts_per_cycle) <= {0, 64}
    assert widths[1:] == [n + 1 for n in stats.drafts_per_cycle]


# ----------------------------------------------------------------------------------------------------------------------
# the n-gram branch: prompt_lookup_num_tokens=N adds the prompt-lookup continuation as one more branch
def copy_prompt(seed: int = 1) -> torch.Tensor:
    """A prompt that repeats itself: prompt lookup finds continuations in it."""
    base = make_prompt(12, seed=seed)
    return torch.cat([base, base, base[:, :4]], dim=1)


def test_prompt_lookup_is_transformers_prompt_lookup():
    """The branch is what transformers' PromptLookupCandidateGenerator proposes (no EOS, no processors)."""
    from transformers.generation.candidate_generator import (
        PromptLookupCandidateGenerator,
    )

    g = torch.Generator().manual_seed(0)
    for trial in range(300):
        history = torch.randint(0, 4 + trial % 5, (int(torch.randint(2, 30, (1,), generator=g)),), generator=g)
        tokens, ngram = 1 + trial % 7, 1 + trial % 3
        reference = PromptLookupCandidateGenerator(num_output_tokens=tokens, max_matching_ngram_size=ngram,
                                                   max_length=1000)
        candidates, _ = reference.get_candidates(history[None])
        assert lookup_dflash.prompt_lookup(history, tokens, ngram) == candidates[0, len(history) :].tolist()


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("budget", [1, 16])
def test_ngram_branch_greedy_matches_plain(arch, budget):
    target = cached_target(arch)
    drafter = make_drafter(target, 8)
    for prompt, lookup in itertools.product((copy_prompt(1), make_prompt(9, seed=3)), (1, 10, 24)):

        def check(kind, got, expected, proposals):
            assert all(n <= budget + lookup for n in drafter.last_stats.drafts_per_cycle)

        assert_lossless(target, drafter, prompt, TREE_KINDS, check=check, max_new_tokens=40,
                        assisted=dict(dflash_tree_budget=budget, prompt_lookup_num_tokens=lookup))


def test_ngram_branch_accepts_what_prompt_lookup_finds(qwen3_target):
    target, prompt = qwen3_target, copy_prompt(1)
    drafter = make_drafter(target, 8)
    expected = plain_generate(target, prompt, max_new_tokens=40)
    taus = {}
    for lookup in (None, 10):
        got = tree_generate(target, drafter, prompt, 16, max_new_tokens=40, prompt_lookup_num_tokens=lookup)
        assert_same(got, expected)
        taus[lookup] = drafter.last_stats.mean_acceptance_length
    assert taus[10] > 1.5 * taus[None], taus
    assert max(drafter.last_stats.acceptance_lengths) > 8  # a branch longer than the drafter's block


@pytest.mark.parametrize("max_new_tokens", [2, 5, 9, 14, 23])
def test_eos_and_max_length_inside_the_ngram_branch(qwen3_target, max_new_tokens):
    target, prompt = qwen3_target, copy_prompt(1)
    drafter = make_drafter(target, 8)
    reference = new_tokens(plain_generate(target, prompt, max_new_tokens=40), prompt).tolist()
    eos = next(t for i, t in enumerate(reference) if i >= 3 and t not in reference[:i])
    for kwargs in (dict(max_new_tokens=max_new_tokens), dict(max_new_tokens=40, eos_token_id=eos)):
        expected = plain_generate(target, prompt, **kwargs)
        got = tree_generate(target, drafter, prompt, 4, prompt_lookup_num_tokens=10, **kwargs)
        assert_same(got, expected)


def test_ngram_drafts_need_a_tree_or_the_cost_aware_policy(qwen3_target):
    drafter = make_drafter(qwen3_target, 8)
    for settings in (dict(dflash_policy="full"), dict(num_assistant_tokens=4), dict(dflash_lookup=False)):
        with pytest.raises(ValueError, match="prompt_lookup_num_tokens=10.*dflash_policy='cost'.*dflash_tree_budget"):
            qwen3_target.generate(copy_prompt(), assistant_model=drafter, prompt_lookup_num_tokens=10,
                                  max_new_tokens=5, **settings)
    expected = plain_generate(qwen3_target, copy_prompt(), max_new_tokens=5)
    got = qwen3_target.generate(copy_prompt(), assistant_model=drafter, prompt_lookup_num_tokens=10,
                                max_new_tokens=5, dflash_policy="cost")
    assert_same(got, expected)


# ----------------------------------------------------------------------------------------------------------------------
# calls a tree cannot serve
def test_batches_refuse_trees(qwen3_target):
    drafter = make_drafter(qwen3_target, 8)
    ids = torch.cat([make_prompt(6, seed=1), make_prompt(6, seed=2)])
    with pytest.raises(ValueError, match=r"batch size 2.*Drop dflash_tree_budget"):
        qwen3_target.generate(ids, assistant_model=drafter, dflash_tree_budget=8, max_new_tokens=5)


@pytest.mark.parametrize("budget", [0, -3, 2.5, True, "16"])
def test_bad_budgets(qwen3_target, budget):
    drafter = make_drafter(qwen3_target, 8)
    with pytest.raises(ValueError, match="dflash_tree_budget"):
        qwen3_target.generate(make_prompt(6), assistant_model=drafter, dflash_tree_budget=budget, max_new_tokens=5)


HYBRID = ["linear_attention", "linear_attention", "linear_attention", "full_attention"]
REFUSED = {
    "hybrid": (T.Qwen3_5ForCausalLM, T.Qwen3_5TextConfig,
               dict(layer_types=HYBRID, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                    linear_value_head_dim=16), "hybrid/recurrent"),
    "sliding": (T.Qwen3ForCausalLM, T.Qwen3Config,
                dict(use_sliding_window=True, sliding_window=8, max_window_layers=2), "sliding-window"),
}


@pytest.mark.parametrize("kind", sorted(REFUSED))
def test_hybrid_and_sliding_targets_refuse_trees(kind):
    model_class, config_class, fields, words = REFUSED[kind]
    torch.manual_seed(0)
    target = model_class(config_class(
        vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=512, bos_token_id=None, eos_token_id=None,
        pad_token_id=None, tie_word_embeddings=False, **fields)).float().eval()
    drafter = make_drafter(target, 6)
    prompt = make_prompt(7)
    forwards = []
    target.register_forward_pre_hook(lambda *a: forwards.append(1))
    with pytest.raises(ValueError, match=rf"{words}.*Drop dflash_tree_budget"):
        target.generate(prompt, assistant_model=drafter, dflash_tree_budget=8, max_new_tokens=5)
    assert not forwards  # refused before any work
    # the chain still works for them
    assert_same(target.generate(prompt, assistant_model=drafter, max_new_tokens=12, do_sample=False),
                plain_generate(target, prompt, max_new_tokens=12))


def test_tree_budget_without_dflash_drafter_is_refused(qwen3_target):
    with pytest.raises(ValueError, match="dflash_tree_budget"):
        qwen3_target.generate(make_prompt(6), dflash_tree_budget=8, max_new_tokens=3)


# ----------------------------------------------------------------------------------------------------------------------
# sampling on synthetic laws: many draws of build_tree + sample_path against the exact law of 4 tokens
SYNTH_VOCAB, SYNTH_DEPTH = 4, 3


class SyntheticLaw:
    """Drafter distributions q_1..q_3 and a target law p(. | prefix) for every prefix (seeded, uneven: weights
    Exp(1) ** 1.5, normalised)."""

    def __init__(self, seed: int = 123):
        self.generator = torch.Generator().manual_seed(seed)
        self.q = torch.stack([self._draw() for _ in range(SYNTH_DEPTH)])
        self.table = {}

    def _draw(self):
        x = (-torch.rand(SYNTH_VOCAB, generator=self.generator, dtype=torch.float64).log()) ** 1.5
        return (x / x.sum()).float()

    def p(self, prefix) -> torch.Tensor:
        if prefix not in self.table:
            self.table[prefix] = self._draw()
        return self.table[prefix]

    def exact(self) -> dict:
        out = {}
        for cells in itertools.product(range(SYNTH_VOCAB), repeat=SYNTH_DEPTH + 1):
            mass = 1.0
            for i, token in enumerate(cells):
                mass *= float(self.p(cells[:i])[token])
            out[cells] = mass
        return out


def simulate_tree(law, accept, budget, n, seed, branch=()):
    """`n` cycles of a sampled tree (plus the fixed `branch`, as the n-gram branch is added); each outcome completed to
    SYNTH_DEPTH + 1 tokens by sampling p (what later cycles would do). Counts of the outcomes."""
    torch.manual_seed(seed)
    counts = collections.Counter()
    log_q = law.q.log()
    for _ in range(n):
        tree = build_tree(torch.tensor(0), log_q, budget, do_sample=True)
        tree.add_branch(list(branch))
        target_probs = torch.stack([law.p(tuple(path)) for path in tree.paths()])
        path, last = accept(tree, law.q, target_probs)
        out = [int(tree.tokens[i]) for i in path] + [last]
        while len(out) < SYNTH_DEPTH + 1:
            out.append(int(torch.multinomial(law.p(tuple(out)), 1)))
        counts[tuple(out)] += 1
    return counts


def no_residual_update(tree, draft_probs, target_probs):
    """WRONG: after a rejected sibling, keeps p instead of norm(max(0, p - q))."""
    tokens, node, path = tree.tokens.tolist(), 0, []
    while True:
        p, accepted, kids = target_probs[node], None, tree.children[node]
        q = draft_probs[tree.depths[node]].clone() if kids else None
        for child in kids:
            q_j = q / q.sum()
            if float(torch.rand(())) * float(q_j[tokens[child]]) < float(p[tokens[child]]):
                accepted = child
                break
            q[tokens[child]] = 0.0
        if accepted is None:
            return path, int(torch.multinomial(p, 1))
        path.append(accepted)
        node = accepted


def q_with_replacement(tree, draft_probs, target_probs):
    """WRONG: siblings drawn without replacement, judged as if drawn from q itself."""
    tokens, node, path = tree.tokens.tolist(), 0, []
    while True:
        p, accepted, kids = target_probs[node], None, tree.children[node]
        q = draft_probs[tree.depths[node]] if kids else None
        for child in kids:
            if float(torch.rand(())) * float(q[tokens[child]]) < float(p[tokens[child]]):
                accepted = child
                break
            residual = (p - q).clamp_min(0)
            p = residual / residual.sum() if residual.sum() > 0 else p
        if accepted is None:
            return path, int(torch.multinomial(p / p.sum(), 1))
        path.append(accepted)
        node = accepted


@pytest.fixture(scope="module")
def synthetic_law():
    law = SyntheticLaw()
    return law, law.exact()


@pytest.mark.parametrize("branch", [(), (2, 0, 3)], ids=["drafted", "with-fixed-branch"])
@pytest.mark.parametrize("budget", [1, 3, 8, 40])
def test_sampled_tree_follows_the_exact_law(synthetic_law, budget, branch):
    law, exact = synthetic_law
    counts = simulate_tree(law, sample_path, budget, n=6000, seed=1, branch=branch)
    assert chi_square_pvalue(counts, exact) > P_THRESHOLD


def fixed_as_drafted(tree, draft_probs, target_probs):
    """WRONG: judges the fixed (n-gram) children as if drawn from the drafter's q."""
    return sample_path(dataclasses.replace(tree, fixed=[False] * len(tree)), draft_probs, target_probs)


@pytest.mark.parametrize("wrong_rule", [no_residual_update, q_with_replacement, fixed_as_drafted])
def test_wrong_sibling_rules_fail_the_same_harness(synthetic_law, wrong_rule):
    law, exact = synthetic_law
    branch = (2, 0, 3) if wrong_rule is fixed_as_drafted else ()
    counts = simulate_tree(law, wrong_rule, budget=16 if not branch else 3, n=6000, seed=1, branch=branch)
    assert chi_square_pvalue(counts, exact) < P_THRESHOLD


# ----------------------------------------------------------------------------------------------------------------------
# sampling end to end: generate(do_sample=True, dflash_tree_budget=N) on an 8-token vocabulary
SAMPLING_VOCAB, NUM_SAMPLES = 8, 1500


@pytest.fixture(scope="module")
def sampling_target():
    return make_target("qwen3", vocab_size=SAMPLING_VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                       num_key_value_heads=1, initializer_range=0.15, seed=0)


SAMPLING_CASES = {
    # name: (processors, budget, tree-only settings); trees of depth 3 (block 4) for the first 3 new tokens of 5
    "temperature_budget_6": (dict(temperature=0.8), 6, {}),
    "warpers_budget_16": (dict(temperature=1.2, top_k=6, top_p=0.95), 16, {}),
    "repetition_penalty_budget_12": (dict(repetition_penalty=1.8), 12, {}),
    "per_node_processor_budget_8": (dict(no_repeat_ngram_size=2, temperature=1.1), 8, {}),
    "ngram_branch_budget_4": (dict(temperature=0.9), 4, dict(prompt_lookup_num_tokens=3, max_matching_ngram_size=1)),
}


def sample_first_tokens(target, drafter, prompt, budget, seed, **kwargs):
    """Counts of the first 3 new tokens of 5 (so t2, t3 come from a tree of depth 3)."""
    torch.manual_seed(seed)
    counts, lengths, widths = collections.Counter(), [], []
    for _ in range(NUM_SAMPLES):
        out = tree_generate(target, drafter, prompt, budget, max_new_tokens=5, do_sample=True, **kwargs)
        counts[tuple(new_tokens(out, prompt)[:3].tolist())] += 1
        lengths += drafter.last_stats.acceptance_lengths
        widths += drafter.last_stats.drafts_per_cycle
    return counts, lengths, widths


@pytest.fixture(scope="module")
def sampled(sampling_target):
    cache = {}

    def get(case, accept=None):
        key = (case, accept)
        if key not in cache:
            kwargs, budget, tree_only = SAMPLING_CASES[case]
            drafter = make_drafter(sampling_target, block_size=4, seed=3)
            prompt = make_prompt(5, vocab_size=SAMPLING_VOCAB, seed=4)
            with pytest.MonkeyPatch.context() as patch:
                if accept is not None:
                    patch.setattr(tree_dflash, "sample_path", accept)
                counts, lengths, widths = sample_first_tokens(sampling_target, drafter, prompt, budget, seed=5,
                                                              **kwargs, **tree_only)
            cache[key] = (prompt, counts, lengths, widths, kwargs)
        return cache[key]

    return get


# The fast suite keeps one case (per-node processors, the hardest law); the other four and the negative control run
# with the slow suite in .ci/run (~25-35 s each: the fast suite's aim is ~15 minutes on 2 cores)
FAST_SAMPLING_CASES = ("per_node_processor_budget_8",)


@pytest.mark.parametrize("case", [case if case in FAST_SAMPLING_CASES else pytest.param(case, marks=pytest.mark.slow)
                                  for case in sorted(SAMPLING_CASES)])
def test_sampled_tree_generate_follows_target_distribution(sampling_target, sampled, case):
    prompt, counts, lengths, widths, kwargs = sampled(case)
    exact = exact_distribution(sampling_target, prompt, 3, **kwargs)
    assert sum(counts.values()) == NUM_SAMPLES
    assert chi_square_pvalue(counts, exact) > P_THRESHOLD
    # rejections and multi-token acceptances both happen; the n-gram branch adds nodes past the budget
    assert min(lengths) == 1 and max(lengths) >= 3
    assert max(widths) == SAMPLING_CASES[case][1] + SAMPLING_CASES[case][2].get("prompt_lookup_num_tokens", 0)


@pytest.mark.slow
def test_sampled_tree_generate_negative_control(sampling_target, sampled):
    """The same end-to-end harness rejects a tree whose siblings keep p after a rejection."""
    prompt, counts, _, _, kwargs = sampled("temperature_budget_6", no_residual_update)
    assert chi_square_pvalue(counts, exact_distribution(sampling_target, prompt, 3, **kwargs)) < P_THRESHOLD


# ----------------------------------------------------------------------------------------------------------------------
# trees under the cost-aware policy: plain steps, lookup chains or a tree, each tree's budget from its probabilities
def test_tree_budget_follows_verify_costs_and_the_drafters_calibration(monkeypatch):
    target = cached_target("qwen3")
    policy = CostAwarePolicy(target, 7)
    table = CostTable()
    install_cost_table(monkeypatch, target, table)
    log_probs = [0.0] + [math.log(p) for p in (0.5, 0.2, 0.1, 0.05, 0.05, 0.02, 0.01, 0.01)]
    assert policy.tree_budget(log_probs, 1, "cpu").count == 8  # verify costs unknown: the whole tree
    table.observe_verify(1, 0.010)
    table.observe_verify(32, 0.010)  # flat (a GPU at small widths): every node is worth verifying
    assert policy.tree_budget(log_probs, 1, "cpu").count == 8
    table = CostTable()
    install_cost_table(monkeypatch, target, table)
    table.observe_verify(1, 0.010)
    table.observe_verify(9, 0.020)  # steep (a CPU): only the likely nodes pay
    assert 1 <= policy.tree_budget(log_probs, 1, "cpu").count <= 2
    for _ in range(50):  # the drafter turns out far better than its probabilities say: verify more
        policy.observe_tree(expected=0.5, accepted=4)
    assert policy.tree_budget(log_probs, 1, "cpu").count > 2


def test_a_tree_verify_is_padded_to_a_wider_width_measured_cheaper(monkeypatch):
    """As a chain's: where this machine's verify of 8 rows was measured cheaper than the tree's own 6 (CPU matrix
    products run some row counts slower than more rows), the tree's budget counted 6 rows at 8's cost, so it runs 8."""
    target = cached_target("qwen3")
    policy = CostAwarePolicy(target, 15)
    table = CostTable()
    install_cost_table(monkeypatch, target, table)
    for width, seconds in [(6, 0.126), (8, 0.110), (1, 0.061)]:
        table.observe_verify(width, seconds)
    log_probs = [0.0] + [math.log(0.9)] * 5  # 5 likely nodes: all of them pay
    assert policy.tree_budget(log_probs, 1, "cpu") == Draft(5, rows=8)
    table.observe_verify(8, 0.2)  # 8 rows no longer cheaper: the tree runs its own rows
    table.observe_verify(8, 0.2)
    assert policy.tree_budget(log_probs, 1, "cpu") == Draft(5)


def test_the_tree_verifies_as_many_rows_as_the_policy_pads_to(monkeypatch):
    target = cached_target("qwen3")
    drafter, prompt = make_drafter(target, 8), make_prompt(10)
    widths = []
    monkeypatch.setattr(CostAwarePolicy, "tree_budget", lambda self, *args, **kwargs: Draft(2, rows=7))
    # every cycle drafts (a tree), whatever this machine's measured costs say (under load they chose plain steps)
    monkeypatch.setattr(CostAwarePolicy, "choose", lambda self, *args, **kwargs: Draft(self.most))
    hook = target.register_forward_pre_hook(lambda module, args, kwargs: widths.append(kwargs["input_ids"].shape[1]),
                                            with_kwargs=True)

    def every_tree_verify_ran_seven_rows(kind, got, expected, proposals):
        assert 7 in widths, (kind, widths)  # the trees' verifies ran padded (other widths: prefills, plain generate)
        widths.clear()

    try:
        assert_lossless(target, drafter, prompt, TREE_KINDS, max_new_tokens=16, check=every_tree_verify_ran_seven_rows,
                        assisted=dict(dflash_tree_budget=8, dflash_policy="cost"))
    finally:
        hook.remove()


def random_budgets(monkeypatch, seed: int = 0):
    """Each tree verifies a random number of its nodes, padded to 16 rows half the time (any choice must stay
    lossless)."""
    rng = random.Random(seed)
    monkeypatch.setattr(CostAwarePolicy, "tree_budget", lambda self, log_probs, batch, device:
                        Draft(rng.randint(1, len(log_probs) - 1), rows=rng.choice([0, 16])))


@pytest.mark.parametrize("arch", ARCHS)
def test_trees_under_the_cost_aware_policy_are_lossless(arch, monkeypatch):
    target = cached_target(arch)
    drafter = make_drafter(target, 8)
    random_budgets(monkeypatch)
    widths = collections.Counter()  # over every call: which cycles a call gets depends on its measured costs
    for prompt, lookup in itertools.product((copy_prompt(1), make_prompt(9, seed=3)), (None, 10)):

        def check(kind, got, expected, proposals):
            assert all(n <= 16 + (lookup or 10) for n in drafter.last_stats.drafts_per_cycle)
            widths.update(drafter.last_stats.drafts_per_cycle)

        assert_lossless(target, drafter, prompt, TREE_KINDS, check=check, max_new_tokens=40,
                        assisted=dict(dflash_tree_budget=16, dflash_policy="cost", prompt_lookup_num_tokens=lookup))
    assert len(widths) > 2, widths  # the budgets did vary


@pytest.mark.slow  # ~27 s; greedy trees under chosen budgets stay in the fast suite
def test_sampled_trees_with_chosen_budgets_follow_the_target_distribution(sampling_target, monkeypatch):
    """The cost-aware policy's own tree budgets (from the drafter's node probabilities and an injected, frozen cost
    table where drafting pays but wide verifies cost more: never wall-clock), so the cycles are trees whose budget
    really varies, and sampled output follows the target's law."""
    table = CostTable()
    for width, seconds in {1: 0.010, 2: 0.0102, 4: 0.0106, 5: 0.01107, 6: 0.01155, 7: 0.01202, 8: 0.0125}.items():
        table.observe_verify(width, seconds)
    table.observe_draft(0.0005)
    install_cost_table(monkeypatch, sampling_target, table)
    monkeypatch.setattr(CostAwarePolicy, "observe_costs", lambda self, *args, **kwargs: None)
    monkeypatch.setattr(CostTable, "stale", lambda self, width, refresh: False)  # frozen costs need no refresh
    drafter = make_drafter(sampling_target, block_size=4, seed=3)
    prompt = make_prompt(5, vocab_size=SAMPLING_VOCAB, seed=4)
    counts, lengths, widths = sample_first_tokens(sampling_target, drafter, prompt, 8, seed=6, temperature=0.9,
                                                  dflash_policy="cost")
    exact = exact_distribution(sampling_target, prompt, 3, temperature=0.9)
    assert chi_square_pvalue(counts, exact) > P_THRESHOLD
    trees = [w for w in widths if w > 0]
    assert len(trees) > len(widths) / 2 and len(set(trees)) > 2, collections.Counter(widths)  # budgets vary
    assert min(lengths) == 1 and max(lengths) >= 3
