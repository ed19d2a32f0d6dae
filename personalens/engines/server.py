"""An engine for an OpenAI-compatible server (`vllm serve` on another node, or one personalens
started, managed.py): one generate() runs its batch as concurrent streamed /chat/completions
requests on pooled connections (server_http.py), at most `server.max_concurrency` at a time.

A request the server refuses (HTTP 400 or 422: vLLM's answer to a prompt longer than the model's
context, or to a bad parameter) is answered as `rejected` and the others go on; a server that cannot
be reached, or answers 401/403/404, fails the whole call, after the call's other requests have had
their answers. A call to a server that personalens started and that has exited fails with that
server's exit (server_processes.py) rather than with the connection errors it caused."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from personalens.engines.base import Generation, OnFinished, Request, rejected
from personalens.engines.chat import format_messages
from personalens.engines.config import ModelConfig, ModelConfigError
from personalens.engines.server_http import Refused, ServerClient, ServerError
from personalens.engines.server_processes import ServerExited, exit_of


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
            slots = asyncio.Semaphore(connections)

            async def one(request: Request) -> Generation:
                async with slots:
                    try:
                        return await client.complete(chat_body(model, request, self._system_role))
                    except Refused as refusal:
                        return rejected(str(refusal))

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

    async def _served_model(self, client: ServerClient) -> str:
        if self._model is None:
            served = [m["id"] for m in (await client.get_json("/models"))["data"]]
            if len(served) != 1:
                raise ServerError(f"{self._server.base_url} serves {served}; set server.model to one of them")
            self._model = served[0]
        return self._model


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
