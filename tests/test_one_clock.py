"""One clock: a cycle's target share (its forward, the acceptance and the commit) is the span that
``drafter.last_stats.verify_seconds`` adds up and that the draft policy's cost table learns from, for chains and
trees alike."""

import itertools

import pytest
from conftest import cached_target, make_drafter, make_prompt

from hf_dflash import generation_dflash, rows_dflash, tree_dflash
from hf_dflash.policy_dflash import FullBlocks

COMMIT_SECONDS = 100.0  # a commit that takes this long on the fake clock: each cycle's span must hold it


@pytest.mark.parametrize("assisted", [{}, {"dflash_tree_budget": 6}], ids=["chain", "tree"])
def test_stats_and_costs_measure_the_same_span_commit_included(monkeypatch, assisted):
    now = itertools.count()
    clock = {"offset": 0.0}

    def fake_clock(device=None):  # one tick per reading, plus what the commits took
        return next(now) + clock["offset"]

    commit = rows_dflash.Rows.commit

    def slow_commit(self, *args, **kwargs):
        clock["offset"] += COMMIT_SECONDS
        return commit(self, *args, **kwargs)

    observed = []
    monkeypatch.setattr(generation_dflash, "synchronized_clock", fake_clock)
    monkeypatch.setattr(tree_dflash, "synchronized_clock", fake_clock)
    monkeypatch.setattr(rows_dflash.Rows, "commit", slow_commit)
    monkeypatch.setattr(FullBlocks, "observe_costs",
                        lambda self, batch, device, width, seconds, draft=None: observed.append(seconds))
    target = cached_target("qwen3")
    drafter = make_drafter(target, 8)
    target.generate(make_prompt(9, seed=3), assistant_model=drafter, max_new_tokens=20, do_sample=False, **assisted)
    stats = drafter.last_stats
    assert len(observed) == stats.num_verifications > 1
    assert all(seconds >= COMMIT_SECONDS for seconds in observed)  # every cycle's span holds its commit
    assert stats.verify_seconds == pytest.approx(sum(observed))  # the stats add up what the costs learn from
