"""One worker per engine: each runs its engine's calls one at a time, in the order they were queued,
so that calls to different engines run side by side (an engine's generate() blocks its thread: an
in-process vLLM call, a server engine's own event loop). An engine that joins concurrent calls
(`joins_calls`, engines/base.py) gets each call in a thread of its own at once instead: a call queued
while another runs joins its batch, so that one cohort's requests fill the engine while another's
last replies finish. Results reach the caller's thread only.

With a single engine there is nothing to overlap, and its calls run in the caller's thread as they
are queued. The command's stop (engines/stop.py) reaches the caller through the engines, which check
it in their own threads and raise it as a failed call. A failed call fails the caller's `next()`; leaving the `with` block (after a failure or an
interrupt) stops the other workers: a call still running is told to stop at its next finished
request (`stopped` raises `Abandoned` from its `on_finished`), queued calls are dropped, and the
block ends once no engine is still answering, or after `JOIN_S` at most: a thread still in its
engine then (a long reply) is left to end with the command (a daemon) and named in the log."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Hashable, Iterable
from typing import Any

from personalens.engines.base import Engine

log = logging.getLogger(__name__)

JOIN_S = 60.0  # the longest leaving the block waits for the workers' engine calls to end


class Abandoned(Exception):
    """Raised inside an engine call (from its `on_finished`) once the run has failed or been stopped."""


class EngineWorkers:
    def __init__(self, engines: Iterable[Engine]):
        distinct = {id(e): e for e in engines}
        self._inline = len(distinct) < 2
        self._stop = threading.Event()
        self._results: queue.SimpleQueue = queue.SimpleQueue()
        self._queues: dict[int, queue.SimpleQueue] = {}
        self._threads: list[threading.Thread] = []
        self._pending = 0
        if not self._inline:
            for key, engine in distinct.items():
                if getattr(engine, "joins_calls", False):
                    continue  # a thread per call (submit)
                self._queues[key] = jobs = queue.SimpleQueue()
                thread = threading.Thread(target=self._work, args=(jobs,), name=f"lockstep {engine.name}", daemon=True)
                self._threads.append(thread)
                thread.start()

    def submit(self, engine: Engine, tag: Hashable, work: Callable[[], Any]) -> None:
        """Queue `work` (a call to `engine`); `next()` returns its result with `tag`."""
        self._pending += 1
        if self._inline:
            self._results.put(_run(tag, work))
        elif id(engine) in self._queues:
            self._queues[id(engine)].put((tag, work))
        else:
            self._threads = [t for t in self._threads if t.is_alive()]
            thread = threading.Thread(
                target=self._answer, args=(tag, work), name=f"lockstep {engine.name} {tag}", daemon=True
            )
            self._threads.append(thread)
            thread.start()

    @property
    def busy(self) -> bool:
        """Whether a queued call's result has not been taken by `next()` yet."""
        return self._pending > 0

    def next(self) -> tuple[Hashable, Any]:
        """The next finished call's tag and result, in the order they finished; a failed call raises."""
        tag, error, value = self._results.get()
        self._pending -= 1
        if error is not None:
            raise error
        return tag, value

    def stopped(self) -> None:
        """Raises `Abandoned` once the run is stopping: for the engines' `on_finished`."""
        if self._stop.is_set():
            raise Abandoned

    def __enter__(self) -> EngineWorkers:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for jobs in self._queues.values():
            jobs.put(None)
        deadline = time.monotonic() + JOIN_S
        for thread in self._threads:
            thread.join(max(deadline - time.monotonic(), 0.0))
        left = [t.name for t in self._threads if t.is_alive()]
        if left:
            log.warning(f"engine calls still running {JOIN_S:g} s after the run stopped, left to end with it: {left}")

    def _work(self, jobs: queue.SimpleQueue) -> None:
        while (job := jobs.get()) is not None:
            self._answer(*job)

    def _answer(self, tag: Hashable, work: Callable[[], Any]) -> None:
        self._results.put((tag, Abandoned(), None) if self._stop.is_set() else _run(tag, work))


def _run(tag: Hashable, work: Callable[[], Any]) -> tuple[Hashable, BaseException | None, Any]:
    try:
        return tag, None, work()
    except BaseException as err:  # handed to the caller's thread, which raises it
        return tag, err, None
