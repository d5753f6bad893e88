# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""The client ``hf-dflash regenerate --server`` talks to a served target with: any OpenAI-compatible
chat-completions endpoint (vLLM's ``python -m vllm.entrypoints.openai.api_server``, SGLang, ``transformers serve``).
Standard library only (urllib and threads): the engine does the heavy work.

- :func:`checked_server`: before any work, the server answers ``/v1/models``, serves the target, and a one-token
  request tells whether it takes the engine fields (``return_token_ids``...) that a strict server refuses;
- :func:`chat_completion`: one request, retried with exponential backoff on connection errors, timeouts, 429 and 5xx;
- :func:`ordered_results`: work spread over the servers' worker threads (``concurrency`` per server, each thread
  takes the next prompt when it is free, so a faster server takes more), results handed back in prompt order;
- :class:`Completion`: what one reply holds (the engine's token ids when it returns them, else only text).

Example:
    >>> base_url("http://127.0.0.1:8000/v1/")
    'http://127.0.0.1:8000'
"""

from __future__ import annotations

import http.client
import json
import queue
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar

from transformers.utils import logging

logger = logging.get_logger(__name__)

Item = TypeVar("Item")
Result = TypeVar("Result")

# Request fields of vLLM and SGLang beyond the OpenAI schema. The sampling ones override the defaults such engines
# take from the model's generation_config.json (e.g. Qwen3's top_k=20), so a request samples from the plain
# temperature/top_p law, as the in-process path does. A strict server (`transformers serve`) answers 422 to them:
# the check then finds it takes none and requests go without them (and the text is re-tokenized).
ENGINE_FIELDS = {"return_token_ids": True, "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0}

# HTTP statuses worth another try: rate limited, timed out, or a server-side failure (an engine restarting).
TRANSIENT_STATUSES = frozenset({408, 429, 500, 502, 503, 504})

MAX_BACKOFF_SECONDS = 60.0


@dataclass(frozen=True)
class Server:
    """One checked endpoint: its base URL (without ``/v1``), the served model name requests carry, and whether it
    takes :data:`ENGINE_FIELDS`."""

    url: str
    model: str
    engine_fields: bool


@dataclass(frozen=True)
class Completion:
    """One chat-completion reply. ``prompt_ids`` / ``response_ids``: the engine's token ids (vLLM with
    ``return_token_ids``), None when it returned none; ``reasoning``: text an engine's reasoning parser split off
    ``content`` (vLLM ``reasoning``, SGLang ``reasoning_content``); ``finished``: it stopped by itself (EOS), not at
    ``max_tokens``.

    Example:
        >>> Completion.from_reply({"choices": [{"message": {"content": "Hi"}, "finish_reason": "length"}]}).finished
        False
    """

    content: str
    finished: bool
    prompt_ids: list[int] | None = None
    response_ids: list[int] | None = None
    reasoning: str | None = None

    @classmethod
    def from_reply(cls, reply: dict[str, Any]) -> Completion:
        choice = reply["choices"][0]
        message = choice.get("message") or {}
        return cls(
            content=message.get("content") or "",
            finished=choice.get("finish_reason") == "stop",
            prompt_ids=reply.get("prompt_token_ids"),
            response_ids=choice.get("token_ids"),
            reasoning=message.get("reasoning") or message.get("reasoning_content") or None,
        )


def base_url(url: str) -> str:
    """``url`` without a trailing ``/`` or ``/v1``: users paste either form.

    Example:
        >>> base_url("localhost:30000")
        'http://localhost:30000'
    """
    url = url.strip().rstrip("/")
    if "://" not in url:
        url = "http://" + url
    return url.removesuffix("/v1")


def request_json(url: str, body: dict | None = None, timeout: float = 600.0) -> Any:
    """The JSON answer of one GET (``body`` None) or POST; raises urllib's errors unchanged (see :func:`transient`)."""
    data = None if body is None else json.dumps(body).encode("utf-8")
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def transient(error: BaseException) -> bool:
    """Whether another try may succeed: a connection refused or reset, a timeout, a cut-off answer, 429 or 5xx.

    Example:
        >>> transient(ConnectionRefusedError()), transient(ValueError("bad request"))
        (True, False)
    """
    if isinstance(error, urllib.error.HTTPError):
        return error.code in TRANSIENT_STATUSES
    return isinstance(error, (urllib.error.URLError, ConnectionError, TimeoutError, http.client.HTTPException))


