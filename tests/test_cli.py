# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""The command line (hf_dflash.cli): subcommands end to end on tiny models, logging, errors and help."""

import json

from hf_dflash import cli


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
    assert "| humaneval | hf-dflash (ours) |" in (tmp_path / "bench.md").read_text()


def test_demo_command_reports_identical_outputs(tiny_folder, capsys):
    code = cli.main([
        "demo", "--target", str(tiny_folder / "target"), "--drafter", str(tiny_folder / "drafter"),
        "--prompt", "Hi", "Why?", "--max-new-tokens", "10",
    ])
    assert code == 0
    out = capsys.readouterr().out
    assert "[2/2] Why?" in out and "outputs identical: yes" in out and "tau" in out


def test_cli_verbose_reaches_our_loggers():
    import logging

    from hf_dflash.cli import configure_logging

    configure_logging(verbose=True)
    assert logging.getLogger("hf_dflash.training").getEffectiveLevel() == logging.INFO
    configure_logging(verbose=False)
    assert logging.getLogger("hf_dflash.training").getEffectiveLevel() == logging.WARNING
