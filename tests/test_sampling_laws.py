# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""Speculative sampling end to end where it really drafts: each row's exact law, checked by chi-square.

Every test samples ``generate(do_sample=True, assistant_model=drafter)`` many times over a vocabulary of 8 and compares
the first ``NEW`` new tokens with the exact law of plain sampling (every history enumerated, one batched forward per
depth, processed by generate's own logits processors) with a battery of chi-square tests: the joint of all ``NEW``
tokens, each position's marginal and each adjacent pair, Bonferroni-corrected to ``P_THRESHOLD`` overall. The
settings make the loop draft for real, and each test asserts it from ``drafter.last_stats``: several cycles, cycles
that verify and accept 2+ drafts, rejections, rows of one batch with different acceptances. Negative controls plant
a wrong sampler (``speculative_accept`` replaced) and the same battery must reject it.

Replicated rows: a batch carries each prompt in many rows (left-padded to the longest), so one ``generate`` call gives
many independent samples per prompt. Batch-1 tests take one call per sample.
"""

import collections
import contextlib
import random

import pytest
import torch
from conftest import P_THRESHOLD, cached_target, chi_square_pvalue, left_padded

import hf_dflash
from hf_dflash.candidates_dflash import DFlashCandidateGenerator
from hf_dflash.policy_dflash import CostAwarePolicy, Draft
from hf_dflash import sampling_dflash

VOCAB = 8
NEW = 5  # new tokens checked: the prefill's token, then cycles of up to 3 drafts with block 4 (several cycles)
PAD = 0
PROMPTS = (torch.tensor([[1, 2, 3]]), torch.tensor([[5, 4, 6, 7, 1, 2]]), torch.tensor([[6]]))
# one length (no padding), few distinct tokens: a repetition penalty then acts on most drafts
REPEAT_PROMPTS = (torch.tensor([[1, 1, 1]]), torch.tensor([[5, 5, 5]]), torch.tensor([[6, 6, 2]]))


def law_target(num_hidden_layers: int = 1):
    # initializer_range 0.15: next-token distributions clearly non-uniform (max prob ~0.25-0.6), not peaked
    return cached_target("qwen3", vocab_size=VOCAB, hidden_size=32, num_hidden_layers=num_hidden_layers,
                         num_attention_heads=2, num_key_value_heads=1, initializer_range=0.15, seed=0)


def law_drafter(target, block_size: int = 4, seed: int = 3, **switches):
    torch.manual_seed(seed)
    drafter = hf_dflash.DFlashDraftModel.from_target(target, num_hidden_layers=switches.pop("num_hidden_layers", 1),
                                                     block_size=block_size, **switches).eval()
    return drafter.requires_grad_(False)


# ----------------------------------------------------------------------------------------------------------------------
# the exact law and the battery
def exact_law(target, prompt, num_tokens: int = NEW, **kwargs) -> dict[tuple, float]:
    """P(t1..tn) of plain ``generate(do_sample=True, **kwargs)``: every history of nonzero probability is extended by
    one batched generate step, whose processed scores (``output_scores``) are the law of the next token."""
    histories, mass = prompt, torch.ones(1, dtype=torch.float64)
    for _ in range(num_tokens):
        out = target.generate(histories, attention_mask=torch.ones_like(histories), max_new_tokens=1, do_sample=True,
                              return_dict_in_generate=True, output_scores=True, pad_token_id=PAD, **kwargs)
        joint = mass[:, None] * out.scores[0].double().softmax(-1)
        rows, tokens = torch.nonzero(joint > 0, as_tuple=True)
        histories, mass = torch.cat([histories[rows], tokens[:, None]], dim=1), joint[rows, tokens]
    return dict(zip(map(tuple, histories[:, prompt.shape[1]:].tolist()), mass.tolist()))


def pvalue(counts: dict, probs: dict) -> float:
    """chi-square p-value; 0 when a sample lies where the law puts no mass, 1 (no test) when the law is too spread
    for two cells to expect 5 samples each."""
    if any(probs.get(cell, 0.0) <= 0.0 for cell in counts):
        return 0.0
    n = sum(counts.values())
    if sum(n * p >= 5 for p in probs.values()) < 2:
        return 1.0
    return chi_square_pvalue(counts, probs)


def law_pvalues(counts: dict, law: dict) -> dict[str, float]:
    """The battery: joint, every marginal, every adjacent pair."""
    length = len(next(iter(law)))

    def project(positions):
        sub_counts, sub_law = collections.Counter(), collections.defaultdict(float)
        for cell, count in counts.items():
            sub_counts[tuple(cell[i] for i in positions)] += count
        for cell, p in law.items():
            sub_law[tuple(cell[i] for i in positions)] += p
        return pvalue(sub_counts, sub_law)

    checks = {"joint": pvalue(counts, law)}
    checks.update({f"t{i + 1}": project((i,)) for i in range(length)})
    checks.update({f"t{i + 1}t{i + 2}": project((i, i + 1)) for i in range(length - 1)})
    return checks


def rejected(counts: dict, law: dict) -> tuple[bool, str]:
    checks = law_pvalues(counts, law)
    worst = min(checks, key=checks.get)
    return checks[worst] < P_THRESHOLD / len(checks), f"{worst}: p = {checks[worst]:.2e} (n = {sum(counts.values())})"


def assert_follows(counts: dict, law: dict, what: str = "") -> None:
    bad, detail = rejected(counts, law)
    assert not bad, f"{what} does not follow the target's law: {detail}"


# ----------------------------------------------------------------------------------------------------------------------
# sampling
@contextlib.contextmanager
def proposals_by_row(target, prompts, kind, temperature: float = 1.0):
    """Each row drafts as ``kind(prompt_index, history_length)`` says: "own" keeps the drafter's samples and scores;
    "oracle" samples from the target's own law given the row's history (softmax(logits / temperature): q = p, every
    draft accepted); "worst" proposes the target's least likely token (a point mass q, nearly always rejected). Any
    such mix is a valid proposal, so every row must still follow the target's law."""
    original = DFlashCandidateGenerator.propose
    padded, _ = left_padded(list(prompts))
    width = padded.shape[1]

    def propose(self, histories, *args, **kwargs):
        drafts, scores = original(self, histories, *args, **kwargs)
        k = drafts.shape[1]
        picked = []
        for r, history in enumerate(histories):
            index = next(i for i in range(len(prompts)) if torch.equal(history[:width], padded[i]))
            how = kind(index, len(history))
            if k and how != "own":
                picked.append((r, history[width - prompts[index].shape[1]:], how))
        if not picked:
            return drafts, scores
        ids, mask = left_padded([h[None] for _, h, _ in picked])
        drafts, scores = drafts.clone(), scores.clone()
        for j in range(k):
            positions = (mask.cumsum(-1) - 1).clamp_min(0)
            logits = target(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False).logits[:, -1]
            law = (logits.float() / temperature).log_softmax(-1)
            for i, (r, _, how) in enumerate(picked):
                if how == "oracle":
                    drafts[r, j], scores[r, j] = torch.multinomial(law[i].exp(), 1)[0], law[i]
                else:
                    drafts[r, j] = logits[i].argmin()
                    scores[r, j] = torch.full_like(law[i], float("-inf")).index_fill(0, drafts[r, j : j + 1], 0.0)
            ids = torch.cat([ids, drafts[[r for r, _, _ in picked], j : j + 1]], dim=1)
            mask = torch.cat([mask, mask.new_ones(len(picked), 1)], dim=1)
        return drafts, scores

    DFlashCandidateGenerator.propose = propose
    try:
        yield
    finally:
        DFlashCandidateGenerator.propose = original


def sample_replicated(target, drafter, prompts, replicas: int, calls: int, seed: int, max_new_tokens: int = NEW,
                      **kwargs):
    """`calls` generate calls on a batch holding each prompt `replicas` times (interleaved, left-padded): per prompt,
    a Counter of its first NEW new tokens; and every call's ``last_stats``."""
    rows = [prompts[r % len(prompts)] for r in range(replicas * len(prompts))]
    ids, mask = left_padded(rows)
    mask = None if bool(mask.all()) else mask
    counts, stats = [collections.Counter() for _ in prompts], []
    torch.manual_seed(seed)
    for _ in range(calls):
        out = target.generate(ids, attention_mask=mask, assistant_model=drafter, max_new_tokens=max_new_tokens,
                              do_sample=True, pad_token_id=PAD, **kwargs)
        assert out.shape == (len(rows), ids.shape[1] + max_new_tokens)
        for r, tokens in enumerate(out[:, ids.shape[1]:].tolist()):
            counts[r % len(prompts)][tuple(tokens[:NEW])] += 1
        stats.append(drafter.last_stats)
    return counts, stats


def sample_one(target, drafter, prompt, calls: int, seed: int, max_new_tokens: int = NEW, **kwargs):
    """`calls` batch-1 generate calls: a Counter of the first NEW new tokens, and every call's ``last_stats``."""
    counts, stats = collections.Counter(), []
    torch.manual_seed(seed)
    for _ in range(calls):
        out = target.generate(prompt, assistant_model=drafter, max_new_tokens=max_new_tokens, do_sample=True, **kwargs)
        counts[tuple(out[0, prompt.shape[1]:].tolist()[:NEW])] += 1
        stats.append(drafter.last_stats)
    return counts, stats


def all_lengths(stats) -> list[int]:
    return [a for s in stats for a in s.acceptance_lengths]


def assert_really_drafts(stats, block_size: int) -> None:
    """Several cycles per call, chains (2+ drafts accepted in one cycle: acceptance length >= 3) and rejections."""
    lengths = all_lengths(stats)
    assert max(lengths) <= block_size
    assert sum(a >= 3 for a in lengths) >= 0.05 * len(lengths), collections.Counter(lengths)
    assert sum(a == 1 for a in lengths) >= 0.05 * len(lengths), collections.Counter(lengths)
    assert max(len(rows) for s in stats for rows in s.row_acceptance_lengths) >= 3  # 3+ cycles for some row


# ----------------------------------------------------------------------------------------------------------------------
# wrong samplers the battery must reject (negative controls), each a replacement of speculative_accept
def _row_zero_target(accept):
    """Every row's drafts judged, and its tokens drawn, by row 0's target distribution."""
    return lambda drafts, q, p: accept(drafts, q, p[:1].expand_as(p))


def _always_accept(accept):
    """Every draft accepted; the bonus token drawn from p after the last draft."""

    def wrong(drafts, q, p):
        batch, k = drafts.shape
        bonus = torch.multinomial(p[:, k], 1)
        return torch.full((batch,), k, dtype=torch.long), torch.cat([drafts, bonus], dim=1)

    return wrong


def _resample_from_p(accept):
    """The right acceptances, but a rejected position resampled from p instead of norm(max(0, p - q))."""

    def wrong(drafts, q, p):
        accepted, tokens = accept(drafts, q, p)
        at = p.gather(1, accepted[:, None, None].expand(-1, 1, p.shape[-1]))[:, 0]
        return accepted, tokens.clone().scatter_(1, accepted[:, None], torch.multinomial(at, 1))

    return wrong


WRONG_SAMPLERS = {"row_zero_target": _row_zero_target, "always_accept": _always_accept,
                  "resample_from_p": _resample_from_p}


def plant(monkeypatch, name: str) -> None:
    import hf_dflash.sampling_dflash as sampling

    monkeypatch.setattr(sampling, "speculative_accept", WRONG_SAMPLERS[name](sampling.speculative_accept))


# ----------------------------------------------------------------------------------------------------------------------
# batched sampling
BATCH_SETTINGS = dict(temperature=0.7)


def mixed_proposals(index: int, history_length: int) -> str:
    """Prompt 0: the oracle; prompt 1: the drafter's own samples; prompt 2: the worst proposal or its own, by
    history length."""
    return "oracle" if index == 0 else "worst" if index == 2 and history_length % 2 else "own"


def batched_samples(calls: int, seed: int = 0):
    target = law_target()
    drafter = law_drafter(target)
    with proposals_by_row(target, PROMPTS, mixed_proposals, BATCH_SETTINGS["temperature"]):
        return sample_replicated(target, drafter, PROMPTS, replicas=16, calls=calls, seed=seed, **BATCH_SETTINGS)


@pytest.fixture(scope="module")
def batch_laws():
    return [exact_law(law_target(), prompt, **BATCH_SETTINGS) for prompt in PROMPTS]


def test_batched_rows_with_different_acceptances_follow_their_own_laws(batch_laws):
    """48 rows of 3 left-padded prompts, 3 drafts per cycle, oracle and drafter rows side by side: each prompt's
    samples follow its own law, across several cycles and chains of accepted drafts."""
    counts, stats = batched_samples(calls=60)
    assert_really_drafts(stats, block_size=4)
    # rows of one cycle accept different counts, and the oracle rows systematically more than the drafter rows
    assert any(len({rows[0] for rows in s.row_acceptance_lengths}) >= 3 for s in stats)
    per_prompt = [[a for s in stats for rows in s.row_acceptance_lengths[r::3] for a in rows] for r in range(3)]
    mean = [sum(a) / len(a) for a in per_prompt]
    assert mean[0] > 3.5 and mean[0] > mean[1] > mean[2] + 0.3, mean
    for index, prompt in enumerate(PROMPTS):
        assert_follows(counts[index], batch_laws[index], f"prompt {index} ({prompt.tolist()})")


@pytest.mark.parametrize("wrong", sorted(WRONG_SAMPLERS))
def test_batched_battery_rejects_a_wrong_sampler(batch_laws, monkeypatch, wrong):
    plant(monkeypatch, wrong)
    counts, _ = batched_samples(calls=30)
    verdicts = [rejected(counts[i], batch_laws[i]) for i in range(len(PROMPTS))]
    assert any(bad for bad, _ in verdicts), verdicts



# ----------------------------------------------------------------------------------------------------------------------
# batch 1: chains of drafts, the heuristic draft length
def test_chains_of_drafts_follow_the_law_at_batch_one():
    """One prompt, the drafter's own samples, 3 drafts per cycle: chains of accepted drafts, rejections mid-chain."""
    target, prompt = law_target(), PROMPTS[1]
    counts, stats = sample_one(target, law_drafter(target), prompt, calls=700, seed=1)
    assert_really_drafts(stats, block_size=4)
    assert_follows(counts, exact_law(target, prompt), "batch-1 chains")


def test_batch_one_battery_rejects_a_wrong_residual(monkeypatch):
    target, prompt = law_target(), PROMPTS[1]
    law = exact_law(target, prompt)
    plant(monkeypatch, "resample_from_p")
    counts, _ = sample_one(target, law_drafter(target), prompt, calls=400, seed=1)
    bad, detail = rejected(counts, law)
    assert bad, detail


# prompt-lookup drafts (the cost-aware policy's other source): a point-mass proposal of tokens copied from the text
REPEATING_PROMPT = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 1, 2, 3, 4, 5, 6, 7]])  # every token has a continuation