def error_text(error: BaseException) -> str:
    """A one-line account of a failed request, with the server's own message for an HTTP error."""
    if isinstance(error, urllib.error.HTTPError):
        try:
            detail = error.read().decode("utf-8", "replace")
        except Exception:  # the body may be gone already; the status alone still says something
            detail = ""
        return f"HTTP {error.code} {detail[:300]}".strip()
    if isinstance(error, urllib.error.URLError):
        return str(error.reason)
    return f"{type(error).__name__}: {error}"


def backoff_seconds(attempt: int, first_delay: float) -> float:
    """Wait before retry ``attempt`` (0-based): doubling from ``first_delay``, at most a minute.

    Example:
        >>> [backoff_seconds(a, 1.0) for a in range(4)]
        [1.0, 2.0, 4.0, 8.0]
    """
    return min(first_delay * 2**attempt, MAX_BACKOFF_SECONDS)


def with_retries(call: Callable[[], Result], what: str, retries: int, first_delay: float) -> Result:
    """``call()``, tried again after transient failures (:func:`transient`) up to ``retries`` times with
    exponential backoff. Raises a ValueError naming ``what`` and the last failure when it gives up, or at once for a
    failure another try cannot fix (a 400: the request itself is wrong)."""
    for attempt in range(retries + 1):
        try:
            return call()
        except Exception as error:  # noqa: BLE001 - sorted into transient or not just below
            if not transient(error):
                raise ValueError(f"{what}: {error_text(error)}") from error
            if attempt == retries:
                raise ValueError(
                    f"{what}: {error_text(error)}, still after {retries} retries. The records written so far are "
                    "kept: rerun the same command when the server is back to resume."
                ) from error
            wait = backoff_seconds(attempt, first_delay)
            logger.warning(f"{what}: {error_text(error)}; retry {attempt + 1}/{retries} in {wait:.1f} s.")
            time.sleep(wait)
    raise AssertionError("unreachable")


# ----------------------------------------------------------------------------------------------------------------------
# checks before any work
def served_models(url: str, timeout: float = 30.0) -> list[str]:
    """The model ids ``url`` serves (``GET /v1/models``); a ValueError saying how to start it when it does not
    answer."""
    try:
        listing = request_json(f"{base_url(url)}/v1/models", timeout=timeout)
    except (OSError, http.client.HTTPException, ValueError) as error:  # urllib's errors are OSErrors
        reason = error_text(error) if isinstance(error, OSError) else f"not an OpenAI-compatible answer ({error})"
        raise ValueError(
            f"--server {url}: {base_url(url)}/v1/models does not answer ({reason}). Start the engine first and wait "
            "until it answers (vLLM: `python -m vllm.entrypoints.openai.api_server --model TARGET --port P`), or fix "
            "the URL."
        ) from None
    return [str(model.get("id")) for model in listing.get("data", []) if isinstance(model, dict)]


def matching_model(target: str, served: Sequence[str], server_model: str | None = None) -> str | None:
    """The served model id that is the target: ``server_model`` when given, else ``target`` itself, else the one
    whose last path part is the target's (a Hub id served from a local folder, or the other way round).

    Example:
        >>> matching_model("Qwen/Qwen3-8B", ["/models/Qwen3-8B"]), matching_model("Qwen/Qwen3-8B", ["llama"])
        ('/models/Qwen3-8B', None)
    """
    if server_model is not None:
        return server_model if server_model in served else None
    if target in served:
        return target
    name = target.rstrip("/").rsplit("/", 1)[-1]
    return next((model for model in served if model.rstrip("/").rsplit("/", 1)[-1] == name), None)


