"""An engine for an OpenAI-compatible server (`vllm serve` on another node, or one personalens
started, managed.py): one generate() runs its batch as concurrent streamed /chat/completions
requests on pooled connections (server_http.py), as many at a time as the server's KV cache holds
(server_flow.py), at most `server.max_concurrency`.

A request the server refuses (HTTP 400 or 422: vLLM's answer to a prompt longer than the model's
context, or to a bad parameter) is answered as `rejected` and the others go on; a server that cannot
be reached, or answers 401/403/404, fails the whole call, after the call's other requests have had
their answers. A call to a server that personalens started and that has exited fails with that
server's exit (server_processes.py) rather than with the connection errors it caused."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from personalens.engines.base import Generation, OnFinished, Request, rejected
from personalens.engines.chat import format_messages
from personalens.engines.config import ModelConfig, ModelConfigError
from personalens.engines.server_flow import PromptSizes, in_flight, kv_cache_tokens
from personalens.engines.server_http import Refused, ServerClient, ServerError
from personalens.engines.server_processes import ServerExited, exit_of

log = logging.getLogger(__name__)


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
        self._template_kwargs = config.template_kwargs
        self._kv_tokens: int | None = None
        self._kv_asked = False
        self._sizes = PromptSizes()
        self._in_flight: int | None = None  # the last call's, logged when it changes

    def generate(self, requests: Sequence[Request], on_finished: OnFinished | None = None) -> list[Generation]:
        if not requests:
            return []
        try:
            # an event loop per call; on Ctrl-C or an error, the requests not yet sent are cancelled
            # and those in flight disconnected (which the server aborts)
            return asyncio.run(self._generate(requests, on_finished))
        except ServerError as err:
            exited = exit_of(self._server.base_url)
            if exited is not None:
                raise ServerExited(exited) from err
            raise

    async def _generate(self, requests: Sequence[Request], on_finished: OnFinished | None) -> list[Generation]:
        connections = min(self._server.max_concurrency, len(requests))
        async with ServerClient(self._server, connections) as client:
            model = await self._served_model(client)
            slots = asyncio.Semaphore(await self._slots(client, requests, connections))

            async def one(request: Request) -> Generation:
                async with slots:
                    try:
                        generation = await client.complete(
                            chat_body(model, request, self._system_role, self._template_kwargs)
                        )
                    except Refused as refusal:
                        return rejected(str(refusal))
                    self._sizes.add(request, generation.prompt_tokens)
                    return generation

            tasks = [asyncio.ensure_future(one(r)) for r in requests]
            for finished in asyncio.as_completed(tasks):
                try:
                    done: Generation | None = await finished
                except ServerError:
                    done = None  # raised below, once every request has had its answer
                if on_finished is not None:
                    # from this thread, so callers need no locks
                    on_finished(1, done.completion_tokens if done else 0)
            return [task.result() for task in tasks]

    async def _slots(self, client: ServerClient, requests: Sequence[Request], limit: int) -> int:
        """Requests of this call to keep in flight (server_flow.py); the server's KV cache size is
        asked once."""
        if not self._kv_asked:
            self._kv_asked = True
            text = await client.metrics()
            self._kv_tokens = kv_cache_tokens(text) if text else None
            if self._kv_tokens is None:
                log.info(
                    f"{self.name}: its server reports no KV cache size on /metrics; up to {limit} requests in flight"
                )
        needs = [self._sizes.estimate(r) + r.sampling.max_tokens for r in requests]
        n = in_flight(self._kv_tokens, needs, limit)
        if n != self._in_flight and self._kv_tokens is not None:
            log.info(
                f"{self.name}: its server's KV cache holds {self._kv_tokens:,} tokens: {n} of {len(requests)} "
                f"requests in flight (about {sum(needs) // len(needs):,} tokens each with its whole reply)"
            )
        self._in_flight = n
        return n

    async def _served_model(self, client: ServerClient) -> str:
        if self._model is None:
            served = [m["id"] for m in (await client.get_json("/models"))["data"]]
            if len(served) != 1:
                raise ServerError(f"{self._server.base_url} serves {served}; set server.model to one of them")
            self._model = served[0]
        return self._model


def chat_body(
    model: str, request: Request, system_role: bool, template_kwargs: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The JSON body of one chat completion; grammars use vLLM's structured-outputs extension, and
    the model's chat_template_kwargs (enable_thinking, ...) vLLM's `chat_template_kwargs`, which its
    reasoning parser reads too."""
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
    if template_kwargs:
        body["chat_template_kwargs"] = dict(template_kwargs)
    return body
