"""What the repository itself records: no committed file names a folder of the machine it was made on (as
tests/test_export.py checks for saved drafters), and the shipped drafter's model card is the one hf-dflash writes from
its config and training_info.json (so its tau is the one figure training_info.json and eval.json carry)."""

import json
import re
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from hf_dflash.configuration_dflash import DFlashConfig
from hf_dflash.model_card import render_model_card

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "hf_dflash" / "assets" / "smollm2-dflash"

# A folder of one machine: a path under root, home, tmp, work, Users or mnt at the top of its file system (not part
# of a URL or of a longer path, and not a bare prefix such as the one tests/test_export.py looks for)
LOCAL_PATH = re.compile(r"(?<![\w.~$/:-])/(?:root|home|tmp|work|Users|mnt)/[^\s\"'`)\]},]+")
DOCTEST = re.compile(r"^\s*(>>>|\.\.\.) ")  # an example input of a function that maps such paths to portable names


def tracked_text_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    return [ROOT / name for name in listed.decode().split("\0") if name]


def local_paths(path: Path) -> list[str]:
    """``file:line: path`` for each absolute local path in a text file (binary files have none to read)."""
    try:
        data = path.read_bytes()
    except (FileNotFoundError, IsADirectoryError):  # deleted in the working tree, or a submodule
        return []
    if b"\0" in data:
        return []
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return []
    relative = path.relative_to(ROOT).as_posix()
    return [f"{relative}:{number}: {match}" for number, line in enumerate(text.splitlines(), 1)
            if not DOCTEST.match(line) for match in LOCAL_PATH.findall(line)]


def test_local_paths_are_found_and_named():
    assert LOCAL_PATH.findall('"drafter": "' + "/" + 'work/main/hf_dflash/assets/x"') == ["/" + "work/main/hf_dflash/assets/x"]
    assert not LOCAL_PATH.findall('~/.cache/hf_dflash https://example.org/home/page "/tmp/" not in text a/tmp/b')


@pytest.mark.skipif(not (ROOT / ".git").exists() or shutil.which("git") is None, reason="not a git checkout")
def test_no_committed_file_names_a_local_folder():
    found = [hit for path in tracked_text_files() for hit in local_paths(path)]
    assert not found, ("absolute local paths committed (write a Hub id, a path relative to the repository, "
                       "hf_dflash.models.portable_name(...) or ~/...):\n" + "\n".join(found))


def test_the_shipped_model_card_is_the_one_its_training_info_renders():
    drafter = SimpleNamespace(config=DFlashConfig.from_pretrained(SHIPPED), hub_repo_id="smollm2-dflash-1536")
    template = (ROOT / "hf_dflash" / "MODEL_CARD.md").read_text(encoding="utf-8")
    rendered = render_model_card(drafter, template, str(SHIPPED))
    assert (SHIPPED / "README.md").read_text(encoding="utf-8") == rendered, (
        "hf_dflash/assets/smollm2-dflash/README.md differs from what MODEL_CARD.md renders from its config and "
        "training_info.json: change training_info.json (or the template), then re-render the card")


def test_the_shipped_drafter_has_one_tau():
    info = json.loads((SHIPPED / "training_info.json").read_text())
    results = json.loads((SHIPPED / "eval.json").read_text())
    assert info["tau"] == results["tau"] == results["unseen_prompts"]["tau"]
    assert f"{info['tau']:.3f}" in (SHIPPED / "README.md").read_text(encoding="utf-8")
    assert info["tau_measured_on"] and results["unseen_prompts"]["command"].startswith("python benchmarks/")


def train_command(stage: str, cache: Path, **settings: str) -> list[str]:
    """The `hf-dflash train` words the rebuild script runs for `stage` and other `settings` (its DRY_RUN, nothing
    trained)."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(cache), "HF_DFLASH_CACHE": str(cache), "DRY_RUN": "1",
           "STAGE": stage, "PYTHON": "python3", **settings}
    printed = subprocess.run(["bash", "scripts/train_smollm2_drafter.sh"], cwd=ROOT, env=env, capture_output=True,
                             text=True, check=True)
    printed = printed.stdout + printed.stderr
    line = next(line for line in printed.splitlines() if " -m hf_dflash train " in line)
    return line.split(" -m hf_dflash train ", 1)[1].split()


def flag_values(words: list[str]) -> dict[str, str | None]:
    """{--flag: its value (None for a switch)} of a command's words."""
    flags = {}
    for i, word in enumerate(words):
        if word.startswith("--"):
            nxt = words[i + 1] if i + 1 < len(words) else None
            flags[word] = None if nxt is None or nxt.startswith("--") else nxt
    return flags


