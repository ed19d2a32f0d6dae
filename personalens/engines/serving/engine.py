"""An engine for an OpenAI-compatible server (`vllm serve` on another node, or one personalens
started, managed.py): one generate() runs its batch as concurrent streamed /chat/completions
requests on pooled connections (serving/http.py), as many at a time as the server's KV cache holds
(engines/flow.py), at most `server.max_concurrency`.

Calls may run in several threads at once (`joins_calls`, for lockstep cohorts), each in its own event
loop and with its own connections; their requests share the server's batch. The in-flight cap is the
engine's, over all its calls together (engines/flow.py `InFlight`): a call's request takes one over
its call's count of the engine's budget, so calls of like requests keep together what one would,
and never more than `server.max_concurrency` requests are in flight from the engine, each call
holding at most that many connections.

A request the server refuses (HTTP 400 or 422: vLLM's answer to a prompt longer than the model's
context, or to a bad parameter) is answered as `rejected` and the others go on. So is a request that
failed after its retries while the server still answers /health: the call keeps every finished reply.
A server that does not answer /health once its requests failed, or answers 401/403/404, fails the
whole call, after the call's other requests have had their answers; so does a call whose requests
are all refused for one reason (base.check_refusals). A call to a server that personalens started
and that has exited fails with that server's exit, which its watcher requests as the command's stop
(processes.py), rather than with the connection errors it caused; a stop requested while requests
stream disconnects them (the server aborts them) and is raised.

Context endings are those of the in-process engine (simulate/lockstep.py): an engine whose config
names the model's tokenizer (`tokenizer` or `path`: a managed server's always do) has the model's
`chat_tokenizer`, read from its files as the server renders and tokenizes (chat/token_ids.py), and a
`max_model_len`, the config's or the one the server reports on /v1/models. The caller then measures
each prompt before it is sent, as it does in process, and ends on context a dialogue whose prompt
leaves less than its reply's room; the server takes the chat messages, not the ids. Without a
tokenizer, the server's own refusal of a prompt that does not fit still ends its dialogue on context
(base.Generation.over_context), but vLLM's server quietly lowers `max_tokens` to what the context
leaves, so replies near the end of the context are shorter than in process.

Reasoning replies end as in process (engines/chat/reasoning.py). A reply without a `reasoning` field
(a server started without `--reasoning-parser`) is split on its text, knowing from the chat tokenizer
whether the template's generation prompt opened the thinking (DeepSeek-R1 distills, recent Qwen3), so
a reply cut there, with no marker at all, ends in its thinking and is never sent on. A model whose
config names a `reasoning_parser` but whose server returned no `reasoning` field in the whole first
call is named in one warning line; for requests with a grammar (the judge's) it is an error, since
such a server applies the grammar from the first token and the judge never thinks (vLLM delays a
grammar to the end of the thinking only with `--reasoning-parser`)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
from collections.abc import Sequence
from typing import Any

from personalens.engines.base import Generation, OnFinished, Request, check_refusals, rejected
from personalens.engines.chat import budget, harmony
from personalens.engines.chat.messages import format_messages
from personalens.engines.chat.reasoning import opens_thinking
from personalens.engines.chat.token_ids import ChatTokenizer
from personalens.engines.flow import InFlight, PromptSizes, ReplySizes, in_flight, kv_cache_tokens, needs, share
from personalens.engines.models.config import ModelConfig, ModelConfigError
from personalens.engines.serving.http import Failed, Refused, ServerClient, ServerError
from personalens.engines.serving.processes import GRACE_S
from personalens.engines.spec_decode import SpecCounts, from_metrics
from personalens.engines.stop import Stop

log = logging.getLogger(__name__)

_PROMPT_TAIL = 64  # characters at a rendered prompt's end read to see whether it opened the thinking


# how long a failed call to a managed server waits for its watcher to report the server's exit (the
# launcher stops what is left of it first)
EXIT_WAIT_S = GRACE_S + 5


class ServerEngine:
    joins_calls = True  # base.Engine: concurrent calls share the server's batch and the in-flight cap

    def __init__(self, config: ModelConfig, stop: Stop | None = None):
        if config.server is None:
            raise ModelConfigError(f"model {config.name!r}: engine server needs server.base_url")
        self.name = config.name
        self._server = config.server
        self.speculative = bool(config.speculative)  # the server's own `--speculative-config` (spec_decode.py)
        self._stop = stop or Stop()
        # the server applies the chat template, which this side cannot read: only an explicit
        # `system_role: false` folds the system prompt
        self._system_role = config.system_role is not False
        self._model = config.server.model
        self._template_kwargs = config.template_kwargs
        self._max_model_len = config.max_model_len
        self._asked_models = False
        # the model's tokenizer, where the config names it, for measuring prompts (not for sending them)
        self.chat_tokenizer = ChatTokenizer.from_files(config) if config.tokenizer or config.path else None
        self._kv_tokens: int | None = None
        self._kv_asked = False
        self._kv_lock = threading.Lock()  # the first calls at once: one asks, the others wait for its answer
        self._sizes = PromptSizes()
        self._replies = ReplySizes()
        self._in_flight = InFlight()  # the engine's in-flight budget, which its concurrent calls share
        self._logged: int | None = None  # the last call's count in flight, logged when it changes
        self._parser = config.reasoning_parser
        # thinking is expected of every reply unless the template kwargs turn it off (Qwen3's switch)
        self._thinks = bool(config.reasoning_parser) and config.template_kwargs.get("enable_thinking") is not False
        self._opened: bool | None = None  # whether the generation prompt opens the thinking (`_opens`)
        self._fields_checked = False  # the first call answered has been looked at for `reasoning` fields
        self._fields_lock = threading.Lock()  # concurrent first calls: one looks
        self._markers = budget.markers(config.reasoning_parser)  # of replies with a thinking budget
        self._marker_ids: dict[str, list[int]] = {}  # the markers' ids, as the server's /tokenize gives them

    @property
    def max_model_len(self) -> int | None:
        """The model's context: the config's, else what the server reports (vLLM's /v1/models has
        `max_model_len`), asked once; None where neither says."""
        if self._max_model_len is None and not self._asked_models:
            self._asked_models = True
            self._max_model_len = asyncio.run(self._served_context())
        return self._max_model_len

    async def _served_context(self) -> int | None:
        async with ServerClient(self._server, 1) as client:
            model = await self._served_model(client)
            served = (await client.get_json("/models"))["data"]
        length = next((m.get("max_model_len") for m in served if m.get("id") == model), None)
        return length if isinstance(length, int) and length > 0 else None

    def generate(self, requests: Sequence[Request], on_finished: OnFinished | None = None) -> list[Generation]:
        if not requests:
            return []
        self._stop.check()
        self._ask_kv_cache()
        try:
            # an event loop per call; on Ctrl-C, a stop or an error, the requests not yet sent are
            # cancelled and those in flight disconnected (which the server aborts)
            generations = asyncio.run(self._stop.run(self._generate(requests, on_finished)))
        except ServerError:
            if self._server.managed and self._stop.wait(EXIT_WAIT_S):
                self._stop.check()  # the server's exit, not the connection errors it caused
            raise
        check_refusals(self.name, generations)
        return generations

    async def _generate(self, requests: Sequence[Request], on_finished: OnFinished | None) -> list[Generation]:
        connections = min(self._server.max_concurrency, len(requests))
        async with ServerClient(self._server, connections) as client:
            model = await self._served_model(client)
            each = share(self._slots(requests))
            failed: list[Failed] = []

            opened = self._opens(requests[0])

            async def one(request: Request) -> Generation:
                await self._in_flight.take(each)
                try:
                    if budget.budgeted(request):
                        generation = await self._thought(client, model, request, opened)
                    else:
                        generation = await client.complete(
                            chat_body(model, request, self._system_role, self._template_kwargs), opened
                        )
                except Refused as refusal:
                    return rejected(str(refusal))
                except Failed as failure:
                    failed.append(failure)
                    return rejected(str(failure))
                finally:
                    self._in_flight.give(each)
                self._sizes.add(request, generation.prompt_tokens)
                self._replies.add(request, generation.completion_tokens)
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
            generations = [task.result() for task in tasks]
            if failed and not await client.healthy(fresh=True):
                raise failed[0]  # the server, not the requests (generate() tells an exited one)
            self._check_reasoning_fields(requests, generations, client.reasoning_fields)
            return generations

    async def _thought(self, client: ServerClient, model: str, request: Request, opened: bool) -> Generation:
        """A reply with a thinking budget, in two requests (engines/chat/budget.py): the thinking as a chat
        completion that returns its token ids, then the answer as a completion of those ids."""
        kwargs = self._template_kwargs
        if not request.sampling.thinking_budget:  # 0: the answer at once, after an empty thinking
            messages = format_messages(request.messages, self._system_role)
            tokenize = {"model": model, "messages": messages, "add_generation_prompt": True}
            ids = await client.tokens({**tokenize, **({"chat_template_kwargs": kwargs} if kwargs else {})})
            ids += await self._marker(client, model, self._markers.forced if opened else self._markers.skip)
            return budget.joined(Generation("", len(ids), 0), await self._answer(client, model, request, ids))
        plain = dataclasses.replace(request, grammar=None, sampling=budget.thinking_sampling(request.sampling))
        body = chat_body(model, plain, self._system_role, kwargs) | thinking_fields(self._markers)
        first, reply = await client.completed(body, opened)
        choice = reply["choices"][0]
        action = budget.step(request, first, choice.get("finish_reason") == "length")
        if action in (budget.END, budget.KEEP):
            return first
        if action == budget.AGAIN:
            again = budget.answer_request(request, None)
            return await client.complete(chat_body(model, again, self._system_role, kwargs), opened)
        if reply.get("prompt_token_ids") is None:
            raise ServerError(f"{self._server.base_url} returned no token ids (vLLM's return_token_ids)")
        forced = await self._marker(client, model, self._markers.forced) if action == budget.FORCE else []
        ids = budget.continued(reply["prompt_token_ids"], choice["token_ids"], forced)
        return budget.joined(first, await self._answer(client, model, request, ids))

    async def _answer(self, client: ServerClient, model: str, request: Request, ids: list[int]) -> Generation:
        """The answer request continuing `ids`, on the server's /completions (a refusal answers for it)."""
        try:
            body = completion_body(model, budget.answer_request(request, ids))
            return budget.read_answer((await client.completed(body, route="/completions"))[0])
        except Refused as refusal:
            return rejected(str(refusal))

    async def _marker(self, client: ServerClient, model: str, text: str) -> list[int]:
        """A marker's token ids, asked of the server once."""
        if text not in self._marker_ids:
            tokenize = {"model": model, "prompt": text, "add_special_tokens": False}
            self._marker_ids[text] = await client.tokens(tokenize)
        return self._marker_ids[text]

    def _opens(self, request: Request) -> bool:
        """Whether the chat template's generation prompt leaves the model inside its thinking, read once
        from the first prompt rendered by the chat tokenizer (the generation prompt is the same for every
        prompt of a model and its template kwargs); False without a chat tokenizer."""
        if self._opened is None:
            rendered = self.chat_tokenizer.render(request.messages) if self.chat_tokenizer is not None else ""
            self._opened = opens_thinking(rendered[-_PROMPT_TAIL:])
        return self._opened

    def _check_reasoning_fields(
        self, requests: Sequence[Request], generations: Sequence[Generation], fields: int
    ) -> None:
        """At the first call answered: a model whose config names a reasoning parser and thinks, but
        whose server returned no `reasoning` field, is named (the module's docstring)."""
        answered = [g for g in generations if g.error is None]
        with self._fields_lock:
            looked, self._fields_checked = self._fields_checked, self._fields_checked or bool(answered)
        if looked or not self._thinks or not answered or fields:
            return
        why = (
            f"{self.name}: its config names reasoning_parser {self._parser}, but its server {self._server.base_url} "
            f"returned no `reasoning` field in {len(answered)} replies (started without --reasoning-parser "
            f"{self._parser}?)"
        )
        # a judge with a thinking budget gets its grammar in its answer request alone (engines/chat/budget.py)
        if any(r.grammar and not budget.budgeted(r) for r in requests) and self._parser != harmony.PARSER:
            raise ModelConfigError(
                f"{why}: such a server applies a grammar from the first token, so this judge would never think; "
                f"start it with --reasoning-parser {self._parser}"
            )
        log.warning(f"{why}; its replies are split on their text, and a reply cut in its thinking ends there")

    def _ask_kv_cache(self) -> None:
        """The server's KV cache size (its /metrics), asked by the engine's first call."""
        with self._kv_lock:
            if self._kv_asked:
                return
            text = asyncio.run(self._stop.run(self._metrics()))
            self._kv_tokens = kv_cache_tokens(text) if text else None
            self._kv_asked = True
        if self._kv_tokens is None:
            log.info(
                f"{self.name}: its server reports no KV cache size on /metrics; up to "
                f"{self._server.max_concurrency} requests in flight"
            )

    def spec_decode(self) -> SpecCounts | None:
        """The server's spec-decode counters since it started, from its /metrics (engines/spec_decode.py);
        None where it cannot be read or has none. Read even after the command's stop was requested."""
        text = asyncio.run(self._metrics())
        return from_metrics(text) if text else None

    async def _metrics(self) -> str | None:
        async with ServerClient(self._server, 1) as client:
            return await client.metrics()

    def _slots(self, requests: Sequence[Request]) -> int:
        """Requests like this call's that the server's KV cache runs at once (engines/flow.py), at most
        `server.max_concurrency`: each of the call's then takes one over that of the engine's budget."""
        shared, each = needs(requests, self._sizes, self._replies)
        n = in_flight(self._kv_tokens, each, self._server.max_concurrency, shared)
        if n != self._logged and self._kv_tokens is not None:
            log.info(
                f"{self.name}: its server's KV cache holds {self._kv_tokens:,} tokens: {min(n, len(requests))} of "
                f"{len(requests)} requests in flight (about {sum(each) // len(each):,} tokens each with its expected "
                f"reply, beside a shared prefix of {shared:,}; {n} such with the engine's other calls)"
            )
        self._logged = n
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
    reasoning parser reads too; a `reasoning_effort` among them goes in the request's own field too."""
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
    body.update(s.extras())  # top_k, min_p, repetition_penalty: vLLM's extensions; presence_penalty: OpenAI's
    if s.min_tokens:
        body["min_tokens"] = s.min_tokens  # a vLLM extension, sent only when asked for
    if request.grammar:
        body["structured_outputs"] = {"grammar": request.grammar}
    if template_kwargs:
        body["chat_template_kwargs"] = dict(template_kwargs)
        if "reasoning_effort" in template_kwargs:
            # vLLM's server reads the effort as a request field (gpt-oss's harmony system message), not
            # from the template kwargs; templates that render it read the kwargs
            body["reasoning_effort"] = template_kwargs["reasoning_effort"]
    return body


def thinking_fields(markers: budget.Markers) -> dict[str, Any]:
    """What makes a chat body a thinking request (engines/chat/budget.py), beside its sampling's: stopped
    at (and keeping) an end-of-thinking marker, special tokens kept in the text, its prompt's and
    output's token ids returned (vLLM's extensions)."""
    return {
        "stop": list(markers.stops),
        "include_stop_str_in_output": True,
        "skip_special_tokens": False,
        "return_token_ids": True,
    }


def completion_body(model: str, request: Request) -> dict[str, Any]:
    """The JSON body of a completion of `request.prompt_ids` (an answer request): the chat body's
    sampling and grammar, its prompt the ids."""
    body = chat_body(model, request, True)
    del body["messages"]
    return {**body, "prompt": list(request.prompt_ids or ())}