def sample_with_lookups(monkeypatch, calls: int, seed: int):
    """Batch-1 samples where every cycle with a lookup continuation on offer verifies it (the drafter otherwise)."""
    def choose(self, batch, device, lookup_length=0, lookup_size=0, context=0):
        return Draft(lookup_length, True) if lookup_length else Draft(self.most)

    monkeypatch.setattr(CostAwarePolicy, "choose", choose)
    target = law_target()
    return sample_one(target, law_drafter(target), REPEATING_PROMPT, calls=calls, seed=seed, dflash_policy="cost",
                      prompt_lookup_num_tokens=3, max_matching_ngram_size=1)


def test_lookup_drafts_follow_the_law_at_batch_one(monkeypatch):
    counts, stats = sample_with_lookups(monkeypatch, calls=500, seed=6)
    assert sum(s.lookup_cycles for s in stats) >= 2 * len(stats)  # most cycles verify lookup drafts
    lengths = collections.Counter(all_lengths(stats))
    assert lengths[1] > 0 and sum(n for a, n in lengths.items() if a >= 3) > 0, lengths  # rejections and chains
    assert_follows(counts, exact_law(law_target(), REPEATING_PROMPT), "prompt-lookup drafts")


def test_lookup_battery_rejects_a_wrong_proposal_law(monkeypatch):
    """Lookup drafts judged as if drawn from a uniform q (instead of the point mass they are) must be caught."""
    law = exact_law(law_target(), REPEATING_PROMPT)
    monkeypatch.setattr(sampling_dflash, "point_mass_accept", lambda drafts, target_probs: sampling_dflash.
                        speculative_accept(drafts, torch.full_like(target_probs[:, :-1], 1.0 / VOCAB), target_probs))
    counts, _ = sample_with_lookups(monkeypatch, calls=400, seed=6)
    bad, detail = rejected(counts, law)
    assert bad, detail