def test_the_rebuild_script_trains_the_shipped_drafter_with_the_arguments_it_records(tmp_path):
    """training_info.json names each stage's arguments: the script's stages run exactly those (the first run's
    recipe; the continuation's overrides of it)."""
    stages = json.loads((SHIPPED / "training_info.json").read_text())["stages"]
    first = flag_values(train_command("first", tmp_path))
    recorded = flag_values(stages["first"]["arguments"].split())
    assert {flag: first.get(flag, "absent") for flag in recorded} == recorded
    continued = flag_values(train_command("continue", tmp_path))
    overrides = {"--lr": "3e-4", "--max-steps": "4000", "--target-hub-id": "HuggingFaceTB/SmolLM2-135M-Instruct"}
    assert all(flag in stages["continue"]["arguments"] for flag in overrides)
    assert {flag: continued.get(flag) for flag in overrides} == overrides
    assert continued["--init-drafter"].endswith("smollm2-dflash-1536")  # the first stage's output
    # each stage ends at a step count (a CPU budget would end it elsewhere on a busier machine)
    assert first["--stop-at-step"] == str(stages["first"]["steps"]) and "--max-cpu-seconds" not in first
    assert "--stop-at-step" not in continued and "--max-cpu-seconds" not in continued
    kept = {flag: value for flag, value in recorded.items()
            if flag not in overrides and flag not in ("--init-from-target", "--stop-at-step")}
    assert {flag: continued.get(flag, "absent") for flag in kept} == kept


def test_training_on_more_data_holds_out_what_the_earlier_stages_never_trained_on(tmp_path):
    """STAGE=more starts from the continuation's weights on more data: its held-out set must stay the earlier
    stages' own (a split of the 1,536 prompts' data), else samples they trained on would count as held out; it runs
    with the arguments training_info.json records (its stage defaults: all 3,008 prompts and the workloads)."""
    more = flag_values(train_command("more", tmp_path))
    continued = flag_values(train_command("continue", tmp_path))
    assert more["--init-drafter"] == continued["--output"]  # the continuation's drafter, not the shipped folder
    assert more["--eval-data"] == continued["--data"] and more["--data"].endswith("3008_workloads200.jsonl")
    recorded = json.loads((SHIPPED / "training_info.json").read_text())["stages"]["more"]
    assert more["--lr"] == "2e-4" and "--lr 2e-4" in recorded["arguments"]
    assert more["--max-steps"] == str(recorded["steps"]) and "--max-cpu-seconds" not in more


def test_the_second_pass_starts_from_the_more_data_stage_and_holds_out_the_same_split(tmp_path):
    """STAGE=again (shipped) trains the more-data stage's drafter once more on the same data and held-out split, one
    process, for the steps training_info.json records; LAYERS=2 grows that drafter instead of starting afresh."""
    more, again = (flag_values(train_command(stage, tmp_path)) for stage in ("more", "again"))
    assert again["--init-drafter"] == more["--output"] and again["--output"] != more["--output"]
    assert (again["--data"], again["--eval-data"]) == (more["--data"], more["--eval-data"])
    recorded = json.loads((SHIPPED / "training_info.json").read_text())["stages"]["again"]
    assert again["--max-steps"] == str(recorded["steps"]) and "--max-cpu-seconds" not in again
    differ = ("--init-drafter", "--output", "--max-steps")
    assert set(again) == set(more)
    assert {flag: again[flag] for flag in more if flag not in differ} == {
        flag: value for flag, value in more.items() if flag not in differ}
    assert "--grow-layers" not in again
    grown = flag_values(train_command("again", tmp_path, LAYERS="2"))
    assert "--grow-layers" in grown and grown["--num-layers"] == "2" and grown["--init-drafter"] == more["--output"]


def test_every_measuring_script_stamps_the_json_it_writes():
    """A script under benchmarks/ with a --json option records when, where and under what load it ran: it calls
    run_stamp (hf_dflash.evaluation.machine) or hf-dflash bench's run_benchmark, which does."""
    scripts = [path for path in tracked_text_files()
               if path.suffix == ".py" and path.relative_to(ROOT).parts[0] == "benchmarks"
               and '"--json"' in path.read_text(encoding="utf-8")]
    assert len(scripts) >= 6
    unstamped = [path.relative_to(ROOT).as_posix() for path in scripts
                 if not re.search(r"\b(run_stamp|run_benchmark)\(", path.read_text(encoding="utf-8"))]
    assert not unstamped, f"these write JSON without the run's stamp (run_stamp): {unstamped}"
