"""One engine over several engines of one model (its own and its copies, `replicas`: placement/layout.py):
a generate() splits the batch among them and runs the parts side by side.

A request with an `affinity` (what identifies its conversation) goes to the copy a stable hash of
it picks, every time, so a dialogue's next prompt finds its history in that copy's prefix cache;
requests without one go round-robin, across calls. Each part runs in a thread of its own (an
in-process vLLM call blocks its thread; a server engine runs its own event loop per call), and the
parts' `on_finished` reports reach the caller from the calling thread only, as callers assume. A
request a copy refuses stays one `rejected` generation; a copy's failure (a dead server: its
ServerExited line) fails the call with that copy's error. A call that fails, is interrupted or sees
the command's stop tells its other parts to stop (each at its next finished request, the rest of its
batch aborted) and waits for them, so that no engine is still answering when the call has ended.

Calls may run in several threads at once (lockstep cohorts) where every copy takes concurrent calls
(`joins_calls`): each call has its own part threads and reports, and the copies share their batches
between the calls' parts. Two calls may take round-robin turns in between each other (the counter
is one for the engine, and each `next` on it is atomic), which changes only which copy answers a
request without affinity.

All copies are one model config: prompt ids made with the first engine's `chat_tokenizer` and its
`max_model_len` hold for every copy (server copies take the messages the requests also carry).
"""

from __future__ import annotations

import hashlib
import itertools
import queue
import threading
from collections.abc import Sequence

from personalens.engines.base import Engine, Generation, OnFinished, Request
from personalens.engines.spec_decode import SpecCounts
from personalens.engines.stop import POLL_S, Stop


def copy_of(affinity: str, copies: int) -> int:
    """The copy a conversation's requests go to: stable across calls, processes and machines."""
    return int.from_bytes(hashlib.sha256(affinity.encode()).digest()[:8], "big") % copies


def split(requests: Sequence[Request], copies: int, turn: itertools.count) -> list[list[int]]:
    """The indices of `requests` each copy answers, in request order: by affinity, else the next
    copy of `turn` (a counter kept across calls)."""
    parts: list[list[int]] = [[] for _ in range(copies)]
    for i, r in enumerate(requests):
        parts[copy_of(r.affinity, copies) if r.affinity is not None else next(turn) % copies].append(i)
    return parts


class _Stopped(Exception):
    """Raised inside a part's engine call (from its `on_finished`) once the call has failed elsewhere."""


class ReplicatedEngine:
    def __init__(self, engines: Sequence[Engine], stop: Stop | None = None):
        if not engines:
            raise ValueError("a replicated engine needs at least one engine")
        self.engines = tuple(engines)
        self._stop = stop or Stop()
        self.name = engines[0].name
        self.chat_tokenizer = getattr(engines[0], "chat_tokenizer", None)
        self.max_model_len = getattr(engines[0], "max_model_len", None)
        self._turn = itertools.count()
        # base.Engine: concurrent calls are safe where every copy takes them
        self.joins_calls = all(getattr(e, "joins_calls", False) for e in self.engines)
        self.speculative = getattr(engines[0], "speculative", False)  # one model config: every copy's

    def generate(self, requests: Sequence[Request], on_finished: OnFinished | None = None) -> list[Generation]:
        split_up = split(requests, len(self.engines), self._turn)
        parts = [(k, e, p) for k, (e, p) in enumerate(zip(self.engines, split_up)) if p]
        if not parts:
            return []
        if len(parts) == 1:  # one engine's call (the whole batch, in order): in this thread
            _, engine, part = parts[0]
            return _checked(engine, engine.generate(requests, on_finished), len(part))
        replies: list[Generation | None] = [None] * len(requests)
        reports: queue.SimpleQueue = queue.SimpleQueue()
        stop = threading.Event()

        def run(k: int, engine: Engine, part: list[int]) -> None:
            def finished(n: int, tokens: int) -> None:
                if stop.is_set():
                    raise _Stopped
                reports.put(("finished", n, tokens))

            try:
                got = _checked(engine, engine.generate([requests[i] for i in part], finished), len(part))
                for i, gen in zip(part, got):
                    replies[i] = gen
                reports.put(("done", k, None))
            except BaseException as err:  # handed to the calling thread, which raises it
                reports.put(("failed", k, err))

        threads = [
            threading.Thread(target=run, args=(k, engine, part), name=f"{self.name} engine {k}", daemon=True)
            for k, engine, part in parts
        ]
        for thread in threads:
            thread.start()
        pending = len(parts)
        try:
            while pending:
                try:
                    what, a, b = reports.get(timeout=POLL_S)
                except queue.Empty:
                    self._stop.check()
                    continue
                if what == "finished":
                    if on_finished is not None:
                        on_finished(a, b)
                    continue
                pending -= 1
                if what == "failed" and not isinstance(b, _Stopped):
                    raise b
        finally:
            stop.set()
            for thread in threads:
                thread.join()
        return replies

    def spec_decode(self) -> SpecCounts | None:
        """The copies' spec-decode counters summed (engines/spec_decode.py); None where any copy's
        cannot be read, as a sum without it would not be the model's."""
        counts = [engine.spec_decode() for engine in self.engines]
        return None if None in counts else sum(counts, SpecCounts())

    def close(self) -> None:
        """Frees each copy that holds anything here (the in-process engine); the copies' servers are
        stopped by the loader that started them."""
        for engine in self.engines:
            close = getattr(engine, "close", None)
            if close is not None:
                close()


def _checked(engine: Engine, got: list[Generation], n: int) -> list[Generation]:
    if len(got) != n:
        raise RuntimeError(f"engine {engine.name} returned {len(got)} replies for {n} requests")
    return got
