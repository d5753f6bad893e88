# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""Draft policies. The cost-aware draft length (the default): its choices from measured costs and acceptance, plain
target steps whose features still reach the drafter, and output identical to plain generate() whatever it chooses.
The seam: the loop and the tree reach every policy through the DraftPolicy protocol only, the generator only
proposes, and lookup settings are resolved once in DFlashCallOptions."""

import collections
import dataclasses
import itertools
import gc
import weakref

import pytest
import torch
from conftest import DRAFTER_KINDS, LIBRARY_DEFAULT_POLICY, assert_lossless, cached_target, make_drafter, make_prompt
from conftest import MEASURED_PADDING, install_cost_table, make_target, new_tokens, plain_generate

from transformers import GenerationConfig

import hf_dflash.costs_dflash
import hf_dflash.timing_dflash
from hf_dflash import generation_dflash
from hf_dflash.candidates_dflash import DFlashCandidateGenerator
from hf_dflash.options_dflash import DFlashCallOptions
from hf_dflash.costs_dflash import CostTable, cost_table, cost_tables
from hf_dflash.policy_dflash import CostAwarePolicy, Draft, DraftPolicy, FullBlocks, HeuristicSchedule
from hf_dflash.timing_dflash import gemm_friendly_rows


def test_the_library_default_is_the_cost_aware_policy():
    assert LIBRARY_DEFAULT_POLICY == "cost"


def policy_with(monkeypatch, verify: dict, draft: float, rate: float, most: int = 15,
                scored_probes: bool = False) -> CostAwarePolicy:
    target = cached_target("qwen3")
    policy = CostAwarePolicy(target, most, scored_probes=scored_probes)
    policy.cycles = 1  # past the first (full-block) cycle
    table = CostTable()
    for width, seconds in verify.items():
        table.observe_verify(width, seconds)
    table.observe_draft(draft)
    install_cost_table(monkeypatch, target, table)
    policy.reached = [1000.0] * most
    policy.accepted = [1000.0 * rate] * most
    return policy


def test_a_weak_drafter_gets_plain_steps_and_is_probed_now_and_then(monkeypatch):
    policy = policy_with(monkeypatch, {1: 0.010, 16: 0.020}, draft=0.005, rate=0.1)  # CPU-like: verify 16 = 2 x t(1)
    choices = [policy.choose(1, "cpu")[0] for _ in range(40)]
    assert choices[:3] == [0, 0, 0]
    probes = [i for i, k in enumerate(choices) if k > 0]
    assert probes[:3] == [3, 11, 27]  # after 4, then 8, then 16 plain steps
    assert CostAwarePolicy(cached_target("qwen3"), 15).choose(1, "cpu")[0] == 15  # a call's first cycle
    assert all(k <= 2 for k in choices)  # a probe asks for what could pay: few drafts
    # where the cost curve is concave (t(8) ~ t(3): a CPU), the drafter's own best count is deep; a backoff probe of
    # a drafter that does not pay still verifies PROBE_DRAFTS (a 7-draft probe of the SmolLM2 drafter on MT-Bench
    # cost ~2.3 plain steps, a 2-draft one ~1.9)
    concave = policy_with(monkeypatch, {1: 0.010, 2: 0.016, 3: 0.017, 8: 0.0175, 16: 0.023}, draft=0.002, rate=0.4)
    probes = [k for k in (concave.choose(1, "cpu")[0] for _ in range(40)) if k]
    assert probes and set(probes) == {CostAwarePolicy.PROBE_DRAFTS}, probes


def test_a_greedy_call_scores_its_probes_instead_of_verifying_them(monkeypatch):
    # the same weak drafter: at batch size 1 each probe is the whole block, scored only (a plain step's cost plus a
    # drafter forward), at the same steps; in a batch the probes are verified, few drafts each
    scored = policy_with(monkeypatch, {1: 0.010, 16: 0.020}, draft=0.005, rate=0.1, scored_probes=True)
    choices = [scored.choose(1, "cpu") for _ in range(40)]
    assert [i for i, d in enumerate(choices) if d.count] == [3, 11, 27]
    assert all(d.scored_only and d.count == 15 for d in choices if d.count)
    batched = policy_with(monkeypatch, {1: 0.010, 16: 0.020}, draft=0.005, rate=0.1, scored_probes=True)
    install_cost_table(monkeypatch, batched.target, batched.table(1, "cpu"), batch=2)
    probes = [d for d in (batched.choose(2, "cpu") for _ in range(40)) if d.count]
    assert probes and all(not d.scored_only and d.count == CostAwarePolicy.PROBE_DRAFTS for d in probes)


def test_a_probe_whose_answer_the_call_has_no_tokens_left_to_use_is_skipped(monkeypatch):
    """SmolLM2-135M on MT-Bench, 64-token answers: each call probed its weak drafter after 8, 16 and 32 plain steps,
    the last with 8 tokens left (a scored probe cost 0.3-0.9 plain steps there, the drafter reading the text since it
    last ran). A backoff probe is skipped when fewer tokens are left than the plain steps it waited for."""
    def probes(max_length, start):
        policy = policy_with(monkeypatch, {1: 0.010, 16: 0.020}, draft=0.005, rate=0.1, scored_probes=True)
        policy.max_length = max_length
        return [i for i in range(40) if policy.choose(1, "cpu", context=start + i).count]

    assert probes(None, 0) == probes(1000, 0) == [3, 11, 27]  # after 4, then 8, then 16 plain steps
    assert probes(40, 0) == [3, 11]  # at the 28th, 12 tokens would be left after waiting 16
    assert probes(10, 0) == [3]


def test_a_new_length_of_context_near_the_calls_end_is_measured_once_with_what_fits(monkeypatch):
    """SmolLM2-135M on 2K-token documents, 64-token answers: the text entered a new length of context (2,048 tokens,
    a cost table of its own) 16 tokens before the call's end, and the policy asked for a full block to measure it
    every cycle to the end: each block was cut to the drafts that fit, so the full width was never measured (0.93x of
    plain). Now it measures the widest verify that fits, once, then a plain step; and near the end a stale far end
    is not refreshed by blocks the call cannot verify whole."""
    def blocks(max_length, start, cycles):
        policy = policy_with(monkeypatch, {}, draft=0.005, rate=0.1, scored_probes=True)
        install_cost_table(monkeypatch, policy.target, CostTable())  # a new length of context: nothing measured
        policy.max_length, chosen = max_length, []
        for context in range(start, start + cycles):
            draft = policy.choose(1, "cpu", context=context)
            fits = min(draft.count, max_length - context - 1)  # what the drafter proposes
            rows = hf_dflash.timing_dflash.verify_rows(fits + 1, device=torch.device("cpu"), batch=1)
            policy.observe_costs(1, "cpu", rows, 0.010 * (1 + rows / 16), 0.005 if fits else None)
            chosen.append(draft.count if fits and not draft.scored_only else 0)
        return chosen

    assert blocks(64, 48, 12)[:2] == [15, 0]  # the whole block fits: measured, then one plain step
    cut = blocks(64, 58, 5)  # 5 drafts fit (6 rows: a width no CPU pads)
    assert cut[:2] == [15, 0] and cut.count(15) == 1, cut  # measured once, with what fits

    # drafting pays (short chains: a wide verify is dear) and the far end of the cost curve is stale: within 8 rows
    # of the call's end (no CPU pads that few) no full block is asked for that the call cannot verify whole
    policy = policy_with(monkeypatch, {1: 0.010, 2: 0.0105, 16: 0.05}, draft=0.001, rate=0.6, scored_probes=True)
    policy.max_length, table = 100, policy.table(1, "cpu")
    for width in (1, 2, 16, 1, 2, 16):  # three samples each: stale after 36 observations, forgotten after 256
        table.observe_verify(width, table.verify_samples[width][0])
    for _ in range(40):
        table.observe_verify(1, 0.010)
    assert table.stale(16, CostAwarePolicy.REFRESH) and 16 in table.verify
    assert [policy.choose(1, "cpu", context=context).count < policy.most for context in range(93, 97)] == [True] * 4


def test_a_scored_probe_counts_as_one_verification_of_what_the_target_committed():
    policy = CostAwarePolicy(None, most=4)
    policy.observe_acceptance(4, [4])  # one verification before: all four depths reached and accepted
    policy.observe_drafter_offer(torch.tensor([5, 6]), [7, 8, 9, 10])
    policy.observe_offers(torch.tensor([5, 6]), [], size=0)  # nothing committed yet: nothing scored, nothing aged
    assert policy.reached == [1.0] * 4
    policy.observe_offers(torch.tensor([5, 6, 7]), [], size=0)
    policy.observe_offers(torch.tensor([5, 6, 7, 8, 3]), [], size=0)  # the third draft (9) is not what came
    memory = CostAwarePolicy.MEMORY
    assert policy.reached == pytest.approx([memory + 1, memory + 1, memory + 1, memory])
    assert policy.accepted == pytest.approx([memory + 1, memory + 1, memory, memory])
    assert policy.offers == []  # scored to its end: dropped


@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_a_scored_probe_steps_plainly_and_the_drafter_reads_every_position_once(tree, monkeypatch):
    """Scripted choices mixing plain steps, scored probes and verified blocks: the output is plain generate's, a
    probe verifies nothing (a plain step in the stats) and its drafts reach the policy, and the drafter reads the
    committed positions once each, in order (a probe's features must not be read again at the next draft)."""
    target = cached_target("qwen3")
    drafter, prompt = make_drafter(target, block_size=6), make_prompt(10, seed=3)
    install_cost_table(monkeypatch, target, CostTable())
    script = itertools.cycle([0, "probe", 0, 0, "probe", "block"])
    choices = {0: lambda most: Draft(0), "probe": lambda most: Draft(most, scored_only=True),
               "block": lambda most: Draft(most)}
    monkeypatch.setattr(CostAwarePolicy, "choose", lambda self, *args, **kwargs: choices[next(script)](self.most))
    offers, read = [], []
    observe = CostAwarePolicy.observe_drafter_offer
    monkeypatch.setattr(CostAwarePolicy, "observe_drafter_offer",
                        lambda self, history, drafts: offers.append(len(drafts)) or observe(self, history, drafts))
    states = DFlashCandidateGenerator.drafter_states
    monkeypatch.setattr(DFlashCandidateGenerator, "drafter_states", lambda self, histories, context, positions, *args,
                        **kwargs: read.extend(positions[0].tolist()) or states(self, histories, context, positions,
                                                                              *args, **kwargs))
    assisted = dict(dflash_policy="cost", dflash_lookup=False) | ({"dflash_tree_budget": 4} if tree else {})
    assert_lossless(target, drafter, prompt, kinds=["random"], max_new_tokens=30, assisted=assisted)
    assert offers and offers[:-1] == [5] * (len(offers) - 1) and 0 < offers[-1] <= 5, offers  # a block (cut at the end)
    assert read == list(range(len(read))), read  # every position once, in order
    cycles = drafter.last_stats.drafts_per_cycle
    verified = sum(1 for count in cycles if count)
    assert cycles.count(0) >= 4 * verified > 0, cycles  # of every 6 cycles, 5 verify no draft (2 of them probes)


@pytest.mark.parametrize("vocabulary", [False, True], ids=["whole-vocabulary", "draft-vocabulary"])
def test_a_scored_probe_scores_only_the_drafts_the_text_reaches(vocabulary, monkeypatch):
    """SmolLM2-135M's shipped drafter on chat: its probes' LM head over the whole block cost a CPU twice the drafter's
    forward, for a first draft that rarely holds. A greedy probe's drafts are scored when the policy reads them: a
    drafter whose first draft never holds has one row of each probe scored, and each draft is the head's argmax."""
    target = cached_target("qwen3")
    drafter, prompt = make_drafter(target, block_size=6), make_prompt(10, seed=3)
    if vocabulary:
        drafter.set_draft_vocabulary(list(range(0, target.config.vocab_size, 3)))
    install_cost_table(monkeypatch, target, CostTable())
    script = itertools.cycle([0, "probe"])
    monkeypatch.setattr(CostAwarePolicy, "choose", lambda self, *args, **kwargs: (
        Draft(self.most, scored_only=True) if next(script) == "probe" else Draft(0)))
    probes = []
    scored = DFlashCandidateGenerator.scored_drafts
    monkeypatch.setattr(DFlashCandidateGenerator, "scored_drafts", lambda self, *args: probes.append(
        (self, scored(self, *args))) or probes[-1][1])
    try:
        assert_lossless(target, drafter, prompt, kinds=["random"], max_new_tokens=24,
                        assisted=dict(dflash_policy="cost", dflash_lookup=False))
        lengths = [len(drafts) for _, drafts in probes]  # the whole block, then what fits before max_new_tokens
        assert len(lengths) >= 10 and lengths[:8] == [5] * 8 and min(lengths) > 0, lengths
        assert [len(drafts.tokens) for _, drafts in probes] == [1] * len(probes)  # the first draft: always wrong
        for generator, drafts in probes:  # each draft the argmax of the LM head's logits, as a drafted cycle's
            assert drafts[:] == generator.draft_logits(drafts.hidden).argmax(dim=-1).tolist()
    finally:
        drafter.set_draft_vocabulary(None)


def test_a_good_drafter_verifies_long_chains_and_flat_costs_favour_longer_ones(monkeypatch):
    cpu = policy_with(monkeypatch, {1: 0.010, 16: 0.020}, draft=0.005, rate=0.9)
    gpu = policy_with(monkeypatch, {1: 0.010, 16: 0.0105}, draft=0.002, rate=0.9)
    assert cpu.choose(1, "cpu")[0] >= 8
    assert gpu.choose(1, "cpu")[0] == 15  # a flat verify cost: every extra draft is nearly free
    middling = policy_with(monkeypatch, {1: 0.010, 16: 0.020}, draft=0.005, rate=0.6)
    assert 0 < middling.choose(1, "cpu")[0] < 15  # costs grow with width: stop where the next draft stops paying


def test_unmeasured_costs_start_with_a_full_block(monkeypatch):
    target = cached_target("llama")
    monkeypatch.setattr(hf_dflash.costs_dflash, "_COST_TABLES", weakref.WeakKeyDictionary())
    assert CostAwarePolicy(target, 7).choose(1, "cpu")[0] == 7


def test_drafting_costs_are_what_a_loaded_machine_typically_pays_not_its_luckiest_cycle():
    """Next to another job, a verify of several rows costs ~10% more than its least sample (one cycle that found the
    other core idle): the least sample made drafting look cheaper than it is (GSM8K at 0.90x of plain under load).
    Widths that drafting measures count at their lower median; t(1), re-measured only now and then, at its least
    sample, so one fresh sample corrects a table that a loaded machine left."""
    table = CostTable()
    for seconds in (0.025, 0.018, 0.026, 0.024, 0.027):  # 0.018: the other core was idle for this one
        table.observe_verify(4, seconds)
        table.observe_draft(seconds / 10)
    for seconds in (0.030, 0.031, 0.010):  # a loaded machine's t(1), then a quiet one's
        table.observe_verify(1, seconds)
    assert table.verify == {1: 0.010, 4: 0.025}
    assert table.draft == pytest.approx(0.0025)


def test_a_fresh_target_never_inherits_a_collected_ones_costs():
    # Costs are kept with the target they describe (weakly keyed): an id() key would hand a new model the costs of
    # a collected one that happened to live at the same address.
    for _ in range(20):
        target = make_target("qwen3", num_hidden_layers=1, hidden_size=32)
        assert cost_tables(target) == {}
        cost_table(target, "cpu", 1).observe_verify(1, 123.0)
        del target
        gc.collect()
    assert not any(t.verify.get(1) == 123.0 for tables in hf_dflash.costs_dflash._COST_TABLES.values()
                   for t in tables.values())


def test_each_length_of_context_has_its_own_costs(monkeypatch):
    """A long context makes a one-row step dear (it reads the whole cache) while a wide verify reads it once: drafting
    that loses after a short prompt can win after a long one. The policy reads, and records, the costs of the
    context it is at: what a short chat measured never decides a long document's cycles, nor the reverse."""
    policy = policy_with(monkeypatch, {1: 0.010, 16: 0.030}, draft=0.005, rate=0.5)  # short: t(16) = 3 t(1)
    long_costs = CostTable()
    for width, seconds in {1: 0.030, 16: 0.036}.items():  # ~5K cached tokens: t(16) = 1.2 t(1)
        long_costs.observe_verify(width, seconds)
    long_costs.observe_draft(0.005)
    install_cost_table(monkeypatch, policy.target, long_costs, bucket=3)
    assert policy.choose(1, "cpu", context=5000)[0] >= 3
    policy.observe_costs(1, "cpu", 1, 0.031)  # what a cycle at 5K tokens measured goes to the 5K table
    assert list(long_costs.verify_samples[1]) == [0.030, 0.031]
    assert [policy.choose(1, "cpu", context=200)[0] for _ in range(3)] == [0, 0, 0]
    assert cost_table(policy.target, "cpu", 1, context=200).verify[1] == 0.010


def test_the_candidate_generator_tells_the_policy_how_long_the_text_is(monkeypatch):
    target = cached_target("qwen3")
    drafter = make_drafter(target, block_size=8)
    prompt = make_prompt(9, seed=5)
    seen, choose = [], CostAwarePolicy.choose
    monkeypatch.setattr(CostAwarePolicy, "choose", lambda self, *a, **k: (seen.append(k["context"]),
                                                                           choose(self, *a, **k))[1])
    target.generate(prompt, assistant_model=drafter, max_new_tokens=12, dflash_policy="cost")
    assert seen[0] == prompt.shape[1] + 1 and seen == sorted(seen) and seen[-1] < prompt.shape[1] + 12  # + its first token


def test_verifies_are_padded_to_16_rows_only_where_this_cpu_runs_16_faster(monkeypatch):
    """The padding rule is measured, not assumed: a CPU whose GEMM has no faster 16-row kernel verifies 11 rows as 11
    (a 10-draft lookup on an AVX-512 EPYC: 1.89 t(1) instead of 2.19), one that has it pads them; never on a GPU or in
    a batch, never below 9 rows."""
    cpu = torch.device("cpu")
    measured = MEASURED_PADDING.__wrapped__()  # the real measurement, uncached
    assert measured <= set(range(9, 16))
    monkeypatch.setattr(hf_dflash.timing_dflash, "rows_slower_than_sixteen", lambda: frozenset())
    assert [gemm_friendly_rows(n, cpu) for n in (8, 9, 11, 15, 16)] == [8, 9, 11, 15, 16]
    monkeypatch.setattr(hf_dflash.timing_dflash, "rows_slower_than_sixteen", lambda: frozenset({9, 10, 11}))
    assert [gemm_friendly_rows(n, cpu) for n in (8, 9, 11, 12, 16)] == [8, 16, 16, 12, 16]
    assert gemm_friendly_rows(11, cpu, batch=2) == 11 and gemm_friendly_rows(11, torch.device("meta")) == 11
    seed_state = torch.random.get_rng_state()
    MEASURED_PADDING.__wrapped__()
    assert torch.equal(torch.random.get_rng_state(), seed_state)  # a user's seeded sampling never sees it


def test_a_verify_is_padded_to_a_wider_width_measured_cheaper(monkeypatch):
    """Where this machine's verify of more rows was measured cheaper (SmolLM2-135M on one AMD EPYC thread: 3 rows
    cost 1.2x 4 rows), a verify of fewer rows runs at the wider width: the policy already counted it at that cost. A
    drafter chain takes the wider width's drafts itself; a short lookup continuation and a probe's few drafts pad."""
    row_kernels = {2: 0.016, 3: 0.020, 4: 0.0166, 8: 0.019, 16: 0.025, 1: 0.010}  # t(1) last: not stale
    policy = policy_with(monkeypatch, row_kernels, draft=0.005, rate=0.1)
    policy.lookup_reached[2], policy.lookup_accepted[2] = [50.0] * 10, [45.0] * 10
    assert policy.choose(1, "cpu", lookup_length=2, lookup_size=2) == Draft(2, True, rows=4)
    assert policy.choose(1, "cpu", lookup_length=4, lookup_size=2) == Draft(4, True)  # 5 rows: none cheaper
    probes = [d for d in (policy.choose(1, "cpu") for _ in range(40)) if d.count]
    assert probes and set(probes) == {Draft(CostAwarePolicy.PROBE_DRAFTS, rows=4)}
    good = policy_with(monkeypatch, row_kernels, draft=0.001, rate=0.6)
    assert good.choose(1, "cpu").count not in (0, 2) and good.choose(1, "cpu").rows == 0
    # a lone expensive sample is not a kernel: once forgotten, the narrower width runs as itself and is measured again
    table = policy.table(1, "cpu")
    for _ in range(300):
        table.observe_verify(1, 0.010)
    assert policy.choose(1, "cpu", lookup_length=2, lookup_size=2) == Draft(2, True)


def test_the_loop_verifies_as_many_rows_as_the_policy_pads_to(monkeypatch):
    target = make_target("qwen3")
    drafter, prompt = make_drafter(target), make_prompt(10)
    widths = []
    # each choice marks the list: the forward after it is that cycle's verify (before the first: the plain reference)
    monkeypatch.setattr(CostAwarePolicy, "choose", lambda self, *args, **kwargs: widths.append(0) or Draft(2, rows=5))

    def every_verify_ran_five_rows(kind, got, expected, proposals):
        verifies = [widths[i + 1] for i, width in enumerate(widths) if width == 0 and i + 1 < len(widths)]
        assert verifies and set(verifies) == {5}, (kind, widths)  # padded, whatever was accepted
        widths.clear()

    hook = target.register_forward_pre_hook(lambda module, args, kwargs: widths.append(kwargs["input_ids"].shape[1]),
                                            with_kwargs=True)
    try:
        assert_lossless(target, drafter, prompt, max_new_tokens=12, assisted={"dflash_policy": "cost"},
                        check=every_verify_ran_five_rows)
    finally:
        hook.remove()


def test_interpolated_verify_costs():
    """Between measured widths on a line in the logarithm of the width (the chord when optimistic), past the widest
    along the last segment."""
    table = CostTable()
    table.observe_verify(1, 1.0)
    table.observe_verify(9, 3.0)
    assert table.verify_seconds(3) == pytest.approx(2.0)
    assert table.verify_seconds(3, optimistic=True) == pytest.approx(1.5)
    assert table.verify_seconds(17) == pytest.approx(5.0) == table.verify_seconds(17, optimistic=True)


def test_a_one_draft_lookup_is_not_priced_on_the_chord_of_a_concave_cost_curve(monkeypatch):
    """SmolLM2-135M on MT-Bench, one thread of an AMD EPYC: a call had measured t(1) and t(16) = 2.9 t(1); 2 rows,
    never measured, were priced on the chord between them (1.13 t(1)) where they cost 1.8 t(1), so 1-draft prompt
    lookups holding 1 time in 4 were verified, each at ~0.6 plain steps lost. Priced on the logarithm of the width
    (1.48 t(1)), they lose to a plain step; one holding 3 times in 4 still wins."""
    policy = policy_with(monkeypatch, {16: 0.163, 1: 0.056}, draft=0.0012, rate=0.05)
    policy.lookup_reached[2], policy.lookup_accepted[2] = [8.0], [2.0]  # 8 offers of one draft, 2 held
    assert [policy.choose(1, "cpu", lookup_length=1, lookup_size=2).count for _ in range(3)] == [0, 0, 0]
    policy.lookup_accepted[2] = [6.0]
    assert policy.choose(1, "cpu", lookup_length=1, lookup_size=2) == Draft(1, from_lookup=True)


def a_call_after_plain_steps(first_block: float = 0.150, plain: float = 0.060, steps: int = 20) -> CostTable:
    """A call's costs after its first full block (measured before any plain step) and `steps` plain steps: long
    enough that the block's lone sample is forgotten (16 observations)."""
    table = CostTable()
    table.observe_verify(16, first_block)
    for _ in range(steps):
        table.observe_verify(1, plain)
    return table


def test_a_forgotten_far_end_is_not_priced_as_a_plain_step():
    """Once the call's one full block was forgotten, every wider verify was priced as a plain step (the widest width
    left): an 11-row verify 'cost' t(1). The far end is kept as its ratio to t(1), shrunk towards 1 while it is not
    re-measured (a lone sample may have met a spike; a spiked ratio kept whole stopped the drafter for good), and never
    below a width measured lately (it does not pull measured costs down)."""
    table = a_call_after_plain_steps()
    assert 16 not in table.verify  # forgotten
    assert table.verify_seconds(11) > 1.3 * table.verify_seconds(1)
    assert table.verify_seconds(16) == pytest.approx(0.060 * (0.150 / 0.060) ** 0.5)
    table.observe_verify(3, 0.130)  # measured lately, dearer than the shrunk far end: kept as measured
    assert table.verify_seconds(3) == pytest.approx(0.130) and table.verify_seconds(16) == pytest.approx(0.130)
    table.observe_verify(16, 0.140)  # re-measured: the far end is what it costs again
    assert table.verify_seconds(16) == pytest.approx(0.140)


def test_lookups_that_rarely_hold_are_not_verified_once_the_full_block_is_forgotten(monkeypatch):
    """SmolLM2-135M on MT-Bench, one thread of an AMD EPYC: after 16 plain steps the call's full block was forgotten,
    and 10-token prompt lookups that held 1 time in 20 were verified at 2.3 plain steps each (the policy priced them at
    one). With the far end kept, such a lookup loses to a plain step."""
    policy, table = policy_with(monkeypatch, {}, draft=0.020, rate=0.1), a_call_after_plain_steps()
    table.observe_draft(0.020)
    install_cost_table(monkeypatch, policy.target, table)
    policy.lookup_reached[1], policy.lookup_accepted[1] = [7.0] + [0.0] * 9, [0.0] * 10  # 7 offers, none held
    assert [policy.choose(1, "cpu", lookup_length=10, lookup_size=1).count for _ in range(3)] == [0, 0, 0]


@pytest.mark.parametrize("kind", DRAFTER_KINDS)
@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_default_policy_is_lossless(arch, kind, monkeypatch):
    target = cached_target(arch)
    drafter = make_drafter(target, block_size=8)
    prompt = make_prompt(11, seed=3)
    if kind == "oracle":  # frozen CPU-like costs: the acceptance check must not depend on a loaded machine's timing
        table = CostTable()
        table.observe_verify(1, 0.010)
        table.observe_verify(8, 0.015)
        table.observe_draft(0.005)
        install_cost_table(monkeypatch, target, table)
        monkeypatch.setattr(CostTable, "observe_verify", lambda self, width, seconds: None)
        monkeypatch.setattr(CostTable, "observe_draft", lambda self, seconds: None)
    assert_lossless(target, drafter, prompt, (kind,), assisted=dict(dflash_policy="cost"), max_new_tokens=48)
    if kind == "oracle":  # perfect drafts pay: (nearly) full blocks from the first cycle on
        assert drafter.last_stats.acceptance_lengths[0] == 8 and drafter.last_stats.mean_acceptance_length > 4


def test_default_policy_in_a_left_padded_batch_and_with_sampling():
    target = cached_target("qwen3")
    drafter = make_drafter(target, block_size=6)
    ids = torch.cat([make_prompt(9, seed=1), make_prompt(9, seed=2)])
    mask = torch.ones_like(ids)
    ids[1, :4], mask[1, :4] = 0, 0
    expected = plain_generate(target, ids, attention_mask=mask, max_new_tokens=30, pad_token_id=0)
    got = target.generate(ids, attention_mask=mask, assistant_model=drafter, max_new_tokens=30, do_sample=False,
                          pad_token_id=0, dflash_policy="cost")
    assert got.tolist() == expected.tolist()
    sampled = target.generate(ids, attention_mask=mask, assistant_model=drafter, max_new_tokens=30, do_sample=True,
                              top_k=1, pad_token_id=0, dflash_policy="cost")  # a point-mass law: greedy again
    assert sampled.tolist() == expected.tolist()


@pytest.mark.parametrize("lookups", [False, True])
def test_plain_steps_still_feed_the_drafter_every_position(lookups):
    """When the policy takes plain steps (or verifies lookup drafts), the features of those positions must reach the
    drafter's cache before it drafts again: every drafting call's context covers exactly the positions before its
    anchor."""
    target = cached_target("qwen3")
    drafter = make_drafter(target, block_size=6)
    prompt = copy_prompt(4) if lookups else make_prompt(10, seed=4)
    checks = []
    original = DFlashCandidateGenerator.propose
    schedule = iter([0, 0, 5, 0, 5, 0, 0, 0, 5] + [5] * 20)  # (the first cycle is the prefill's; then these)

    def choose(self, batch, device, lookup_length=0, lookup_size=0, context=0):
        k = next(schedule)
        return Draft(lookup_length, True) if lookups and k == 0 and lookup_length else Draft(k)

    def propose(self, histories, context, context_positions, anchor_positions, slot_mask=None, num_drafts=None):
        cached = self.cache.get_seq_length()
        checks.append((cached + context.shape[1], int(anchor_positions[0]),
                       context_positions[0].tolist() == list(range(cached, int(anchor_positions[0])))))
        return original(self, histories, context, context_positions, anchor_positions, slot_mask, num_drafts)

    saved = CostAwarePolicy.choose
    CostAwarePolicy.choose, DFlashCandidateGenerator.propose = choose, propose
    try:
        got = target.generate(prompt, assistant_model=drafter, max_new_tokens=30, do_sample=False,
                              dflash_policy="cost", dflash_lookup=lookups)
    finally:
        CostAwarePolicy.choose, DFlashCandidateGenerator.propose = saved, original
    assert got.tolist() == plain_generate(target, prompt, max_new_tokens=30).tolist()
    if lookups:
        assert drafter.last_stats.lookup_cycles >= 2
    else:
        assert drafter.last_stats.drafts_per_cycle[:3] == [0, 0, 5]
    assert checks and all(total == anchor and contiguous for total, anchor, contiguous in checks), checks


def test_dflash_policy_is_checked_and_only_for_dflash_drafters():
    target = cached_target("qwen3")
    drafter = make_drafter(target)
    prompt = make_prompt(5)
    with pytest.raises(ValueError, match="dflash_policy='fastest'.*'cost'.*'full'"):
        target.generate(prompt, assistant_model=drafter, max_new_tokens=4, dflash_policy="fastest")
    with pytest.raises(ValueError, match="DFlash drafters only"):
        target.generate(prompt, max_new_tokens=4, dflash_policy="cost")


def test_later_calls_go_on_from_what_earlier_calls_learned(monkeypatch):
    """A drafter's second call does not start over with a full block when earlier calls showed drafting loses."""
    target = cached_target("qwen3")
    drafter = make_drafter(target, block_size=8)
    prompt = make_prompt(9, seed=5)
    target.generate(prompt, assistant_model=drafter, max_new_tokens=40, dflash_policy="cost")
    assert drafter.last_stats.drafts_per_cycle[0] == 7  # a new drafter: a full block first
    table = CostTable()  # costs where these (random) drafts cannot pay: a CPU-like verify, a costly drafter
    for width, seconds in {1: 0.010, 8: 0.015, 16: 0.020}.items():
        table.observe_verify(width, seconds)
    table.observe_draft(0.010)
    install_cost_table(monkeypatch, target, table)
    target.generate(prompt, assistant_model=drafter, max_new_tokens=40, dflash_policy="cost")
    assert drafter.last_stats.drafts_per_cycle[0] == 0, drafter.last_stats.drafts_per_cycle


# ----------------------------------------------------------------------------------------------------------------------
# the prompt-lookup source: drafts copied from earlier text, verified without a drafter forward (batch size 1)
def copy_prompt(seed: int = 1) -> torch.Tensor:
    """A prompt that repeats itself: prompt lookup finds continuations in it."""
    base = make_prompt(12, seed=seed)
    return torch.cat([base, base, base[:, :4]], dim=1)


def test_lookup_drafts_win_where_they_are_accepted_and_give_way_where_they_are_not(monkeypatch):
    weak = policy_with(monkeypatch, {1: 0.010, 16: 0.020}, draft=0.005, rate=0.1)
    weak.lookup_reached[2], weak.lookup_accepted[2] = [50.0] * 10, [45.0] * 10  # lookups of 2-grams held 90%
    k, from_lookup = weak.choose(1, "cpu", lookup_length=10, lookup_size=2)[:2]
    assert from_lookup and k >= 5
    assert weak.choose(1, "cpu", lookup_length=3, lookup_size=2) == Draft(3, True)  # no more than is on offer
    assert weak.choose(1, "cpu") == Draft(0)  # nothing on offer: the weak drafter loses to a plain step
    strong = policy_with(monkeypatch, {1: 0.010, 16: 0.020}, draft=0.005, rate=0.95)
    assert strong.choose(1, "cpu", lookup_length=10, lookup_size=2) == Draft(15)  # unrated lookups: the drafter
    failing = policy_with(monkeypatch, {1: 0.010, 16: 0.020}, draft=0.005, rate=0.1)
    failing.lookup_reached[2], failing.lookup_accepted[2] = [50.0] * 10, [0.0] * 10
    assert not any(failing.choose(1, "cpu", lookup_length=10, lookup_size=2)[1] for _ in range(200))


def test_lookups_that_win_do_not_restart_the_drafters_probing(monkeypatch):
    """A lookup that wins a cycle says nothing of the drafter: a weak drafter's probing backoff (4, 8, 16... plain
    steps) goes on across lookup cycles. (Restarting it at every lookup probed the SmolLM2 drafter every 4 steps on
    MT-Bench, where 2-gram lookups win now and then: 5 probes per 64-token call, ~5% of its time.)"""
    policy = policy_with(monkeypatch, {1: 0.010, 16: 0.020}, draft=0.005, rate=0.1)
    policy.lookup_reached[2], policy.lookup_accepted[2] = [50.0] * 10, [45.0] * 10
    choices = [policy.choose(1, "cpu", **({"lookup_length": 10, "lookup_size": 2} if i % 5 == 4 else {}))
               for i in range(100)]
    assert all(d.from_lookup for i, d in enumerate(choices) if i % 5 == 4), choices
    probes = [i for i, d in enumerate(choices) if d.count and not d.from_lookup]
    assert len(probes) == 4, probes  # after 4, 8, 16 and 32 plain steps (80 of the 100 cycles; restarted: 20)


def copying_text_cycles(policy, text: torch.Tensor, start: int, offers) -> list[tuple[int, bool]]:
    """Run the policy over `text` from `start` tokens on, as the decoding loop does at batch size 1: each cycle its
    lookup offer (`offers(history)`: (drafts, n-gram size)) is scored, then the policy chooses; a plain step or a
    drafter cycle commits one token (the drafter is weak), a lookup the offer's drafts that `text` repeats + 1.
    Returns the choices."""
    choices, length = [], start
    while length < len(text):
        history = text[:length]
        offer, size = offers(history)
        policy.observe_offers(history, offer, size)
        k, from_lookup = policy.choose(1, "cpu", lookup_length=len(offer), lookup_size=size)[:2]
        taken = 0
        if from_lookup:
            taken = next((i for i, d in enumerate(offer[:k]) if length + i >= len(text) or text[length + i] != d), k)
        choices.append((k, from_lookup))
        length += taken + 1
    return choices


def test_lookup_offers_are_rated_whether_verified_or_not(monkeypatch):
    """No trials: every cycle's lookup offer is scored against the tokens committed after it. In a text that copies
    a passage, lookups take over within a few cycles and verify the whole offer; offers that the text does not
    repeat are never verified, however long they keep coming; when they start to hold again, lookups come back."""
    from hf_dflash.lookup_dflash import prompt_lookup_match
    torch.manual_seed(0)
    passage = torch.randint(10, 1000, (120,))
    text = torch.cat([passage, passage])
    policy = policy_with(monkeypatch, {1: 0.010, 2: 0.0145, 16: 0.022}, draft=0.004, rate=0.1)
    choices = copying_text_cycles(policy, text, 122, lambda history: prompt_lookup_match(history, 10, 2))
    assert all(from_lookup for _, from_lookup in choices[4:]), choices
    assert [k for k, _ in choices[-4:-1]] == [10, 10, 10], choices
    # offers the text does not repeat (a token never in it): never verified
    wrong = lambda history: ([7] * 10, 2)  # noqa: E731
    choices = copying_text_cycles(policy, torch.cat([passage, passage]), 122, wrong)
    assert not any(from_lookup for _, from_lookup in choices[10:]), choices
    # the right offers again: lookups are back within a few cycles, without a trial
    choices = copying_text_cycles(policy, text, 122, lambda history: prompt_lookup_match(history, 10, 2))
    assert all(from_lookup for _, from_lookup in choices[8:]) and len(choices) > 12, choices


def forced_lookups(monkeypatch):
    """Every cycle with a lookup continuation on offer verifies all of it; the drafter drafts full blocks otherwise."""
    def choose(self, batch, device, lookup_length=0, lookup_size=0, context=0):
        return Draft(lookup_length, True) if lookup_length else Draft(self.most)

    monkeypatch.setattr(CostAwarePolicy, "choose", choose)


@pytest.mark.parametrize("kind", DRAFTER_KINDS)
@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_lookup_drafts_are_lossless(arch, kind, monkeypatch):
    target = cached_target(arch)
    drafter = make_drafter(target, block_size=8)
    for prompt in (copy_prompt(1), copy_prompt(2), make_prompt(9, seed=3)):
        for forced in (False, True):
            with monkeypatch.context() as patch:
                if forced:
                    forced_lookups(patch)
                assert_lossless(target, drafter, prompt, (kind,), max_new_tokens=40,
                                assisted=dict(dflash_policy="cost", prompt_lookup_num_tokens=12))
            if forced and prompt.shape[1] > 9:
                assert drafter.last_stats.lookup_cycles > 0


def test_lookup_drafts_are_what_prompt_lookup_finds(monkeypatch):
    """On a prompt that repeats, lookup drafts are accepted: more tokens per verification than the random drafter
    gets alone, with cycles longer than its block."""
    target, prompt = cached_target("qwen3"), copy_prompt(1)
    drafter = make_drafter(target, block_size=4)
    expected = plain_generate(target, prompt, max_new_tokens=40)
    forced_lookups(monkeypatch)
    got = target.generate(prompt, assistant_model=drafter, max_new_tokens=40, dflash_policy="cost",
                          prompt_lookup_num_tokens=10)
    assert got.tolist() == expected.tolist()
    with_lookup = drafter.last_stats
    target.generate(prompt, assistant_model=drafter, max_new_tokens=40, dflash_policy="full")
    assert with_lookup.mean_acceptance_length > 1.5 * drafter.last_stats.mean_acceptance_length
    assert max(with_lookup.acceptance_lengths) > 4


@pytest.mark.parametrize("max_new_tokens", [2, 5, 9, 14, 23])
def test_eos_and_max_length_inside_lookup_drafts(monkeypatch, max_new_tokens):
    target, prompt = cached_target("qwen3"), copy_prompt(1)
    drafter = make_drafter(target, block_size=8)
    reference = new_tokens(plain_generate(target, prompt, max_new_tokens=40), prompt).tolist()
    eos = next(t for i, t in enumerate(reference) if i >= 3 and t not in reference[:i])
    forced_lookups(monkeypatch)
    for kwargs in (dict(max_new_tokens=max_new_tokens), dict(max_new_tokens=40, eos_token_id=eos)):
        expected = plain_generate(target, prompt, **kwargs)
        got = target.generate(prompt, assistant_model=drafter, dflash_policy="cost", prompt_lookup_num_tokens=10,
                              **kwargs)
        assert got.tolist() == expected.tolist(), kwargs


def test_dflash_lookup_is_checked_and_turns_lookups_off(monkeypatch):
    target, prompt = cached_target("qwen3"), copy_prompt(1)
    drafter = make_drafter(target, block_size=8)
    with pytest.raises(ValueError, match="dflash_lookup='yes'.*True.*False"):
        target.generate(prompt, assistant_model=drafter, max_new_tokens=4, dflash_lookup="yes")
    forced_lookups(monkeypatch)
    target.generate(prompt, assistant_model=drafter, max_new_tokens=30, dflash_policy="cost", dflash_lookup=False)
    assert drafter.last_stats.lookup_cycles == 0


def test_a_probe_accepted_in_full_is_followed_by_a_deeper_one(monkeypatch):
    """A call starts with what earlier calls learned worth 2 verifications (CALL_PRIOR): here a drafter that was
    weak (15% at each depth: drafting loses to plain steps on this CPU-shaped cost curve). When it is now accepted
    in full, each probe is followed at once by one twice as deep, so a drafter that got good drafts within a few
    cycles instead of after a backoff of plain steps (a 2-draft probe accepted in full says little of depth 3+)."""
    costs = {1: 0.010, 2: 0.016, 3: 0.0175, 4: 0.018, 8: 0.02, 16: 0.023}
    policy = policy_with(monkeypatch, costs, draft=0.002, rate=0.15)
    policy.reached, policy.accepted = [2.0] * 15, [0.3] * 15
    chosen, table = [], policy.table(1, "cpu")
    for _ in range(12):  # as generate() feeds it: the cycle's costs, then its acceptance (every draft accepted)
        k = policy.choose(1, "cpu")[0]
        chosen.append(k)
        width = gemm_friendly_rows(k + 1, torch.device("cpu"))
        policy.observe_costs(1, "cpu", width, table.verify_seconds(width), 0.002 if k else None)
        policy.observe_acceptance(k, [k])
    assert chosen[:5] == [0, 0, 0, 2, 4] and min(chosen[5:]) >= 5, chosen


def test_few_counts_are_bet_on_with_doubt(monkeypatch):
    """Acceptance rates estimated from a handful of verifications (a call's start: earlier calls count as 2) are bet
    on only after lowering them by their doubt: where the estimate says drafting pays by a little and its doubt says
    it may not, the policy steps plainly and probes every other cycle until more counts settle it (the real GSM8K
    bench drafted 3 cycles after one lucky probe and lost 10%); the same rates backed by many counts draft."""
    costs = {2: 0.016, 3: 0.0175, 4: 0.018, 8: 0.02, 16: 0.023, 1: 0.010}  # t(1) measured last: fresh
    for counts, expected in ((3.0, [0, 5, 0, 5]), (200.0, [5, 5, 5, 5])):
        policy = policy_with(monkeypatch, costs, draft=0.002, rate=0.6)
        policy.reached, policy.accepted = [counts] * 15, [0.6 * counts] * 15
        assert [policy.choose(1, "cpu")[0] for _ in range(4)] == expected, counts


# ----------------------------------------------------------------------------------------------------------------------
# the seam: the loop and the tree talk to a policy through DraftPolicy only; the generator only proposes
PROTOCOL = ("most", "choose", "observe_offers", "observe_drafter_offer", "observe_costs", "observe_acceptance",
            "tree_budget", "observe_tree")


class ProtocolOnly:
    """A policy seen through the DraftPolicy protocol only: reading anything else of it fails the call."""

    def __init__(self, policy, calls: collections.Counter):
        object.__setattr__(self, "_policy", policy)
        object.__setattr__(self, "_calls", calls)

    def __getattr__(self, name):
        if name not in PROTOCOL:
            raise AttributeError(f"{name!r} was read from the draft policy, which DraftPolicy does not offer")
        self._calls[name] += 1
        return getattr(self._policy, name)


def test_every_policy_offers_the_whole_protocol():
    assert set(PROTOCOL) == {n for n in vars(DraftPolicy) if not n.startswith("_")} | {"most"}
    for policy in (FullBlocks(7), HeuristicSchedule(start=3, most=7), CostAwarePolicy(None, 7)):
        assert all(callable(getattr(policy, n)) for n in PROTOCOL if n != "most") and policy.most == 7


@pytest.mark.parametrize("settings", [
    dict(dflash_policy="cost", prompt_lookup_num_tokens=6),
    dict(dflash_policy="full"),
    dict(num_assistant_tokens=2, num_assistant_tokens_schedule="heuristic"),
    dict(dflash_policy="cost", dflash_tree_budget=6),
    dict(dflash_policy="full", dflash_tree_budget=6, prompt_lookup_num_tokens=3),
], ids=["cost", "full", "heuristic", "cost-tree", "full-tree"])
def test_the_loop_and_the_tree_ask_the_policy_through_the_protocol_only(settings, monkeypatch):
    calls = collections.Counter()
    real = generation_dflash.draft_policy
    monkeypatch.setattr(generation_dflash, "draft_policy",
                        lambda *args, **kwargs: ProtocolOnly(real(*args, **kwargs), calls))
    target = cached_target("qwen3")
    assert_lossless(target, make_drafter(target, block_size=6), copy_prompt(3), max_new_tokens=24,
                    assisted=settings)
    assert calls["choose"] > 0 and calls["observe_costs"] > 0
    assert calls["tree_budget" if "dflash_tree_budget" in settings else "observe_acceptance"] > 0
    if settings.get("dflash_policy") == "cost" and "dflash_tree_budget" not in settings:
        assert calls["observe_offers"] == calls["choose"]  # every cycle's offer is scored


def test_heuristic_schedule_follows_transformers_rule():
    schedule = HeuristicSchedule(start=4, most=7)
    for num_drafts, accepted in [(4, [4]), (6, [6, 6]), (7, [7]), (7, [3]), (6, [6, 5]), (0, [0])]:
        schedule.observe_acceptance(num_drafts, accepted)
    assert schedule.choose(1, "cpu") == Draft(5)  # 4 -> 6 -> 7 (capped) -> 7 -> 6 -> 5; a plain step counts nothing


def test_lookup_settings_are_read_from_the_call_options_only():
    """Token count, n-gram size and the room under max_length come from DFlashCallOptions, resolved once."""
    target = cached_target("qwen3")
    config = GenerationConfig(prompt_lookup_num_tokens=9, max_matching_ngram_size=1, max_length=100)
    options = DFlashCallOptions(lookup_tokens=3, lookup_ngram=2)
    generator = DFlashCandidateGenerator(make_drafter(target), target, config, options=options)
    history = torch.tensor([5, 6, 7, 8, 9, 1, 5, 6])
    assert generator.lookup_offer([history]) == ([7, 8, 9], 2)
    generator.options = dataclasses.replace(options, max_length=len(history) + 2)
    assert generator.lookup_offer([history]) == ([7], 2)  # one draft fits, then the target's own token
    assert generator.lookup_offer([history, history]) is None  # batches draft from the drafter only
    assert DFlashCandidateGenerator(make_drafter(target), target, config,
                                    options=DFlashCallOptions(lookup_tokens=None)).lookup_offer([history]) is None


def test_lookup_proposals_carry_no_vocabulary_wide_scores():
    target = cached_target("qwen3")
    generator = DFlashCandidateGenerator(make_drafter(target), target, GenerationConfig())
    candidates, scores = generator.get_candidates(torch.tensor([[4]]), draft=Draft(2, from_lookup=True),
                                                  lookup=[7, 8, 9], histories=[torch.tensor([1, 4])])
    assert candidates.tolist() == [[4, 7, 8]] and scores is None


def test_num_assistant_tokens_caps_the_cost_aware_policy_which_still_steps_plainly(monkeypatch):
    """With dflash_policy="cost" and num_assistant_tokens=3, the policy's own most is 3: it measures, drafts at most 3
    and, for a drafter whose drafts fail, steps plainly (a cap below the block once kept it asking for full blocks,
    which the cap cut to 3, forever)."""
    target = cached_target("qwen3")
    table = CostTable()
    for _ in range(CostTable.WINDOW):
        for width, seconds in {1: 0.010, 2: 0.0145, 4: 0.016}.items():
            table.observe_verify(width, seconds)
        table.observe_draft(0.006)
    install_cost_table(monkeypatch, target, table)
    monkeypatch.setattr(CostAwarePolicy, "observe_costs", lambda self, *args, **kwargs: None)
    prompt, drafter = make_prompt(10, seed=5), make_drafter(target, block_size=8)
    got = target.generate(prompt, assistant_model=drafter, max_new_tokens=30, do_sample=False,
                          dflash_policy="cost", num_assistant_tokens=3, dflash_lookup=False)
    assert got.tolist() == plain_generate(target, prompt, max_new_tokens=30).tolist()
    counts = drafter.last_stats.drafts_per_cycle
    assert counts[0] == 3 and max(counts) <= 3 and counts.count(0) > len(counts) // 2, counts