def test_a_draft_vocabulary_follows_the_law_at_batch_one():
    """Drafts from half the vocabulary only (q = 0 on the rest): the target's other tokens come from the residual."""
    target, prompt = law_target(), PROMPTS[1]
    drafter = law_drafter(target)
    drafter.set_draft_vocabulary([1, 3, 5, 7])
    counts, stats = sample_one(target, drafter, prompt, calls=600, seed=7)
    assert_really_drafts(stats, block_size=4)
    assert any(t % 2 == 0 for cell in counts for t in cell)  # tokens the drafter cannot propose still come
    assert_follows(counts, exact_law(target, prompt), "a draft vocabulary")


def test_heuristic_draft_length_grows_and_follows_the_law():
    """num_assistant_tokens=1 with the heuristic schedule: the first cycle verifies one draft, fully accepted cycles
    grow the count (+2), so later cycles accept 3 and 4 drafts (acceptance lengths 4 and 5); rejections shrink it."""
    target, prompt = law_target(), PROMPTS[0]
    drafter = law_drafter(target, block_size=8)
    settings = dict(num_assistant_tokens=1, num_assistant_tokens_schedule="heuristic")
    choice = random.Random(0)  # per cycle: the oracle (always accepted) or the drafter's own samples
    with proposals_by_row(target, [prompt], lambda index, length: "oracle" if choice.random() < 0.75 else "own"):
        counts, stats = sample_one(target, drafter, prompt, calls=400, seed=2, max_new_tokens=12, **settings)
    assert all(s.acceptance_lengths[0] <= 2 for s in stats)  # the count starts at 1
    assert sum(max(s.acceptance_lengths) >= 4 for s in stats) >= 0.5 * len(stats)  # grown to 3+ drafts
    assert sum(max(s.acceptance_lengths) >= 5 for s in stats) >= 0.3 * len(stats)  # and again
    assert sum(1 in s.acceptance_lengths[1:] for s in stats) >= 0.1 * len(stats)  # rejections after the start
    assert_follows(counts, exact_law(target, prompt), "heuristic draft length")


