# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""After every tree cycle (``generate(..., dflash_tree_budget=N)``) the drafter's next context is the target's
features of the committed history at the committed positions, as a fresh target forward over that history gives
them. The verify forward computed features for every node of the tree; only the committed path's, in path order,
may reach the drafter. The output stays lossless either way (the target verifies every draft), so only this direct
comparison sees a context taken from the wrong nodes."""

import random

import pytest
import torch
from conftest import cached_target, drafts_for, install_cost_table, make_drafter, make_prompt, plain_generate

from hf_dflash import tree_dflash
from hf_dflash.costs_dflash import CostTable
from hf_dflash.policy_dflash import CostAwarePolicy, Draft
from hf_dflash.rows_dflash import Rows

NEW, BUDGET = 24, 12


def watch_drafter_context(monkeypatch, target, drafter) -> dict:
    """After every commit of a running row (batch 1), assert that the drafter's pending context equals a fresh target
    forward's features of the committed history at the pending positions; count the checks, and the tree cycles whose
    committed path is not the tree's first nodes (there, taking features in node order instead of path order would
    give the drafter other tokens' features)."""
    seen = {"checks": 0, "reordered": 0}
    commit, keep_path_slots = Rows.commit, tree_dflash.keep_path_slots

    def checked_commit(rows, *args, **kwargs):
        running, committed = commit(rows, *args, **kwargs)
        if running:
            history = rows.histories[0]
            with torch.no_grad():
                hidden = target(history[None], output_hidden_states=True).hidden_states
            features, positions = rows.unread()
            fresh = drafter.fused_features(hidden)[:, positions[0]]
            torch.testing.assert_close(
                features, fresh, rtol=1e-4, atol=1e-5,
                msg=lambda m: f"drafter context after cycle {seen['checks']} (history {history.tolist()}): {m}")
            seen["checks"] += 1
        return running, committed

    def watched_keep_path_slots(cache, cached, kept):
        seen["reordered"] += int(kept.tolist() != list(range(len(kept))))
        return keep_path_slots(cache, cached, kept)

    monkeypatch.setattr(Rows, "commit", checked_commit)
    monkeypatch.setattr(tree_dflash, "keep_path_slots", watched_keep_path_slots)
    return seen


def watched_tree_run(monkeypatch, kind: str, prompt_seed: int, **kwargs):
    """A tree-budget generate() under `kind` drafts (conftest.drafts_for) with every commit watched: (its output,
    plain generate's, the watch's counts, the drafter's stats)."""
    target = cached_target("qwen3")
    drafter = make_drafter(target, block_size=6)
    prompt = make_prompt(10, seed=prompt_seed)
    reference = plain_generate(target, prompt, max_new_tokens=NEW)
    seen = watch_drafter_context(monkeypatch, target, drafter)
    torch.manual_seed(0)
    with drafts_for(kind, reference, prompt):
        out = target.generate(prompt, assistant_model=drafter, dflash_tree_budget=BUDGET, max_new_tokens=NEW,
                              **kwargs)
    return out, reference, seen, drafter.last_stats


# Sampling from the target's top 1 runs the sampled verifier (acceptance by p/q, residual draws) on tokens that are
# the greedy reference by construction, so the ranked drafters' later siblings are committed on every CPU; the
# top-2 run's tokens depend on how torch's kernels round on this CPU's instruction set (avx2, avx512, default give
# other draws), so it checks the context on whatever paths it takes and asserts no coverage.
SAMPLINGS = {"greedy": {}, "sampled-top1": dict(do_sample=True, top_k=1), "sampled": dict(do_sample=True, top_k=2)}


@pytest.mark.parametrize("sampling", list(SAMPLINGS))
@pytest.mark.parametrize("kind", ["ranked", "half-ranked", "random"])
def test_drafter_context_after_each_tree_cycle_is_the_committed_history(kind, sampling, monkeypatch):
    """Ranked drafters put the target's greedy token second behind a decoy, so the tree commits paths through later
    siblings whenever the committed tokens are the greedy ones (greedy, and sampling from the top 1); the random
    drafter's trees are as they come."""
    out, reference, seen, _ = watched_tree_run(monkeypatch, kind, 4, **SAMPLINGS[sampling])
    deterministic = sampling != "sampled"
    if deterministic:
        assert out.tolist() == reference.tolist()
    assert seen["checks"] >= 3, seen  # a block of 6 commits at most 6 of the 24 new tokens per cycle
    if kind != "random" and deterministic:
        assert seen["reordered"] >= 2, seen  # the check did meet paths that are not the tree's first nodes


def test_drafter_context_across_plain_steps_and_chosen_tree_budgets(monkeypatch):
    """Under the cost-aware policy, scripted (no wall clock): plain steps (the drafter reads their features later,
    with the next tree's) and trees cut to random budgets. The costs it measures go to a table of this test's own."""
    install_cost_table(monkeypatch, cached_target("qwen3"), CostTable())
    rng = random.Random(2)
    monkeypatch.setattr(CostAwarePolicy, "choose", lambda self, *args, **kwargs: Draft(rng.choice([0, 0, self.most])))
    monkeypatch.setattr(CostAwarePolicy, "tree_budget", lambda self, log_probs, batch, device:
                        Draft(rng.randint(1, len(log_probs) - 1)))
    out, reference, seen, stats = watched_tree_run(monkeypatch, "ranked", 5, do_sample=False, dflash_policy="cost")
    assert out.tolist() == reference.tolist()
    assert seen["checks"] >= 6 and seen["reordered"] >= 1, seen
    assert 0 in stats.drafts_per_cycle and len(set(stats.drafts_per_cycle)) > 2, stats.drafts_per_cycle