def checked_server(url: str, target: str, server_model: str | None = None, timeout: float = 600.0) -> Server:
    """The :class:`Server` at ``url`` once it answers, serves ``target`` and has answered a one-token request; a
    ValueError naming both models and the fix when it serves another model.

    Example:
        >>> checked_server("http://127.0.0.1:8000", "HuggingFaceTB/SmolLM2-135M-Instruct")  # doctest: +SKIP
        Server(url='http://127.0.0.1:8000', model='HuggingFaceTB/SmolLM2-135M-Instruct', engine_fields=True)
    """
    served = served_models(url)
    model = matching_model(target, served, server_model)
    if model is None:
        wanted = f"--server-model {server_model!r}" if server_model else f"the target {target!r}"
        raise ValueError(
            f"--server {url} serves {served}, not {wanted}. Records must come from the model whose tokenizer --target "
            f"loads: serve the target there, or, when it is the same model under another name (vLLM "
            "--served-model-name), pass that name with --server-model."
        )
    probe = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, "temperature": 0.0}
    for server in (Server(base_url(url), model, engine_fields=True), Server(base_url(url), model, False)):
        try:
            request_json(f"{server.url}/v1/chat/completions", request_body(server, probe), timeout)
        except urllib.error.HTTPError as error:
            if server.engine_fields and error.code in (400, 422):
                continue  # a strict server refusing the engine fields: try without them
            failure: BaseException = error
        except (OSError, http.client.HTTPException, ValueError) as error:
            failure = error
        else:
            if not server.engine_fields:
                logger.warning(f"{url} refuses {sorted(ENGINE_FIELDS)}: responses will be re-tokenized with the target "
                               "tokenizer, and sampling follows the server's defaults beyond temperature and top_p.")
            return server
        raise ValueError(f"--server {url}: a one-token request to {model!r} failed ({error_text(failure)}).")
    raise AssertionError("unreachable")


def request_body(server: Server, settings: dict[str, Any]) -> dict[str, Any]:
    """A chat-completions request for ``server``: its model name, ``settings`` (messages, max_tokens, temperature...)
    and the engine fields it takes.

    Example:
        >>> request_body(Server("http://h", "m", engine_fields=False), {"max_tokens": 8})
        {'model': 'm', 'max_tokens': 8, 'stream': False}
    """
    return {"model": server.model, **settings, "stream": False} | (ENGINE_FIELDS if server.engine_fields else {})


def chat_completion(server: Server, settings: dict[str, Any], retries: int = 5, first_delay: float = 1.0,
                    timeout: float = 600.0) -> Completion:
    """One chat completion from ``server`` (see :func:`request_body`), retried as :func:`with_retries` says."""
    body = request_body(server, settings)
    reply = with_retries(lambda: request_json(f"{server.url}/v1/chat/completions", body, timeout),
                         f"--server {server.url}", retries, first_delay)
    return Completion.from_reply(reply)


# ----------------------------------------------------------------------------------------------------------------------
# spreading work
def ordered_results(items: Iterable[Item], servers: Sequence[Server], fetch: Callable[[Server, Item], Result],
                    concurrency: int) -> Iterator[tuple[Item, Result]]:
    """``(item, fetch(server, item))`` for every item, in the order of ``items``.

    ``concurrency`` threads per server take the next item when they are free, so at most ``concurrency`` requests
    are in flight per server and a faster server takes more of the work. At most two items per thread are taken
    ahead of the oldest unfinished one: memory stays bounded and results come back in order, so output files do not
    depend on timing. ``items`` is read on the caller's thread (tokenizers are not thread-safe). A failure of
    ``fetch`` is raised here when its item's turn comes; the queued items are then dropped.

    Example:
        >>> servers = [Server("http://a", "m", True), Server("http://b", "m", True)]
        >>> [r for _, r in ordered_results(range(5), servers, lambda s, i: i * i, concurrency=2)]
        [0, 1, 4, 9, 16]
    """
    jobs: queue.Queue = queue.Queue()

    def work(server: Server) -> None:
        while (job := jobs.get()) is not None:
            item, future = job
            if future.set_running_or_notify_cancel():  # False: dropped after a failure
                try:
                    future.set_result(fetch(server, item))
                except BaseException as error:  # noqa: BLE001 - handed to the caller's thread
                    future.set_exception(error)

    threads = [threading.Thread(target=work, args=(server,), daemon=True, name=f"regenerate-{server.url}-{n}")
               for server in servers for n in range(concurrency)]
    for thread in threads:
        thread.start()
    pending: deque[tuple[Item, Future]] = deque()
    try:
        for item in items:
            if len(pending) >= 2 * len(threads):
                head, future = pending.popleft()
                yield head, future.result()
            pending.append((item, Future()))
            jobs.put(pending[-1])
        while pending:
            head, future = pending.popleft()
            yield head, future.result()
    finally:
        for _, future in pending:
            future.cancel()
        for _ in threads:
            jobs.put(None)
