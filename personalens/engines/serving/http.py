"""The HTTP side of the server engine (server.py): an httpx client with pooled connections that
streams each chat completion and retries what is worth retrying.

Why streaming: vLLM's server sends nothing for a request that waits in its queue, so a timeout on the
whole reply would count the time spent queued, and a request that timed out would be sent again to
the back of the queue. Streamed (`stream: true`, with `stream_options.include_usage` for the token
counts), a reply arrives chunk by chunk once the request runs. `timeout_s` is then a stall timeout:
no chunk for that long once the reply has started is a failure; before its first chunk a request
waits as long as the server answers `/health`.

A request that failed is never running twice: the client closes its connection before it retries,
and vLLM 0.32 aborts a request whose client disconnected (Starlette's StreamingResponse cancels the
stream's generator on `http.disconnect`, and `AsyncLLM.generate` aborts its request on that
cancellation, vllm/v1/engine/async_llm.py), which tests/test_server.py checks on a real server.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import httpx

from personalens.engines.base import Generation
from personalens.engines.chat.reasoning import Split, split_text, with_split
from personalens.engines.models.config import ServerConfig

log = logging.getLogger(__name__)

REFUSED_STATUSES = (400, 422)  # vLLM's validation errors: about the request, not the server
HEALTH_TIMEOUT_S = 30.0  # for one GET /health while a request waits for its first chunk

T = TypeVar("T")


class ServerError(RuntimeError):
    """The server could not answer a request (after retries, or with a non-retryable status)."""


class Refused(ServerError):
    """The server refused this one request (its message)."""


class Failed(ServerError):
    """This one request failed after its retries (connection errors, stalls, 5xx, an aborted reply);
    whether the server or the request is at fault, its caller asks /health."""


class _Retryable(Exception):
    pass


class ServerClient:
    """Pooled connections to one server, for one generate() call (an asyncio event loop's lifetime)."""

    def __init__(self, server: ServerConfig, connections: int):
        self._server = server
        # no bearer at all when the key's variable is unset or empty
        key = server.api_key or (os.environ.get(server.api_key_env) if server.api_key_env else None)
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._http = httpx.AsyncClient(
            base_url=server.base_url.rstrip("/"),
            headers=headers,
            # reads are timed here (stall timeout, health), not by httpx; no wait for a connection
            # from the pool (generate() never has more requests in flight), and one more for /health
            timeout=httpx.Timeout(server.timeout_s, connect=server.connect_timeout_s, read=None, pool=None),
            limits=httpx.Limits(max_connections=connections + 1, max_keepalive_connections=connections + 1),
        )
        self._health: tuple[float, bool] | None = None  # (when, healthy): one check serves every waiting request
        self._health_lock = asyncio.Lock()
        self._health_timeout = httpx.Timeout(HEALTH_TIMEOUT_S, connect=server.connect_timeout_s)
        self.reasoning_fields = 0  # replies that came with a `reasoning` field (the server split them)

    async def __aenter__(self) -> ServerClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self._http.aclose()

    async def get_json(self, route: str) -> Any:
        """One JSON GET, retried."""

        async def once():
            timeout = httpx.Timeout(self._server.timeout_s, connect=self._server.connect_timeout_s)
            response = await self._http.get(route, timeout=timeout)
            _check(response, "GET", route)
            return response.json()

        return await self._retried(f"GET {self._url(route)}", once)

    async def complete(self, body: dict[str, Any], opened: bool = False) -> Generation:
        """One chat completion, streamed, retried; a refused request raises `Refused`, one that
        failed after its retries `Failed`. `opened`: the prompt left the model inside its thinking
        (what a reply without a `reasoning` field is split by)."""
        return (await self.completed(body, opened))[0]

    async def completed(
        self, body: dict[str, Any], opened: bool = False, route: str = "/chat/completions"
    ) -> tuple[Generation, dict[str, Any]]:
        """`complete` on `route` (/completions: a prompt of token ids, whose text is the answer), with
        the reply as read: its `prompt_token_ids` and its choice's `token_ids` where the body asked for
        them (vLLM's `return_token_ids`)."""
        streamed = {**body, "stream": True, "stream_options": {"include_usage": True}}
        return await self._retried(f"POST {self._url(route)}", lambda: self._stream(streamed, opened, route))

    async def tokens(self, body: dict[str, Any]) -> list[int]:
        """vLLM's POST /tokenize (beside /v1) of a text or of chat messages: their token ids, retried."""

        async def once():
            response = await self._http.post(f"{self._root()}/tokenize", json=body)
            _check(response, "POST", "/tokenize")
            return list(response.json()["tokens"])

        return await self._retried(f"POST {self._root()}/tokenize", once)

    async def metrics(self) -> str | None:
        """The server's Prometheus text (GET /metrics beside /v1), or None where it has none; optional
        information, so asked once and not retried."""
        try:
            response = await self._http.get(f"{self._root()}/metrics", timeout=self._health_timeout)
        except httpx.HTTPError:
            return None
        return response.text if response.status_code == 200 else None

    async def healthy(self, fresh: bool = False) -> bool:
        """Whether GET /health (beside /v1) answers 200 now; unless `fresh`, shared by the requests
        that ask within a tenth of the stall timeout."""
        async with self._health_lock:
            now = time.monotonic()
            if fresh or self._health is None or now - self._health[0] > self._server.timeout_s / 10:
                try:
                    response = await self._http.get(f"{self._root()}/health", timeout=self._health_timeout)
                    ok = response.status_code == 200
                except httpx.HTTPError:
                    ok = False
                self._health = (now, ok)
            return self._health[1]

    async def _stream(self, body: dict[str, Any], opened: bool, route: str) -> tuple[Generation, dict[str, Any]]:
        async with self._http.stream("POST", route, json=body) as response:
            if response.status_code != 200:
                await response.aread()
                _check(response, "POST", route)
            if not response.headers.get("content-type", "").startswith("text/event-stream"):
                reply = json.loads(await response.aread())
            else:
                reply = await self._read_events(_lines(response))
        if "text" in reply["choices"][0]:  # a (non-streamed) reply of /completions
            reply["choices"][0]["message"] = {"content": reply["choices"][0]["text"]}
        # a /completions reply continues token ids after the thinking: its text is left whole (budget.py)
        generation = _generation(reply, self._server.base_url, opened, split=route != "/completions")
        self.reasoning_fields += bool(_reasoning_of(reply["choices"][0]["message"]))  # read by _generation
        return generation, reply

    async def _read_events(self, lines: AsyncIterator[str | None]) -> dict[str, Any]:
        text: list[str] = []
        thinking: list[str] = []
        ids: list[int] = []
        prompt_ids = None
        usage, finish, started = None, None, False
        pending: asyncio.Future | None = None
        try:
            while True:
                pending = pending or asyncio.ensure_future(anext(lines))
                done, _ = await asyncio.wait({pending}, timeout=self._server.timeout_s)
                if not done:
                    # queued in the server (no chunk yet) is no failure while the server is up
                    if not started and await self.healthy():
                        continue
                    why = "" if started else ", and the server does not answer /health"
                    raise _Retryable(f"no reply for {self._server.timeout_s:g} s{why}")
                line, pending = pending.result(), None
                if line is None:
                    raise _Retryable("the connection was closed before the reply ended (incomplete body)")
                if not line.startswith("data:"):
                    continue  # blank lines between events, keep-alive comments
                data = line[len("data:") :].strip()
                if data == "[DONE]":
                    # read to the body's end, so that the connection goes back to the pool
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(_drain(lines), self._server.timeout_s)
                    break
                try:
                    chunk = json.loads(data)
                except ValueError as err:
                    raise ServerError(f"{self._server.base_url}: unexpected line in a reply: {line[:300]!r}") from err
                if "error" in chunk:
                    # vLLM's error event carries the HTTP status it would have answered with: a
                    # request it refuses costs only itself, a fault of the server is retried
                    error = chunk["error"] if isinstance(chunk["error"], dict) else {}
                    message = _message(json.dumps(chunk))
                    if error.get("code") in REFUSED_STATUSES:
                        raise Refused(f"HTTP {error['code']} in the stream: {message}")
                    raise _Retryable(f"error in the stream: {message}")
                started = True
                prompt_ids = chunk.get("prompt_token_ids") or prompt_ids
                for choice in chunk.get("choices") or ():
                    delta = choice.get("delta") or {}
                    text.append(delta.get("content") or choice.get("text") or "")
                    thinking.append(_reasoning_of(delta))
                    ids += choice.get("token_ids") or ()
                    prompt_ids = choice.get("prompt_token_ids") or prompt_ids  # /completions: in the choice
                    finish = choice.get("finish_reason") or finish
                usage = chunk.get("usage") or usage
        finally:
            if pending is not None:  # a stall: the read still waiting is dropped with the connection
                pending.cancel()
                await asyncio.wait({pending})
        if finish == "abort":  # the server stopped the request (vLLM: its engine aborted it): no reply
            raise _Retryable("the server aborted the request mid-reply")
        message = {"content": "".join(text), "reasoning": "".join(thinking)}
        choice = {"message": message, "finish_reason": finish, "token_ids": ids}
        return {"choices": [choice], "usage": usage, "prompt_token_ids": prompt_ids}

    async def _retried(self, what: str, once: Callable[[], Awaitable[T]]) -> T:
        """`once()`, attempted again after a connection error, a cut body, a stall, 429 or 5xx."""
        attempts = self._server.retries + 1
        for attempt in range(attempts):
            try:
                return await once()
            except _Retryable as err:
                last_error = err
            except httpx.RemoteProtocolError as err:  # what urllib calls IncompleteRead
                last_error = _Retryable(f"the connection was cut mid-reply (incomplete body: {err})")
            except httpx.TimeoutException as err:
                last_error = _Retryable(f"timed out ({type(err).__name__})")
            except httpx.TransportError as err:
                last_error = _Retryable(f"{type(err).__name__}: {err}")
            if attempt + 1 < attempts:
                delay = self._server.backoff_s * 2**attempt
                log.warning(f"{what}: {last_error}; attempt {attempt + 2} of {attempts} in {delay:g} s")
                await asyncio.sleep(delay)
        raise Failed(f"{what} failed after {attempts} attempt(s): {last_error}")

    def _root(self) -> str:
        """The server's own routes (/health, /metrics) are beside /v1."""
        return self._server.base_url.rstrip("/").removesuffix("/v1")

    def _url(self, route: str) -> str:
        return self._server.base_url.rstrip("/") + route


async def _lines(response: httpx.Response) -> AsyncIterator[str | None]:
    """The stream's lines, then None at its end (a sentinel that `asyncio.wait` can return)."""
    async for line in response.aiter_lines():
        yield line
    yield None


async def _drain(lines: AsyncIterator[str | None]) -> None:
    async for _ in lines:
        pass


def _check(response: httpx.Response, method: str, route: str) -> None:
    """Raises for a status that is not 200: retryable (429, 5xx), refused (400, 422) or fatal."""
    status = response.status_code
    if status == 200:
        return
    detail = response.text[:2000]
    if status == 429 or status >= 500:
        raise _Retryable(f"HTTP {status}: {detail}")
    if status in REFUSED_STATUSES:
        raise Refused(f"HTTP {status}: {_message(detail)}")
    raise ServerError(f"{method} {response.request.url}: HTTP {status}: {detail}")


def _reasoning_of(message: dict) -> str:
    """A message's (or a streamed delta's) thinking: vLLM's `reasoning` field, `reasoning_content` in
    older releases (set only when the server runs a reasoning parser)."""
    return message.get("reasoning") or message.get("reasoning_content") or ""


def _generation(reply: dict, where: str, opened: bool = False, split: bool = True) -> Generation:
    """A reply as a generation, its thinking split from its answer (unless not `split`): by the
    server's reasoning parser where the reply has a `reasoning` field, else on its text, knowing whether
    the prompt `opened` the thinking (a reply cut inside thinking that a template opened carries no
    marker at all)."""
    try:
        usage = reply["usage"]
        choice = reply["choices"][0]
        generation = Generation(
            text=choice["message"]["content"] or "",
            prompt_tokens=usage["prompt_tokens"],
            completion_tokens=usage["completion_tokens"],
            # vLLM reports it only when served with --enable-prompt-tokens-details
            cached_tokens=(usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0,
            finish_reason=choice.get("finish_reason"),
        )
        thinking = _reasoning_of(choice["message"])
        counted = (usage.get("completion_tokens_details") or {}).get("reasoning_tokens")
    except (KeyError, IndexError, TypeError) as err:
        raise ServerError(f"{where}: unexpected reply {reply!r}") from err
    if not split:
        return generation
    if not thinking:  # a server without a reasoning parser: the text fallback
        return with_split(generation, split_text(generation.text, opened))
    # split by the server's parser; a reply cut before a word of answer ends in its thinking (with_split)
    if not generation.text.strip() and generation.finish_reason == "length":  # every token was thinking
        counted = generation.completion_tokens
    elif not counted:
        # vLLM counts the output's tokens between its start and end markers, so a template that opens
        # the thinking in the prompt (DeepSeek-R1's later ones, Qwen3's newer) gets 0: not counted
        counted = None
    return with_split(generation, Split(generation.text.lstrip(), thinking.strip(), reasoning_tokens=counted))


def _message(detail: str) -> str:
    """The message of an OpenAI-style error body (`{"error": {"message": ...}}`), else the body."""
    try:
        error = json.loads(detail)["error"]
        return str(error["message"] if isinstance(error, dict) else error)
    except (ValueError, KeyError, TypeError):
        return detail
