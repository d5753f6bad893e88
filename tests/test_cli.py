# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""The command line (hf_dflash.cli): subcommands end to end on tiny models, logging, errors and help."""

import json

import pytest

from hf_dflash import cli
from hf_dflash.evaluation import bench
from hf_dflash.stats_dflash import DFlashStats


def test_bench_command_writes_json_and_markdown(tiny_folder, fake_eval_wheels, tmp_path):
    out = tmp_path / "bench.json"
    code = cli.main([
        "bench", "--target", str(tiny_folder / "target"), "--drafter", str(tiny_folder / "drafter"),
        "--datasets", "humaneval,aime2025", "--limit", "1", "--max-new-tokens", "8",
        "--methods", "plain,pld,dflash", "--json", str(out), "--markdown", str(tmp_path / "bench.md"),
    ])
    assert code == 0
    report = json.loads(out.read_text())
    assert set(report["results"]["humaneval"]) == {"plain", "pld", "dflash"}
    assert report["config"]["datasets"] == {"humaneval": 1, "aime2025": 1}
    assert "| humaneval | hf-dflash, full blocks |" in (tmp_path / "bench.md").read_text()



def test_a_killed_bench_resumes_from_its_progress_file_and_refuses_other_settings(
        tiny_folder, fake_eval_wheels, tmp_path, monkeypatch, capsys):
    """A bench killed after its first prompt keeps that prompt's runs; the same command again runs only the rest and
    writes the whole report (same tokens as an uninterrupted run); other settings are refused before any work."""
    out = tmp_path / "bench.json"
    args = ["bench", "--target", str(tiny_folder / "target"), "--drafter", str(tiny_folder / "drafter"),
            "--datasets", "humaneval,aime2025", "--limit", "1", "--max-new-tokens", "10",
            "--methods", "plain,dflash", "--json", str(out)]
    real, calls = bench.timed_generation, []

    def killed_on_the_second_prompt(target, ids, max_new_tokens, method, *rest):
        calls.append(max_new_tokens)
        if calls.count(10) > 2:  # warm-up runs use 8 tokens; prompts 1 and 2 run 2 methods each
            raise KeyboardInterrupt
        return real(target, ids, max_new_tokens, method, *rest)

    monkeypatch.setattr(bench, "timed_generation", killed_on_the_second_prompt)
    with pytest.raises(KeyboardInterrupt):
        cli.main(args)
    progress = tmp_path / "bench.json.progress.jsonl"
    assert not out.exists() and len(progress.read_text().splitlines()) == 2  # settings + the first prompt
    with open(progress, "a") as f:
        f.write('{"dataset": "aime')  # a line cut short by the kill

    calls.clear()
    monkeypatch.setattr(bench, "timed_generation", lambda *a: (calls.append(a[2]), real(*a))[1])
    assert cli.main(args) == 0
    assert calls.count(10) == 2 and not progress.exists()  # only the second prompt ran, with both methods
    resumed = json.loads(out.read_text())
    assert [p["index"] for p in resumed["per_prompt"]] == [0, 0] and resumed["results"]["overall"]["dflash"]["identical"]
    assert cli.main(args[:-1] + [str(tmp_path / "fresh.json")]) == 0
    fresh = json.loads((tmp_path / "fresh.json").read_text())
    assert [p["dflash"]["new_tokens"] for p in fresh["per_prompt"]] == [p["dflash"]["new_tokens"] for p in resumed["per_prompt"]]

    monkeypatch.setattr(bench, "timed_generation", killed_on_the_second_prompt)
    calls.clear()
    with pytest.raises(KeyboardInterrupt):
        cli.main(args)
    calls.clear()
    assert cli.main(args[:10] + ["11"] + args[11:]) == 2
    assert calls == []  # refused before any generation
    error = capsys.readouterr().err
    assert "max_new_tokens: 10 there, 11 now" in error and "delete it to start over" in error


def test_demo_command_reports_identical_outputs(tiny_folder, capsys):
    code = cli.main([
        "demo", "--target", str(tiny_folder / "target"), "--drafter", str(tiny_folder / "drafter"),
        "--prompt", "Hi", "Why?", "--max-new-tokens", "10",
    ])
    assert code == 0
    out = capsys.readouterr().out
    assert "[2/2] Why?" in out and "outputs identical: yes" in out and "tau" in out
    assert "(1 layer, block" in out  # the tiny drafter's one layer, in words


def test_cli_verbose_reaches_our_loggers():
    import logging

    from hf_dflash.cli import configure_logging

    configure_logging(verbose=True)
    assert logging.getLogger("hf_dflash.training").getEffectiveLevel() == logging.INFO
    configure_logging(verbose=False)
    assert logging.getLogger("hf_dflash.training").getEffectiveLevel() == logging.WARNING


