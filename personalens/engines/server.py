"""An engine for an OpenAI-compatible server (e.g. `vllm serve` on another node): one generate()
sends its batch as concurrent /chat/completions requests, retried with exponential backoff.

A request the server refuses (HTTP 400 or 422: vLLM's answer to a prompt longer than the model's
context, or to a bad parameter) is answered as `rejected` and the others go on; a server that cannot
be reached, or answers 401/403/404, fails the whole call."""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any

from personalens.engines.base import Generation, OnFinished, Request, rejected
from personalens.engines.chat import format_messages
from personalens.engines.config import ModelConfig, ModelConfigError, ServerConfig


class ServerError(RuntimeError):
    """The server could not answer a request (after retries, or with a non-retryable status)."""


class _Refused(ServerError):
    """The server refused this one request (its message)."""


REFUSED_STATUSES = (400, 422)  # vLLM's validation errors: about the request, not the server


class _Retryable(Exception):
    pass


class ServerEngine:
    def __init__(self, config: ModelConfig):
        if config.server is None:
            raise ModelConfigError(f"model {config.name!r}: engine server needs server.base_url")
        self.name = config.name
        self._server = config.server
        # the server applies the chat template, which this side cannot read: only an explicit
        # `system_role: false` folds the system prompt
        self._system_role = config.system_role is not False
        self._model = config.server.model

    def generate(self, requests: Sequence[Request], on_finished: OnFinished | None = None) -> list[Generation]:
        if not requests:
            return []
        model = self._served_model()
        pool = ThreadPoolExecutor(max_workers=min(self._server.max_concurrency, len(requests)))
        try:
            futures = [pool.submit(self._complete, model, r) for r in requests]
            if on_finished is not None:
                for future in as_completed(futures):
                    # from this thread, so callers need no locks; a failed call raises below
                    done = future.result() if future.exception() is None else None
                    on_finished(1, done.completion_tokens if done else 0)
            return [f.result() for f in futures]
        finally:
            # on an error or Ctrl-C, the requests not yet sent are dropped rather than sent first
            pool.shutdown(wait=True, cancel_futures=True)

    def _served_model(self) -> str:
        if self._model is None:
            served = [m["id"] for m in _call(self._server, "GET", "/models")["data"]]
            if len(served) != 1:
                raise ServerError(f"{self._server.base_url} serves {served}; set server.model to one of them")
            self._model = served[0]
        return self._model

    def _complete(self, model: str, request: Request) -> Generation:
        try:
            reply = _call(self._server, "POST", "/chat/completions", chat_body(model, request, self._system_role))
        except _Refused as refusal:
            return rejected(str(refusal))
        try:
            usage = reply["usage"]
            choice = reply["choices"][0]
            return Generation(
                text=choice["message"]["content"] or "",
                prompt_tokens=usage["prompt_tokens"],
                completion_tokens=usage["completion_tokens"],
                # vLLM reports it only when served with --enable-prompt-tokens-details
                cached_tokens=(usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0,
                finish_reason=choice.get("finish_reason"),
            )
        except (KeyError, IndexError, TypeError) as err:
            raise ServerError(f"{self._server.base_url}: unexpected reply {reply!r}") from err


def chat_body(model: str, request: Request, system_role: bool) -> dict[str, Any]:
    """The JSON body of one chat completion; grammars use vLLM's structured-outputs extension."""
    s = request.sampling
    body: dict[str, Any] = {
        "model": model,
        "messages": format_messages(request.messages, system_role),
        "temperature": s.temperature,
        "top_p": s.top_p,
        "max_tokens": s.max_tokens,
    }
    if s.seed is not None:
        body["seed"] = s.seed
    if s.min_tokens:
        body["min_tokens"] = s.min_tokens  # a vLLM extension, sent only when asked for
    if request.grammar:
        body["structured_outputs"] = {"grammar": request.grammar}
    return body


def _call(server: ServerConfig, method: str, route: str, body: dict | None = None) -> dict:
    """One JSON call, retried on connection errors, timeouts, 429 and 5xx."""
    url = server.base_url.rstrip("/") + route
    attempts = server.retries + 1
    for attempt in range(attempts):
        try:
            return _send(server, method, url, body)
        except _Retryable as err:
            last_error = err
            if attempt + 1 < attempts:
                time.sleep(server.backoff_s * 2**attempt)
    raise ServerError(f"{method} {url} failed after {attempts} attempt(s): {last_error}")


def _send(server: ServerConfig, method: str, url: str, body: dict | None) -> dict:
    headers = {"Content-Type": "application/json"}
    if server.api_key_env:
        headers["Authorization"] = f"Bearer {os.environ.get(server.api_key_env, '')}"
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=server.timeout_s) as response:
            return json.load(response)
    except urllib.error.HTTPError as err:
        detail = err.read().decode(errors="replace")[:2000]
        if err.code == 429 or err.code >= 500:
            raise _Retryable(f"HTTP {err.code}: {detail}") from None
        if err.code in REFUSED_STATUSES:
            raise _Refused(f"HTTP {err.code}: {_message(detail)}") from None
        raise ServerError(f"{method} {url}: HTTP {err.code}: {detail}") from None
    except (urllib.error.URLError, TimeoutError, ConnectionError) as err:
        raise _Retryable(str(getattr(err, "reason", err))) from None


def _message(detail: str) -> str:
    """The message of an OpenAI-style error body (`{"error": {"message": ...}}`), else the body."""
    try:
        error = json.loads(detail)["error"]
        return str(error["message"] if isinstance(error, dict) else error)
    except (ValueError, KeyError, TypeError):
        return detail
