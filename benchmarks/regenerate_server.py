# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""Regeneration on a real vLLM server against in-process regeneration (BENCHMARKS.md, "Engines").

Starts vLLM's OpenAI-compatible server (``python -m vllm.entrypoints.openai.api_server``, from the vLLM venv that
``benchmarks/conformance/vllm_check.sh`` creates or ``$VLLM_VENV``) on the offline SmolLM2-135M-Instruct in fp32, or uses
``--url`` of one already running, then regenerates the same greedy prompts (MT-Bench, HumanEval, GSM8K) twice:
``hf-dflash regenerate`` in-process and ``hf-dflash regenerate --server URL``. Reports how many records carry the
same token ids (and where the first differing token of the others is), where the server's ids came from, and
response tokens per second of each side (wall time of the whole call, the server's start-up excluded).

    python benchmarks/regenerate_server.py                       # 16 prompts, 128 new tokens -> JSON + Markdown
    python benchmarks/regenerate_server.py --limit 4 --max-new-tokens 32 --json out.json   # what the slow test runs

Exit code 1 when the server run misses a prompt the in-process run kept. Token-id differences are reported, not
failed: two fp32 CPU engines may round a near-tie differently (``--require-identical`` makes them fail).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import date
from pathlib import Path

from hf_dflash.data import RegenerationArguments, regenerate
from hf_dflash.evaluation.machine import load_average, run_stamp
from hf_dflash.evaluation.prompts import load_eval_prompts
from hf_dflash.models import load_target, smollm2_folder

DATASETS = {"mtbench": 6, "humaneval": 5, "gsm8k": 5}
STARTUP_SECONDS = 900


def default_vllm_python() -> str:
    """The vLLM venv's python: ``$VLLM_VENV``, else the venv benchmarks/conformance/vllm_check.sh creates."""
    cache = Path(os.environ.get("HF_DFLASH_CACHE", Path.home() / ".cache" / "hf_dflash"))
    return str(Path(os.environ.get("VLLM_VENV", cache / "vllm-venv")) / "bin" / "python")


def free_port() -> int:
    """A TCP port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(vllm_python: str, model: Path, port: int, log: Path) -> subprocess.Popen:
    """vLLM's OpenAI server in its own process group (its engine runs in child processes: stopped together)."""
    command = [vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--host", "127.0.0.1",
               "--port", str(port), "--dtype", "float32", "--max-model-len", "2048"]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "VLLM_CPU_KVCACHE_SPACE": "1"}
    return subprocess.Popen(command, stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env, start_new_session=True)


def wait_until_ready(url: str, process: subprocess.Popen | None, log: Path) -> float:
    """Seconds until ``url/v1/models`` answers; raises when the server exits or takes too long."""
    start = time.perf_counter()
    while time.perf_counter() - start < STARTUP_SECONDS:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"the vLLM server exited ({process.returncode}):\n{log.read_text()[-3000:]}")
        try:
            urllib.request.urlopen(f"{url}/v1/models", timeout=5).read()
            return time.perf_counter() - start
        except OSError:
            time.sleep(2)
    raise RuntimeError(f"the vLLM server did not answer within {STARTUP_SECONDS} s:\n{log.read_text()[-3000:]}")


def stop_server(process: subprocess.Popen) -> None:
    """Stop the server and its engine processes (SIGTERM, then SIGKILL after a minute)."""
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=60)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        os.killpg(process.pid, signal.SIGKILL)


def write_prompts(path: Path, limit: int | None) -> int:
    """Write the first ``limit`` of the :data:`DATASETS` prompts as JSONL; returns how many."""
    prompts = [p for name, n in DATASETS.items() for p in load_eval_prompts(name, n)][:limit]
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts), encoding="utf-8")
    return len(prompts)


def timed_regeneration(args: RegenerationArguments, **loaded) -> tuple[dict[int, dict], float]:
    """Records by prompt index, and the wall seconds of the call."""
    start = time.perf_counter()
    regenerate(args, **loaded)
    seconds = time.perf_counter() - start
    records = [json.loads(line) for line in Path(args.output).read_text(encoding="utf-8").splitlines()]
    return {r["index"]: r for r in records}, seconds


def first_difference(a: list[int], b: list[int]) -> int:
    """The first position where two id lists differ (the shorter length when one is a prefix of the other).

    >>> first_difference([1, 2, 3], [1, 5, 3]), first_difference([1, 2], [1, 2, 3])
    (1, 2)
    """
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def compare(local: dict[int, dict], served: dict[int, dict]) -> dict:
    """Identical records, and for each differing one the response token where it first differs."""
    differing = {}
    for index, record in local.items():
        other = served.get(index)
        if other is not None and other["input_ids"] != record["input_ids"]:
            differing[index] = first_difference(record["input_ids"], other["input_ids"]) - record["prompt_length"]
    return {"identical": sum(1 for i in local if i in served) - len(differing), "compared": len(local),
            "missing_on_server": sorted(set(local) - set(served)), "first_difference_at_response_token": differing,
            "token_ids_from": sorted({r.get("token_ids_from") for r in served.values()})}