def _bench_batch_sizes(tiny_folder, tmp_path, sizes: str) -> list[str]:
    return ["bench", "--target", str(tiny_folder / "target"), "--drafter", str(tiny_folder / "drafter"),
            "--datasets", "humaneval,gsm8k,mtbench", "--limit", "2", "--max-new-tokens", "8", "--batch-sizes", sizes,
            "--json", str(tmp_path / "batch.json"), "--markdown", str(tmp_path / "batch.md")]


def test_bench_batch_sizes_command(tiny_folder, fake_eval_wheels, tmp_path, capsys):
    """`hf-dflash bench --batch-sizes 1,3`: plain vs DFlash throughput per batch size, outputs checked identical."""
    assert cli.main(_bench_batch_sizes(tiny_folder, tmp_path, "1,3")) == 0
    rows = json.loads((tmp_path / "batch.json").read_text())
    assert [r["batch_size"] for r in rows] == [1, 3]
    for row in rows:
        assert row["identical"] is True and row["new_tokens"] == 8 * row["batch_size"]
        assert row["plain_tokens_per_s"] > 0 and row["dflash_tokens_per_s"] > 0 and row["tau"] >= 1.0
    table = (tmp_path / "batch.md").read_text()
    assert "| 1 |" in table and "| 3 |" in table and table in capsys.readouterr().out


def test_bench_batch_sizes_reports_differing_outputs_and_bad_sizes(tiny_folder, fake_eval_wheels, tmp_path,
                                                                  monkeypatch, capsys):
    import hf_dflash.sampling_dflash as sampling

    def accept_every_draft(drafts, target_scores):  # a lossy verifier: the bench must notice
        return drafts.new_full((drafts.shape[0],), drafts.shape[1]), target_scores.argmax(-1)

    with monkeypatch.context() as patch:
        patch.setattr(sampling, "greedy_accept", accept_every_draft)
        assert cli.main(_bench_batch_sizes(tiny_folder, tmp_path, "2")) == 1
    assert json.loads((tmp_path / "batch.json").read_text())[0]["identical"] is False
    capsys.readouterr()
    assert cli.main(_bench_batch_sizes(tiny_folder, tmp_path, "1,9")) == 2  # 4 prompts in the pool
    assert "batch size 9 needs 9 prompts" in capsys.readouterr().err


def test_help_shows_every_default_and_every_flag_has_help(capsys):
    import argparse

    import pytest

    parser = cli.build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, sub in subparsers.choices.items():
        formatter = cli.HelpFormatter(prog=name)
        for action in sub._actions:
            if not action.option_strings or action.option_strings == ["-h", "--help"]:
                continue
            text = formatter._get_help_string(action)
            assert action.help, f"{name} {action.option_strings[0]} has no help"
            assert action.nargs == 0 or "default" in text or "(required)" in text, (name, action.option_strings, text)
            assert ("(required)" in text) == bool(action.required), (name, action.option_strings, text)
            assert "``" not in text
        with pytest.raises(SystemExit):
            cli.main([name, "--help"])
        out = capsys.readouterr().out
        assert "``" not in out and "%(default)" not in out


def test_bench_preset_long_documents_runs_the_2k_to_8k_contexts_with_256_tokens_unless_flags_say_otherwise(
        monkeypatch, capsys):
    monkeypatch.setattr(cli, "DEFAULT_PRESET", bench.BenchPreset(("gsm8k",), 64, "a default unlike the preset"))
    parse = cli.build_parser().parse_args

    def settings(*flags: str) -> tuple[list[str], int]:
        args = cli.with_preset(parse(["bench", *flags]))
        return args.datasets, args.max_new_tokens

    assert settings() == (["gsm8k"], 64)
    assert settings("--preset", "long-documents") == (["context_2k", "context_4k", "context_8k"], 256)
    assert settings("--preset", "long-documents", "--max-new-tokens", "32") == (
        ["context_2k", "context_4k", "context_8k"], 32)
    assert settings("--preset", "long-documents", "--datasets", "doc_qa") == (["doc_qa"], 256)
    with pytest.raises(SystemExit):
        parse(["bench", "--preset", "long-docs"])
    error = capsys.readouterr().err
    assert "invalid choice: 'long-docs'" in error and "long-documents" in error.split("choose from")[1]

    asked = {}

    def stop_at_the_model(args, with_drafter=True):  # what the command would run, without loading a model
        asked.update(datasets=args.datasets, max_new_tokens=args.max_new_tokens)
        raise ValueError("stop")

    monkeypatch.setattr(cli, "load_models_from_args", stop_at_the_model)
    assert cli.main(["bench", "--preset", "long-documents"]) == 2
    assert asked == {"datasets": ["context_2k", "context_4k", "context_8k"], "max_new_tokens": 256}