# ----------------------------------------------------------------------------------------------------------------------
# DFlare drafters and every warper README lists
def test_dflare_drafter_sampling_follows_each_rows_law():
    target = law_target(num_hidden_layers=4)
    drafter = law_drafter(target, num_hidden_layers=2, layer_fusion=True, split_context_kv=True)
    assert drafter.config.is_dflare
    settings = dict(temperature=0.6, top_p=0.9)
    counts, stats = sample_replicated(target, drafter, PROMPTS, replicas=16, calls=40, seed=3, **settings)
    assert_really_drafts(stats, block_size=4)
    for index, prompt in enumerate(PROMPTS):
        assert_follows(counts[index], exact_law(target, prompt, **settings), f"DFlare, prompt {index}")


WARPERS = {
    "temperature": dict(temperature=0.6),
    "top_k": dict(top_k=3),
    "top_p": dict(top_p=0.7),
    "min_p": dict(min_p=0.2),
    "typical_p": dict(typical_p=0.5),
    "epsilon_cutoff": dict(epsilon_cutoff=0.1),
    "eta_cutoff": dict(eta_cutoff=0.2),
    "repetition_penalty": dict(repetition_penalty=3.0),
    "repetition_penalty_below_one": dict(repetition_penalty=0.5),
}


def total_variation(a: dict, b: dict) -> float:
    return 0.5 * sum(abs(a.get(cell, 0.0) - b.get(cell, 0.0)) for cell in set(a) | set(b))


@pytest.mark.parametrize("warper", sorted(WARPERS))
def test_every_warper_with_a_drafter_follows_each_rows_law(warper):
    """The drafter samples its drafts from its own warped distribution (q) and the target judges them by its warped
    one (p), across cycles of 3 drafts; each warper really changes the law (total variation > 0.05)."""
    target, settings = law_target(), WARPERS[warper]
    # repetition penalty: prompts of one length and no attention mask (with a mask, batches raise: see
    # test_batch.py::test_batched_repetition_penalty_with_an_attention_mask)
    prompts = REPEAT_PROMPTS if warper.startswith("repetition") else PROMPTS
    counts, stats = sample_replicated(target, law_drafter(target), prompts, replicas=16, calls=30, seed=4,
                                      **settings)
    assert max(all_lengths(stats)) == 4 and min(all_lengths(stats)) == 1
    for index, prompt in enumerate(prompts):
        law = exact_law(target, prompt, **settings)
        if index == 0:
            assert total_variation(law, exact_law(target, prompt)) > 0.05, "the warper changes nothing here"
        assert_follows(counts[index], law, f"{warper}, prompt {index}")