def response_tokens(records: dict[int, dict]) -> int:
    """Response tokens over all records."""
    return sum(len(r["input_ids"]) - r["prompt_length"] for r in records.values())


def markdown(report: dict) -> str:
    """The report as the Markdown table BENCHMARKS.md shows."""
    local, served, same = report["in_process"], report["server"], report["comparison"]
    return "\n".join([
        f"SmolLM2-135M-Instruct fp32, greedy, {report['prompts']} prompts, max {report['max_new_tokens']} new tokens:",
        "",
        "| path | records | response tokens | wall s | tokens/s |",
        "|---|---|---|---|---|",
        f"| in-process (batch {report['batch_size']}) | {local['records']} | {local['tokens']} | "
        f"{local['seconds']:.1f} | {local['tokens_per_second']:.1f} |",
        f"| vLLM server (concurrency {report['concurrency']}) | {served['records']} | {served['tokens']} | "
        f"{served['seconds']:.1f} | {served['tokens_per_second']:.1f} |",
        "",
        f"Identical token ids: {same['identical']}/{same['compared']} records (server ids from "
        f"{', '.join(map(str, same['token_ids_from']))}); differing records first differ at response token "
        f"{same['first_difference_at_response_token'] or '-'}; server start-up "
        f"{report['server_startup_seconds']} s (0: a server already running).",
    ])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vllm-python", default=default_vllm_python(), help="the vLLM venv's python")
    parser.add_argument("--url", default=None, help="a vLLM server already serving the SmolLM2 folder")
    parser.add_argument("--limit", type=int, default=None, help="first N of the 16 prompts")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=8, help="in-process batch size")
    parser.add_argument("--concurrency", type=int, default=8, help="requests in flight on the server")
    parser.add_argument("--workdir", default=None, help="default: a fresh temporary folder")
    parser.add_argument("--json", default=None,
                        help="default: benchmarks/results/<today>-regenerate-server/regenerate_server.json")
    parser.add_argument("--require-identical", action="store_true")
    options = parser.parse_args(argv)

    load_before = load_average()
    workdir = Path(options.workdir or tempfile.mkdtemp(prefix="regenerate-server-"))
    workdir.mkdir(parents=True, exist_ok=True)
    model = smollm2_folder()
    prompts = workdir / "prompts.jsonl"
    count = write_prompts(prompts, options.limit)
    process, log, url, startup = None, workdir / "vllm_server.log", options.url, None
    if url is None:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        process = start_server(options.vllm_python, model, port, log)
    try:
        startup = round(wait_until_ready(url, process, log), 1)
        common = {"target": str(model), "prompts": str(prompts), "max_new_tokens": options.max_new_tokens,
                  "block_size": 2, "min_response_tokens": 1}  # keep every response: compare all of them
        target, tokenizer = load_target(str(model), dtype="float32")
        local, local_seconds = timed_regeneration(
            RegenerationArguments(output=str(workdir / "in_process.jsonl"), batch_size=options.batch_size, **common),
            target=target, tokenizer=tokenizer)
        served, served_seconds = timed_regeneration(
            RegenerationArguments(output=str(workdir / "server.jsonl"), server=[url],
                                  concurrency=options.concurrency, **common), tokenizer=tokenizer)
    finally:
        if process is not None:
            stop_server(process)
    report = {
        "machine": run_stamp("cpu", load_before),
        "prompts": count, "max_new_tokens": options.max_new_tokens, "batch_size": options.batch_size,
        "concurrency": options.concurrency, "server_startup_seconds": startup,
        "threads": os.environ.get("OMP_NUM_THREADS"),
        "in_process": {"records": len(local), "tokens": response_tokens(local), "seconds": local_seconds,
                       "tokens_per_second": response_tokens(local) / local_seconds},
        "server": {"records": len(served), "tokens": response_tokens(served), "seconds": served_seconds,
                   "tokens_per_second": response_tokens(served) / served_seconds},
        "comparison": compare(local, served),
    }
    path = Path(options.json or Path(__file__).resolve().parent / "results" / f"{date.today():%Y-%m-%d}-regenerate-server"
                / "regenerate_server.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(markdown(report))
    same = report["comparison"]
    if same["missing_on_server"]:
        return 1
    return 1 if options.require_identical and same["identical"] < same["compared"] else 0


if __name__ == "__main__":
    sys.exit(main())
