# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""``hf-dflash regenerate --server`` against a real ``transformers serve``, slow.

``transformers serve`` (FastAPI + Uvicorn: the ``transformers[serving]`` extra, in ``.[dev]``) serves the offline
SmolLM2 on 127.0.0.1. It returns no token ids, so this is the re-tokenizing path run for real: each response's text
tokenized with the target tokenizer and kept only when it decodes back to the same text. Greedy fp32 in both
processes: the records must carry the in-process responses' text; their ids match where the model wrote the
tokenizer's own split of that text (not always: see the last assertion).
"""

import importlib.util
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import free_port

from hf_dflash.data import RegenerationArguments, regenerate
from hf_dflash.models import smollm2_folder

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not all(importlib.util.find_spec(m) for m in ("fastapi", "uvicorn")),
                       reason="transformers serve needs fastapi and uvicorn (pip install 'transformers[serving]')"),
]

PROMPTS = ["Write a Python function that reverses a string.", "What is 17 times 23? Explain briefly.",
           "Name three rivers in Europe.", "Give me a haiku about autumn."]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A `transformers serve` process preloading SmolLM2 on a free port; its base URL."""
    port = free_port()
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    command = [str(Path(sys.executable).parent / "transformers"), "serve", "--host", "127.0.0.1", "--port", str(port),
               str(smollm2_folder())]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    process = subprocess.Popen(command, stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env,
                               start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            assert process.poll() is None, f"transformers serve exited:\n{log.read_text()[-3000:]}"
            try:
                urllib.request.urlopen(f"{url}/v1/models", timeout=5).read()
                break
            except OSError:
                assert time.monotonic() < deadline, f"transformers serve did not answer:\n{log.read_text()[-3000:]}"
                time.sleep(1)
        yield url
    finally:
        os.killpg(process.pid, 15)
        process.wait(timeout=60)


def records(path: Path) -> dict[int, dict]:
    return {r["index"]: r for r in map(json.loads, path.read_text().splitlines())}


def test_regenerate_on_transformers_serve_writes_the_in_process_records(tmp_path, server):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    # 48 tokens, and any response kept: a reply that ends on EOS exactly at the limit is reported as "length" by
    # transformers serve (its EOS is then missing from the text), which would make that one record differ
    settings = dict(target="smollm2", prompts=str(prompts), max_new_tokens=48, min_response_tokens=1)
    regenerate(RegenerationArguments(output=str(tmp_path / "local.jsonl"), batch_size=4, **settings))
    regenerate(RegenerationArguments(output=str(tmp_path / "served.jsonl"), server=[server],
                                     server_model=str(smollm2_folder()), concurrency=2, **settings))
    local, served = records(tmp_path / "local.jsonl"), records(tmp_path / "served.jsonl")
    assert sorted(served) == sorted(local) == list(range(len(PROMPTS)))
    assert {r["token_ids_from"] for r in served.values()} == {"retokenized"}  # it returns no ids
    # the same text, token for token where the model's own tokens were the tokenizer's canonical split of it;
    # measured here: 3 of 4 records identical, one differs where the model wrote "\n\n" as two tokens that the
    # tokenizer merges (round trip exact, ids not): why engine ids (vLLM's return_token_ids) are preferred
    for index, record in local.items():
        assert served[index]["response"] == record["response"], index
        assert served[index]["prompt_length"] == record["prompt_length"]
    assert sum(served[i]["input_ids"] == r["input_ids"] for i, r in local.items()) >= len(PROMPTS) - 1
