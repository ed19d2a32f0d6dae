"""The lock an in-process engine's concurrent calls take in turn (engines/vllm/local.py)."""

from __future__ import annotations

import threading


class TurnLock:
    """A lock its threads take in turn, in the order they asked: a call that steps vLLM again and
    again cannot keep another call from adding its requests or taking its replies between its steps
    (a plain Lock lets the thread that releases it take it again first)."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._next = 0  # the next ticket handed out
        self._serving = 0  # the ticket that holds the lock
        self._gone: set[int] = set()  # tickets whose thread stopped waiting (an interrupt)

    def __enter__(self) -> None:
        with self._changed:
            ticket, self._next = self._next, self._next + 1
            try:
                while ticket != self._serving:
                    self._changed.wait()
            except BaseException:  # interrupted while it waited: its turn passes, or ends at once
                if ticket == self._serving:
                    self._pass()
                else:
                    self._gone.add(ticket)
                raise

    def __exit__(self, *exc: object) -> None:
        with self._changed:
            self._pass()

    def _pass(self) -> None:
        """The turn to the next ticket still waiting (the caller holds `_changed`)."""
        self._serving += 1
        while self._serving in self._gone:
            self._gone.remove(self._serving)
            self._serving += 1
        self._changed.notify_all()
