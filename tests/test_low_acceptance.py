"""Zero acceptance is never silent: when a drafter's drafts are almost never accepted by a target, over
enough verified first drafts to be sure (the default policy's probes included, prompt-lookup drafts not), one warning
per (drafter, target) pair names the measured rate and the likely causes, most specific first, and
``drafter.last_stats.low_acceptance`` carries it. A drafter trained for its target never warns. Each cause is
planted on tiny models and the warning is shown to name it."""

import logging
import math
import re

import pytest
import torch
from conftest import drafts_for, every_policy_path, make_drafter, make_prompt, make_target, plain_generate
from conftest import recorded_drafts

from hf_dflash import DFlashDraftModel
from hf_dflash.diagnostics_dflash import low_acceptance_causes
from hf_dflash.stats_dflash import ALMOST_NEVER, AcceptanceEvidence

NEW_TOKENS = 48  # a full-block call of an untrained drafter verifies ~46 first drafts: two calls are enough (>= 57)


def tiny_target(**overrides):
    return make_target("qwen3", num_hidden_layers=6, **overrides)


def warnings_logged(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith("hf_dflash") and r.levelno == logging.WARNING]


def findings(target, drafter, calls: int = 2, **kwargs) -> list[str | None]:
    """``last_stats.low_acceptance`` after each of `calls` greedy calls (other prompts each time)."""
    found = []
    for seed in range(calls):
        target.generate(make_prompt(12, seed=seed), assistant_model=drafter, max_new_tokens=NEW_TOKENS,
                        do_sample=False, **kwargs)
        found.append(drafter.last_stats.low_acceptance)
    return found


def test_an_untrained_drafter_is_reported_once_per_pair_with_its_rate(caplog):
    target, drafter = tiny_target(), make_drafter(tiny_target())
    with caplog.at_level(logging.WARNING, logger="hf_dflash"):
        first, second, third = findings(target, drafter, calls=3)
        assert first is None  # ~46 first drafts: not enough to be sure yet
        assert second is not None and third == second and warnings_logged(caplog) == [second]
        verified = drafter.last_stats.drafted_verifications
        assert re.search(r"\d of \d\d first drafts \(\d\.\d%\) over 2 generate\(\) call\(s\)", second), second
        assert "None of the checks found a cause" in second and "drop assistant_model" in second
        other = tiny_target()  # another pair: its own evidence, its own warning
        assert findings(other, drafter)[1] is not None and len(warnings_logged(caplog)) == 2
    assert verified > 40


def test_the_rule_needs_both_a_low_rate_and_enough_drafts_to_be_sure():
    def warns(accepted: int, verified: int) -> bool:
        return AcceptanceEvidence(verified=verified, accepted=accepted).almost_never_accepted()

    assert not warns(0, 56) and warns(0, 57) and not warns(1, 72) and warns(1, 73)
    # a drafter accepting more than ALMOST_NEVER of its first drafts is never reported, however long it runs
    assert not any(warns(math.floor(ALMOST_NEVER * n) + 1, n) for n in range(1, 5000, 7))
    assert warns(50, 2000)  # 2.5% of many is almost never


def test_a_weak_but_trained_drafter_never_warns(caplog):
    """A scripted drafter whose first draft is right ~25% of the time (the shipped SmolLM2 drafter: ~37%; 17% on
    its hardest prompt measured) over some 200 verified blocks."""
    target, drafter = tiny_target(), make_drafter(tiny_target())
    with caplog.at_level(logging.WARNING, logger="hf_dflash"):
        verified = accepted = 0
        for seed in range(6):
            prompt = make_prompt(12, seed=seed)
            with drafts_for("noisy", plain_generate(target, prompt, max_new_tokens=NEW_TOKENS), prompt, seed,
                            corrupt=0.75):
                target.generate(prompt, assistant_model=drafter, max_new_tokens=NEW_TOKENS, do_sample=False)
            assert drafter.last_stats.low_acceptance is None
            verified += drafter.last_stats.drafted_verifications
            accepted += drafter.last_stats.first_drafts_accepted
    assert warnings_logged(caplog) == [] and verified > 150 and 0.1 < accepted / verified < 0.4


