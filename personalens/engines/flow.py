"""How many requests an engine keeps in flight: about what its KV cache runs at once. The rule of
every server engine (serving/engine.py), and of an in-process engine that is one copy of a model
beside server copies (vllm/local.py `capped`), so that every copy of a model is capped alike.

vLLM runs a request only while its KV cache holds the request's tokens; the others wait in the
server's queue. Waiting there costs no timeout (replies are streamed, serving/http.py), but every
waiting request holds a connection, and all of them are aborted at once if this process stops. So an
engine keeps at most

    the server's KV cache tokens / the call's mean (prompt tokens + max_tokens)

requests like a call's in flight, never more than `server.max_concurrency` (a managed server's
max_num_seqs) and never fewer than one. A request's reply is counted at the tokens replies of its
kind (its max_tokens and whether a grammar constrains it: in practice its role) have taken so far, at
most its max_tokens, and at max_tokens before the first such reply; so a judge whose replies take a few hundred of its
4,000 tokens gets many more requests in flight once its first replies are in. The prompt prefix
every request of the call shares (instructions, a system prompt) is counted once: the server's prefix
cache holds one copy of it. The KV cache size is the server's own (vLLM's /metrics,
`vllm:cache_config_info`: num_gpu_blocks x block_size); a server that does not report it gets
`max_concurrency`. Prompt tokens are estimated from the messages' characters at the tokens per
character this engine's server has reported so far. Every copy of a model (replicated.py) is capped
by this rule against its own cache: a server copy's from its /metrics, the in-process copy's from
its vLLM engine (num_gpu_blocks x block_size), at most its `max_num_seqs`.

An engine's calls may run at once, in different threads (lockstep cohorts: base.Engine.joins_calls),
and the cap holds for the engine over all of them (`InFlight`): each call's request takes a share of
the engine, one over that count for the call's requests, and the shares in flight never add up to
more than one. Two calls of like requests thus keep together what one of them would; calls of long
and of short requests each hold their requests' part of the cache.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction

from prometheus_client.parser import text_string_to_metric_families

from personalens.engines.base import Request

CACHE_INFO = "vllm:cache_config_info"
# before the first reply: fewer characters per token than English text's ~4, so that the first
# call's prompts are not underestimated
START_CHARS_PER_TOKEN = 3.0


def kv_cache_tokens(metrics: str) -> int | None:
    """Tokens the server's KV cache holds (every engine of it together), from its /metrics text;
    None when it does not say (not vLLM, or its cache not sized yet)."""
    total = 0
    try:
        for family in text_string_to_metric_families(metrics):
            for sample in family.samples if family.name == CACHE_INFO else ():
                blocks, size = sample.labels.get("num_gpu_blocks", ""), sample.labels.get("block_size", "")
                if blocks.isdigit() and size.isdigit():
                    total += int(blocks) * int(size)
    except ValueError:  # not Prometheus text
        return None
    return total or None


@dataclass
class PromptSizes:
    """Prompt tokens per character of the messages, learned from the server's usage reports (from
    the threads of an engine's concurrent calls: each update and read under its lock)."""

    chars: int = 0
    tokens: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, request: Request, prompt_tokens: int) -> None:
        if prompt_tokens > 0:
            chars = prompt_chars(request)
            with self._lock:
                self.chars += chars
                self.tokens += prompt_tokens

    def estimate(self, request: Request) -> int:
        chars = prompt_chars(request)
        with self._lock:
            seen_chars, seen_tokens = self.chars, self.tokens
        if seen_chars and seen_tokens:
            return round(chars * seen_tokens / seen_chars)
        return round(chars / START_CHARS_PER_TOKEN)


def prompt_chars(request: Request) -> int:
    return sum(len(str(m.get("content") or "")) for m in request.messages)


def _kind(request: Request) -> tuple[int, bool]:
    """What tells requests of one role apart: their reply budget and whether a grammar constrains it."""
    return request.sampling.reply_tokens, request.grammar is not None


@dataclass
class ReplySizes:
    """Completion tokens per reply, learned per kind of request (`_kind`) from the server's replies
    (from the threads of an engine's concurrent calls: each update under its lock)."""

    seen: dict[tuple[int, bool], tuple[int, int]] = field(default_factory=dict)  # kind -> (replies, tokens)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, request: Request, completion_tokens: int) -> None:
        with self._lock:
            replies, tokens = self.seen.get(_kind(request), (0, 0))
            self.seen[_kind(request)] = (replies + 1, tokens + completion_tokens)

    def expect(self, request: Request) -> int:
        """The mean of its kind's replies so far, at most its reply_tokens; reply_tokens before any."""
        replies, tokens = self.seen.get(_kind(request), (0, 0))
        budget = request.sampling.reply_tokens
        return min(budget, max(1, round(tokens / replies))) if replies else budget