def test_demo_and_bench_default_to_the_gpu_when_there_is_one(monkeypatch):
    parser = cli.build_parser()
    assert parser.parse_args(["demo"]).device == "auto" and parser.parse_args(["bench"]).device == "auto"
    monkeypatch.setattr(cli.torch.cuda, "is_available", lambda: False)
    assert str(cli.resolve_device(parser.parse_args(["demo"]).device)) == "cpu"


def test_demo_runs_its_own_target_in_float32_on_every_device():
    from hf_dflash.evaluation.demo import demo_dtype

    assert demo_dtype(None, "auto") == demo_dtype("SmolLM2", "auto") == "float32"
    assert demo_dtype("Qwen/Qwen3-8B", "auto") == "auto" and demo_dtype(None, "bfloat16") == "bfloat16"


def _demo_with_one_changed_token(tiny_folder, monkeypatch, dtype: str, tie: bool):
    """run_demo where the drafter's output is plain's with new token 2 changed: to a token whose LM-head row is made
    the same as plain's token (an exact tie of plain's logits), or to plain's least likely token (no tie at all)."""
    import torch

    from hf_dflash import models
    from hf_dflash.data.chat import chat_input_ids
    from hf_dflash.evaluation import demo

    target, tokenizer = models.load_target(tiny_folder / "target", dtype=dtype, device="cpu")
    drafter = models.load_drafter(tiny_folder / "drafter", target)
    ids = chat_input_ids(tokenizer, "Hi", target.device)
    real, step = bench.timed_generation, 2
    taken = real(target, ids, 6, "plain").new_tokens[step]
    twin = max(set(range(taken + 1, target.config.vocab_size)) - set(real(target, ids, 6, "plain").new_tokens))
    if tie:
        target.lm_head.weight[twin] = target.lm_head.weight[taken]  # the argmax keeps `taken`: the first of equals
    plain = real(target, ids, 6, "plain").new_tokens
    logits = target.generate(ids, max_new_tokens=step + 1, do_sample=False, output_logits=True,
                             return_dict_in_generate=True).logits[step][0]
    other = twin if tie else int(logits.argmin())
    assert plain[step] == taken and other != taken

    def changed(*args, **kwargs):
        run = real(*args, **kwargs)
        if args[3] == "dflash_default":
            run.new_tokens = plain[:step] + [other] + plain[step + 1:]
        return run

    monkeypatch.setattr(demo, "timed_generation", changed)
    comparisons = demo.run_demo(target, tokenizer, drafter, ["Hi"], max_new_tokens=6)
    return comparisons, demo.summary_line(comparisons), demo.demo_exit_code(comparisons)


def test_demo_names_a_bf16_near_tie_and_flags_any_other_difference(tiny_folder, monkeypatch, capsys):
    comparisons, summary, code = _demo_with_one_changed_token(tiny_folder, monkeypatch, "bfloat16", tie=True)
    out = capsys.readouterr().out
    assert comparisons[0].near_tie and code == 0 and "identical: no, a near-tie" in out
    assert "new token 2" in out and "gap 0 <= " in out and "yes, but for 1 near-tie of rounding" in summary

    comparisons, summary, code = _demo_with_one_changed_token(tiny_folder, monkeypatch, "bfloat16", tie=False)
    out = capsys.readouterr().out
    assert not comparisons[0].near_tie and code == 1 and "identical: NO" in out and "identical: NO" in summary
    assert "NOT a near-tie (please report it)" in out


def test_demo_in_float32_on_a_cpu_asks_identical_outputs_even_at_a_tie(tiny_folder, monkeypatch, capsys):
    comparisons, summary, code = _demo_with_one_changed_token(tiny_folder, monkeypatch, "float32", tie=True)
    out = capsys.readouterr().out
    assert comparisons[0].divergence is None and code == 1 and "identical: NO" in out and "identical: NO" in summary
    assert "judged by plain's own logits" not in out


def test_demo_summary_on_a_gpu_quotes_what_it_measured_beside_the_paper(tiny_folder, monkeypatch):
    from hf_dflash.evaluation import demo

    stats = DFlashStats(block_size=4, acceptance_lengths=[2])
    comparison = demo.Comparison("Hi", "Hello", bench.Run([1, 2], 0.2, 2), bench.Run([1, 2], 0.1, 1, stats))
    monkeypatch.setattr(demo.torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    on_gpu = demo.summary_line([comparison], "cuda").splitlines()[-1]
    assert on_gpu.startswith("on this GPU (NVIDIA H200): the figures above, measured now") and demo.GPU_QUOTE in on_gpu
    assert demo.summary_line([comparison]).splitlines()[-1] == f"on a GPU ({demo.GPU_QUOTE})"  # the CPU's, as before
