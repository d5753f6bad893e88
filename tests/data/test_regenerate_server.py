# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""``hf-dflash regenerate --server`` against fake OpenAI-compatible engines on 127.0.0.1 (http.server in a thread).

The fake engine renders prompts with the tiny target's own tokenizer and answers a fixed text per prompt, like
vLLM (``return_token_ids``: prompt_token_ids and token_ids, EOS included), like a server that returns text only, or
like a strict server (``transformers serve``) that refuses fields beyond the OpenAI schema with a 422. The real
engine: tests/data/test_regenerate_vllm.py (slow).
"""

import importlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from conftest import free_port, save_tiny_target, write_prompts
from transformers import AutoTokenizer

from hf_dflash.cli import main
from hf_dflash.data import RegenerationArguments, regenerate
from hf_dflash.data.serving import ENGINE_FIELDS

regenerate_module = importlib.import_module("hf_dflash.data.regenerate")  # the package's name is the function


class FakeEngine:
    """One served model. ``ids``: return token ids (with a leading <|im_start|> that the text cannot show, so ids
    taken from the engine and ids re-tokenized from its text differ); ``strict``: 422 on :data:`ENGINE_FIELDS`;
    ``failures``: that many chat requests answer 503 first; ``delay``: seconds per request, longer for prompts
    whose text has a 1 or a 2, so replies finish out of prompt order; ``hold``: a request waits (up to a second)
    until that many are in flight, so a loaded test machine still reaches a concurrency bound."""

    def __init__(self, tokenizer, model: str, ids: bool = True, strict: bool = False, failures: int = 0,
                 delay: float = 0.0, hold: int = 0):
        self.tokenizer, self.model, self.ids, self.strict = tokenizer, model, ids, strict
        self.failures, self.delay, self.hold = failures, delay, hold
        self.lock = threading.Condition()  # the tokenizer is not thread-safe; the delay is spent outside the lock
        self.bodies: list[dict] = []
        self.in_flight = self.most_in_flight = 0

    def answer(self, path: str, body: dict | None) -> tuple[int, dict]:
        if path == "/v1/models":
            return 200, {"object": "list", "data": [{"id": self.model, "object": "model"}]}
        if self.strict and set(body) & set(ENGINE_FIELDS):
            return 422, {"detail": f"Unexpected fields in the request: {sorted(set(body) & set(ENGINE_FIELDS))}"}
        if body.get("model") != self.model:
            return 404, {"error": {"message": f"The model `{body.get('model')}` does not exist."}}
        with self.lock:
            self.bodies.append(body)
            if self.failures and body["max_tokens"] > 1:
                self.failures -= 1
                return 503, {"error": "engine restarting"}
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
            self.lock.notify_all()
            self.lock.wait_for(lambda: self.in_flight >= self.hold, timeout=1.0)
        try:
            question = body["messages"][-1]["content"]
            time.sleep(self.delay * (1 + 2 * (question.count("1") + question.count("2"))))
            with self.lock:
                return 200, self.reply(body, question)
        finally:
            with self.lock:
                self.in_flight -= 1

    def reply(self, body: dict, question: str) -> dict:
        tok = self.tokenizer
        prompt = tok.apply_chat_template(body["messages"], tokenize=False, add_generation_prompt=True,
                                         **body.get("chat_template_kwargs", {}))
        generated = ([tok.convert_tokens_to_ids("<|im_start|>")] + tok(f"well, {question} i think so.")["input_ids"]
                     + [tok.eos_token_id])[: body["max_tokens"]]
        text = tok.decode(generated, skip_special_tokens=True)
        choice = {"index": 0, "message": {"role": "assistant", "content": text},
                  "finish_reason": "stop" if generated[-1] == tok.eos_token_id else "length"}
        reply = {"id": "x", "object": "chat.completion", "model": self.model, "choices": [choice]}
        if self.ids and body.get("return_token_ids"):
            choice["token_ids"] = generated
            reply["prompt_token_ids"] = tok(prompt, add_special_tokens=False)["input_ids"]
        return reply


def serve(engine: FakeEngine) -> tuple[ThreadingHTTPServer, str]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send(*engine.answer(self.path, None))

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            self.send(*engine.answer(self.path, body))

        def send(self, status: int, payload: dict) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory) -> Path:
    return save_tiny_target(tmp_path_factory.mktemp("tiny-target"))


@pytest.fixture(scope="module")
def tokenizer(target_dir):
    return AutoTokenizer.from_pretrained(target_dir)


@pytest.fixture
def engines(tokenizer, target_dir):
    """``start(**options)`` -> (engine, url); every server is shut down after the test."""
    started = []

    def start(model: str = str(target_dir), **options) -> tuple[FakeEngine, str]:
        engine = FakeEngine(tokenizer, model, **options)
        server, url = serve(engine)
        started.append(server)
        return engine, url

    yield start
    for server in started:
        server.shutdown()
        server.server_close()


def arguments(target_dir, prompts, output, urls, **overrides) -> RegenerationArguments:
    settings = {"max_new_tokens": 96, "block_size": 8, "retry_delay": 0.01} | overrides
    return RegenerationArguments(target=str(target_dir), prompts=str(prompts), output=str(output), server=urls,
                                 **settings)


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def wait_for_request_threads() -> None:
    """Until the request threads of an interrupted run have ended (each finishes the request it holds)."""
    while any(t.name.startswith("regenerate-") for t in threading.enumerate()):
        time.sleep(0.01)


def test_concurrency_per_server_is_bounded_and_work_is_spread(tmp_path, target_dir, engines):
    (first, url_a), (second, url_b) = engines(delay=0.02, hold=3), engines(delay=0.02, hold=3)
    prompts = write_prompts(tmp_path / "prompts.jsonl", count=16)
    counts = regenerate(arguments(target_dir, prompts, tmp_path / "out.jsonl", [url_a, url_b], concurrency=3))
    assert counts["kept"] == 16
    assert first.most_in_flight == second.most_in_flight == 3  # the bound, and reached
    assert len(first.bodies) + len(second.bodies) == 16 + 2  # one probe each, every prompt once
    assert len(first.bodies) > 2 and len(second.bodies) > 2
    assert [r["index"] for r in records(tmp_path / "out.jsonl")] == list(range(16))  # prompt order, whatever the timing


def test_transient_503_is_retried(tmp_path, target_dir, engines):
    engine, url = engines(failures=3)
    prompts = write_prompts(tmp_path / "prompts.jsonl", count=4)
    counts = regenerate(arguments(target_dir, prompts, tmp_path / "out.jsonl", [url], concurrency=1))
    assert counts["kept"] == 4 and len(engine.bodies) == 1 + 3 + 4
    engine.failures = 10  # a server that stays down: a ValueError once the retries are spent, the work done kept
    with pytest.raises(ValueError, match=r"HTTP 503.*after 2 retries.*rerun the same command"):
        regenerate(arguments(target_dir, prompts, tmp_path / "down.jsonl", [url], concurrency=1, retries=2))
    wait_for_request_threads()


def test_resume_after_a_kill_writes_the_uninterrupted_file(tmp_path, target_dir, engines, monkeypatch):
    engine, url = engines(delay=0.005)
    prompts = write_prompts(tmp_path / "prompts.jsonl", count=12)
    command = ["regenerate", "--target", str(target_dir), "--prompts", str(prompts), "--max-new-tokens", "96",
               "--block-size", "8", "--concurrency", "4", "--server", url]
    assert main(command + ["--output", str(tmp_path / "whole.jsonl")]) == 0
    whole = (tmp_path / "whole.jsonl").read_bytes()

    write_lines, writes = regenerate_module._write_lines, []

    def killed_in_the_third_record(path, lines):
        writes.extend(lines)
        if len(writes) == 3:  # the kill lands mid-line
            with open(path, "a") as f:
                f.write(json.dumps(lines[0])[:20])
            raise KeyboardInterrupt
        write_lines(path, lines)

    monkeypatch.setattr(regenerate_module, "_write_lines", killed_in_the_third_record)
    with pytest.raises(KeyboardInterrupt):
        main(command + ["--output", str(tmp_path / "resumed.jsonl")])
    monkeypatch.setattr(regenerate_module, "_write_lines", write_lines)
    wait_for_request_threads()
    engine.bodies.clear()
    assert main(command + ["--output", str(tmp_path / "resumed.jsonl")]) == 0
    assert (tmp_path / "resumed.jsonl").read_bytes() == whole
    assert sorted(b["seed"] for b in engine.bodies[1:]) == list(range(2, 12))  # only the prompts not written before


def test_token_ids_from_the_engine_else_retokenized(tmp_path, target_dir, tokenizer, engines):
    (with_ids, url_ids), (_, url_text), (strict, url_strict) = engines(), engines(ids=False), engines(strict=True)
    prompts = write_prompts(tmp_path / "prompts.jsonl", count=3)
    settings = {"temperature": 0.7, "top_p": 0.9, "seed": 5, "chat_template_kwargs": {"enable_thinking": True}}
    outputs = {}
    for name, url in (("ids", url_ids), ("text", url_text), ("strict", url_strict)):
        regenerate(arguments(target_dir, prompts, tmp_path / f"{name}.jsonl", [url], **settings))
        outputs[name] = records(tmp_path / f"{name}.jsonl")
    start, eos = tokenizer.convert_tokens_to_ids("<|im_start|>"), tokenizer.eos_token_id
    for engine_record, text_record, strict_record in zip(outputs["ids"], outputs["text"], outputs["strict"]):
        n = engine_record["prompt_length"]
        assert engine_record["token_ids_from"] == "engine"
        assert engine_record["input_ids"][n] == start  # the engine's ids, token for token, EOS once at the end
        assert engine_record["input_ids"][-1] == eos and engine_record["input_ids"][n:].count(eos) == 1
        for record in (text_record, strict_record):
            assert record["token_ids_from"] == "retokenized"
            assert record["input_ids"] == engine_record["input_ids"][:n] + engine_record["input_ids"][n + 1 :]
        assert engine_record["prompt"].endswith("<|im_start|>assistant\n")  # enable_thinking reached the template
    bodies = with_ids.bodies[1:]  # after the probe
    assert sorted(b["seed"] for b in bodies) == [5, 6, 7]  # seed + prompt index: the same whatever ran before
    assert {json.dumps({k: b[k] for k in ("temperature", "top_p", "chat_template_kwargs", "max_tokens",
                                          "return_token_ids")}) for b in bodies} == {json.dumps({
        "temperature": 0.7, "top_p": 0.9, "chat_template_kwargs": {"enable_thinking": True}, "max_tokens": 96,
        "return_token_ids": True})}
    assert not set(strict.bodies[-1]) & set(ENGINE_FIELDS)


def closed_port_url() -> str:
    return f"http://127.0.0.1:{free_port()}"


def test_unreachable_server_or_another_model_fails_before_any_work(tmp_path, target_dir, engines):
    prompts = write_prompts(tmp_path / "prompts.jsonl", count=2)
    output = tmp_path / "out.jsonl"
    engine, good = engines()
    dead = closed_port_url()
    with pytest.raises(ValueError, match=rf"--server {dead}: .*/v1/models does not answer.*Start the engine"):
        regenerate(arguments(target_dir, prompts, output, [good, dead]))
    other, wrong = engines(model="other/model")
    with pytest.raises(ValueError, match=rf"{wrong} serves \['other/model'\], not the target '{target_dir}'.*"
                                         "--server-model"):
        regenerate(arguments(target_dir, prompts, output, [good, wrong]))
    assert not output.exists() and len(engine.bodies) == 2 and not other.bodies  # probes only, nothing written
    assert regenerate(arguments(target_dir, prompts, output, [wrong], server_model="other/model"))["kept"] == 2