@pytest.mark.slow
def test_the_shipped_drafter_never_warns_on_smollm2(caplog):
    from hf_dflash.models import load_drafter, load_target

    target, tokenizer = load_target("smollm2", dtype="float32", device="cpu")
    drafter = load_drafter(None, target)
    with caplog.at_level(logging.WARNING, logger="hf_dflash"):
        for question in ("What is the capital of France? Explain briefly.", "Count from 1 to 20.",
                         "Write a Python function that reverses a string."):
            ids = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                                return_tensors="pt", return_dict=True)["input_ids"]
            target.generate(ids, assistant_model=drafter, max_new_tokens=64, do_sample=False, dflash_policy="full")
            assert drafter.last_stats.low_acceptance is None and drafter.last_stats.first_draft_acceptance > 0.1
    assert warnings_logged(caplog) == []


def test_the_default_policys_probes_count_and_prompt_lookups_do_not():
    """Every drafter proposal is one first draft judged, verified or (a greedy call's probe) scored: under the default
    policy a drafter whose drafts do not pay gets only probes, and a broken one must still be noticed."""
    target, drafter = tiny_target(), make_drafter(tiny_target())
    prompt = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12] * 3])  # text that repeats: prompt lookup is on offer
    with recorded_drafts() as proposals, every_policy_path() as choices:
        target.generate(prompt, assistant_model=drafter, max_new_tokens=96, do_sample=False, dflash_policy="cost")
    stats = drafter.last_stats
    assert stats.lookup_cycles > 0 and 0 < len(proposals) < len(stats.acceptance_lengths)
    assert any(choice.scored_only for choice in choices)
    assert stats.drafted_verifications == len(proposals)  # each drafter proposal is one first draft judged


def saved_and_loaded(drafter, folder, **kwargs):
    """`drafter` saved in `folder` and loaded from there (which must outlive it: the saved dtype is read there)."""
    drafter.save_pretrained(folder)
    return DFlashDraftModel.from_pretrained(folder, **kwargs).eval()


def named_target():
    target = tiny_target()
    target.name_or_path = "tiny-org/tiny-qwen3"  # as from_pretrained("tiny-org/tiny-qwen3") sets it
    return target


def another_tokenizer():
    target = tiny_target(eos_token_id=3)
    drafter = make_drafter(target)
    drafter.config.eos_token_id = 7
    return target, drafter


def with_layer_ids(ids: list[int]):
    target = tiny_target()  # 6 layers: the usual ids for 2 features are [1, 3]
    return target, make_drafter(target, target_layer_ids=ids)


def head_of_another_target():
    target = tiny_target()
    drafter = make_drafter(target)
    drafter.set_draft_vocabulary(list(range(0, 96, 3)), lm_head=tiny_target(seed=5).get_output_embeddings())
    return target, drafter


def cast_to_bfloat16(folder):
    target = tiny_target().to(torch.bfloat16)
    return target, saved_and_loaded(make_drafter(tiny_target()), folder).to(torch.bfloat16)


def quantized():
    target = tiny_target()
    with pytest.warns(Warning):  # torch.ao's deprecation
        drafter = torch.ao.quantization.quantize_dynamic(make_drafter(target), {torch.nn.Linear}, dtype=torch.qint8)
    return target, drafter


def zero_mask_row():
    target = tiny_target()
    drafter = make_drafter(target)
    with torch.no_grad():
        target.get_input_embeddings().weight[drafter.config.mask_token_id] = 0.0
    return target, drafter


def mask_outside_the_vocabulary():
    target = tiny_target()
    target.config.vocab_size = 90  # an embedding table padded past the vocabulary (as Qwen3's is)
    return target, make_drafter(target)  # its mask: the last row, 95