def shared_prefix_chars(requests: Sequence[Request]) -> int:
    """Characters of the messages' text that every request of the call begins with."""
    if len(requests) < 2:
        return 0
    texts = ["\n".join(str(m.get("content") or "") for m in r.messages) for r in requests]
    return len(os.path.commonprefix(texts))


def needs(requests: Sequence[Request], prompts: PromptSizes, replies: ReplySizes) -> tuple[int, list[int]]:
    """The tokens the call's shared prefix holds once, and each request's other tokens at its end
    (its prompt beyond the prefix and its expected reply)."""
    shared = round(prompts.estimate(requests[0]) * shared_prefix_chars(requests) / max(1, prompt_chars(requests[0])))
    return shared, [max(0, prompts.estimate(r) - shared) + replies.expect(r) for r in requests]


def in_flight(kv_tokens: int | None, needs: Sequence[int], limit: int, shared: int = 0) -> int:
    """Requests to keep in flight: as many of mean size `needs` (tokens each may hold at its end) as
    `kv_tokens` holds beside one copy of the `shared` prefix, between 1 and `limit`; `limit` when the
    KV cache size is not known."""
    if kv_tokens is None or not needs:
        return limit
    mean = max(1.0, sum(needs) / len(needs))
    return max(1, min(limit, int(max(0, kv_tokens - shared) // mean)))


def share(count: int) -> Fraction:
    """What one request of a call that keeps `count` in flight takes of its engine (`InFlight`)."""
    return Fraction(1, max(1, count))


@dataclass(eq=False)
class _Waiter:
    share: Fraction
    wake: Callable[[], None] | None  # None: a `try_take` caller, which takes its share itself
    granted: bool = False


class InFlight:
    """The requests one engine has in flight, over all its calls, which may run at once in different
    threads: each request holds its call's `share`, and the shares held never add up to more than
    one (so any one request fits an engine with nothing in flight). A request that does not fit
    waits, first come first served, until finished ones make room; `try_take` is for a caller that
    has other work meanwhile (the in-process engine steps vLLM), `take` for a coroutine in its own
    thread's event loop, woken from whichever thread makes room. A `try_take` caller whose share does
    not fit is queued like a `take` and keeps its place until it takes it, so a call of large requests
    is not overtaken by later calls of smaller ones that fit the room it waits for; its next request
    queues anew, behind them (calls that keep asking take turns)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held = Fraction(0)
        self._waiters: deque[_Waiter] = deque()
        self._callers: dict[Hashable, _Waiter] = {}  # the `try_take` callers' places in `_waiters`

    @property
    def held(self) -> Fraction:
        with self._lock:
            return self._held

    def try_take(self, share: Fraction, caller: Hashable | None = None) -> bool:
        """Takes `share` if it fits now and nothing waits before it; whether it did. A `caller` (a
        call that asks again until it takes) that did not take it waits in line from then on: it takes
        it once it fits and nothing waits before it."""
        with self._lock:
            place = self._callers.get(caller) if caller is not None else None
            first = self._waiters[0] is place if place is not None else not self._waiters
            if not first or self._held + share > 1:
                if place is None and caller is not None:
                    self._waiters.append(self._callers.setdefault(caller, _Waiter(share, None)))
                return False
            if place is not None:
                self._waiters.popleft()
                del self._callers[caller]
            self._held += share
            self._grant()  # the coroutines it held back, up to the next caller in line
            return True

    def leave(self, caller: Hashable) -> None:
        """`caller` no longer waits (its call ended): the ones after it go on."""
        with self._lock:
            place = self._callers.pop(caller, None)
            if place is not None:
                self._waiters.remove(place)
                self._grant()

    async def take(self, share: Fraction) -> None:
        """Takes `share`, once it fits. Cancelled while it waits, it takes nothing (a share it was
        given meanwhile goes back)."""
        loop = asyncio.get_running_loop()
        woken = loop.create_future()

        # called under the lock while the waiter is queued, so while this coroutine (and its loop) runs
        waiter = _Waiter(share, lambda: loop.call_soon_threadsafe(_resolve, woken))
        with self._lock:
            if not self._waiters and self._held + share <= 1:
                self._held += share
                return
            self._waiters.append(waiter)
        try:
            await woken
        except BaseException:
            with self._lock:
                if not waiter.granted:
                    self._waiters.remove(waiter)
                    self._grant()  # it may have held back smaller shares behind it
            if waiter.granted:
                self.give(share)
            raise

    def give(self, share: Fraction) -> None:
        """Returns a finished request's `share`; waiters it makes room for go on."""
        with self._lock:
            self._held -= share
            self._grant()

    def _grant(self) -> None:
        """Gives the waiters at the front the shares that fit (the caller holds the lock)."""
        while self._waiters and self._waiters[0].wake is not None and self._held + self._waiters[0].share <= 1:
            waiter = self._waiters.popleft()
            self._held += waiter.share
            waiter.granted = True
            waiter.wake()


def _resolve(future: asyncio.Future) -> None:
    if not future.done():  # not cancelled meanwhile
        future.set_result(None)