# Each planted cause: (target, drafter) with it, and what the warning must say
CAUSES = {
    "trained-for-another-target": (
        lambda: (named_target(), make_drafter(tiny_target(), target_hub_id="tiny-org/other-model")),
        "trained for target_name_or_path='tiny-org/other-model', this target is 'tiny-org/tiny-qwen3'"),
    "another-tokenizer": (another_tokenizer, "eos_token_id=7 but the target's is 3"),
    "layer-ids-shifted-by-one": (lambda: with_layer_ids([2, 4]),
                                 "target_layer_ids=[2, 4] look shifted by +1 from the usual [1, 3]"),
    "last-layer": (lambda: with_layer_ids([1, 5]), "read the target's last layer 5"),
    "draft-head-of-another-target": (head_of_another_target, "head rows are not the target's LM head rows"),
    "bfloat16-cast": (cast_to_bfloat16, "runs in bfloat16 but was saved in float32"),
    "quantized": (quantized, "the drafter is quantized"),
    "mask-row-all-zeros": (zero_mask_row, "embedding row for mask_token_id=95 is all zeros"),
    "mask-outside-the-vocabulary": (mask_outside_the_vocabulary,
                                    "mask_token_id=95 is outside the target's vocabulary (vocab_size=90)"),
}


@pytest.mark.parametrize("cause", CAUSES)
def test_the_warning_names_each_planted_cause(caplog, tmp_path, cause):
    build, expected = CAUSES[cause]
    target, drafter = build(tmp_path) if build is cast_to_bfloat16 else build()
    with caplog.at_level(logging.WARNING, logger="hf_dflash"):
        finding = findings(target, drafter, calls=3)[-1]
    logged = warnings_logged(caplog)
    if cause == "quantized":  # also warned about before any work (tests/test_dtypes.py)
        assert "is quantized" in logged.pop(0)
    assert finding is not None and logged == [finding]
    assert expected in finding and "(1) " in finding and "(2) " not in finding, finding  # the one cause planted


def test_causes_are_listed_most_specific_first(tmp_path):
    target = named_target().to(torch.bfloat16)
    drafter = make_drafter(tiny_target(), target_hub_id="tiny-org/other-model")
    drafter = saved_and_loaded(drafter, tmp_path).to(torch.bfloat16)
    causes = low_acceptance_causes(target, drafter)
    assert len(causes) == 2 and "trained for target_name_or_path" in causes[0] and "runs in bfloat16" in causes[1]


def test_mismatches_generate_refuses_are_named_too():
    """Vocabulary, width and layer ids out of range are refused before any forward (check_drafter_matches_target);
    the causes name them all the same, for callers of low_acceptance_causes."""
    target, drafter = tiny_target(), make_drafter(tiny_target())
    drafter.config.vocab_size, drafter.config.hidden_size, drafter.config.target_layer_ids = 100, 32, [1, 6]
    causes = " ".join(low_acceptance_causes(target, drafter))
    for expected in ("vocab_size=100 but the target's is 96", "hidden_size=32 but the target's is 64",
                     "include [6], outside the target's 6 layers"):
        assert expected in causes


def test_a_drafter_made_for_its_target_has_no_cause(tmp_path):
    target = tiny_target()
    target.save_pretrained(tmp_path / "tiny-qwen3")
    local = type(target).from_pretrained(tmp_path / "tiny-qwen3").eval()  # named by its folder
    drafter = make_drafter(local, target_hub_id="tiny-org/tiny-qwen3")
    assert low_acceptance_causes(local, drafter) == []
    assert low_acceptance_causes(local, saved_and_loaded(drafter, tmp_path / "fp32")) == []
    upcast = saved_and_loaded(drafter, tmp_path / "fp64", dtype=torch.float64)  # a cast up loses nothing
    assert upcast.dtype == torch.float64 and low_acceptance_causes(local, upcast) == []
    with_vocabulary = make_drafter(local)
    with_vocabulary.set_draft_vocabulary(list(range(0, 96, 3)), lm_head=local.get_output_embeddings())
    assert low_acceptance_causes(local, with_vocabulary) == []
