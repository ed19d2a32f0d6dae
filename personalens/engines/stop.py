"""A command's one way to stop early: the `Stop` it owns.

Three things ask a command to stop: a signal it takes (SIGTERM from `scancel` or a node's shutdown,
SLURM's warning signal before the time limit), a managed vLLM server that exits while it is needed
(its watcher thread, serving/processes.py), and the command's own failures. Each calls
`Stop.request`; every engine checks the stop while it waits for replies (an in-process engine at each
step, a server engine while its requests stream, a replicated engine while its parts run) and raises
what was requested, so the command unwinds from wherever it waits, its part files closed, and a rerun
resumes. What the command started (managed servers) is stopped by `close`, which the command calls
when it ends, however it ends.

`request` only assigns attributes: a signal handler may call it at any point of the main thread, since
it takes no lock that the interrupted code could hold. For the same reason Ctrl-C (SIGINT) is one of
the signals a command takes (`COMMAND_SIGNALS`) rather than Python's KeyboardInterrupt, which is raised
wherever the main thread happens to be; and it is taken even where the command inherited SIGINT as
ignored (a command started with `&` by a shell without job control, as batch scripts and CI runners
are), so that `kill -INT` and `scancel --signal=INT` always stop it in order. A second Ctrl-C, for a
command busy where it does not look at its stop (a model loading), raises KeyboardInterrupt, except
inside an `uninterrupted` block (a server being started and recorded), where it waits for the block's
end. `close` ignores these signals while it stops what the command started, so that it always finishes.
"""

from __future__ import annotations

import asyncio
import atexit
import signal
import threading
import time
from collections.abc import Callable, Coroutine, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

from personalens.errors import PersonalensError

T = TypeVar("T")

POLL_S = 0.2  # how often a wait looks at the stop
# SLURM's warning signal before the time limit (slurm/*.sbatch ask for SIGUSR1): exit 75 (EX_TEMPFAIL,
# "try again"), which the batch script takes as stopped and resumable and requeues the job on; any
# other signal N: 128 + N, as shells report it
RESUMABLE = 75
EXIT_STATUSES = {signal.SIGUSR1: RESUMABLE}
# the signals a command that loads models turns into a stop: scancel and a node's shutdown, Ctrl-C, and
# SLURM's warning signal
COMMAND_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)


class Stopped(PersonalensError):
    """The command stopped on request; what it finished is written, and running it again resumes.
    `exit_status` is what the process exits with (128 + N for signal N, as shells report it)."""

    def __init__(self, reason: str, exit_status: int):
        super().__init__(reason)
        self.exit_status = exit_status


class Stop:
    def __init__(self) -> None:
        self.error: BaseException | None = None  # what `check` raises once a stop is requested
        self._cleanups: list[Callable[[], None]] = []
        self._closing = False
        self._holding = 0  # depth of `uninterrupted` blocks
        self._interrupt_owed = False  # a second Ctrl-C that arrived inside one

    @property
    def requested(self) -> bool:
        return self.error is not None

    def request(self, error: BaseException) -> None:
        """Asks the command to stop with `error`; the first request wins."""
        if self.error is None:
            self.error = error

    def check(self) -> None:
        """Raises the requested error, if any."""
        if self.error is not None:
            raise self.error

    def wait(self, seconds: float) -> bool:
        """Sleeps up to `seconds`, less once a stop is requested; whether one is."""
        deadline = time.monotonic() + seconds
        while not self.requested and (left := deadline - time.monotonic()) > 0:
            time.sleep(min(POLL_S, left))
        return self.requested

    async def until_requested(self) -> None:
        while not self.requested:
            await asyncio.sleep(POLL_S)

    async def run(self, work: Coroutine[Any, Any, T]) -> T:
        """Awaits `work`, cancelled (its requests disconnected) as soon as a stop is requested, which
        is then raised."""
        task = asyncio.ensure_future(work)
        watch = asyncio.ensure_future(self.until_requested())
        try:
            await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watch.cancel()
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if task.cancelled():
            self.check()
        return task.result()

    def at_close(self, cleanup: Callable[[], None]) -> None:
        """Runs `cleanup` when the command ends (`close`, or this process's exit for a command that
        never called it)."""
        if not self._cleanups:
            atexit.register(self.close)
        self._cleanups.append(cleanup)

    def close(self) -> None:
        """Runs the cleanups, the latest first, once each. On the main thread, `COMMAND_SIGNALS` are
        ignored meanwhile: one arriving while the command's servers are being stopped would otherwise
        end the process with some of them not yet stopped, and the command is ending anyway. (Masking
        would not do: a signal sent to the process reaches whichever thread does not mask it, and
        Python runs its handler on the main thread.)"""
        if self._closing:
            return
        self._closing = True
        main = threading.current_thread() is threading.main_thread()
        before = {s: signal.signal(s, signal.SIG_IGN) for s in COMMAND_SIGNALS} if main else {}
        try:
            while self._cleanups:
                self._cleanups.pop()()
        finally:
            self._closing = False
            for s, previous in before.items():
                signal.signal(s, previous)

    @contextmanager
    def uninterrupted(self) -> Iterator[None]:
        """A block that a second Ctrl-C does not cut short (starting a process and recording it, so that
        `close` stops it): its KeyboardInterrupt is raised when the block ends."""
        self._holding += 1
        try:
            yield
        finally:
            self._holding -= 1
        if not self._holding and self._interrupt_owed:
            self._interrupt_owed = False
            raise KeyboardInterrupt

    @contextmanager
    def on_signals(self, signals: Sequence[signal.Signals] = COMMAND_SIGNALS) -> Iterator[Stop]:
        """While the block runs, each of `signals` requests a stop (exit status `EXIT_STATUSES`, else
        128 + N), whatever handling the process inherited; a second SIGINT raises KeyboardInterrupt.
        The handlers before are restored after it. Outside the main thread, where Python takes no
        handlers, it installs none."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return

        def handler(signum: int, frame: object) -> None:
            if signum == signal.SIGINT and self.requested:
                if self._holding:
                    self._interrupt_owed = True
                    return
                raise KeyboardInterrupt
            name = signal.Signals(signum).name
            self.request(Stopped(f"stopped by {name}", EXIT_STATUSES.get(signum, 128 + signum)))

        before = {s: signal.signal(s, handler) for s in signals}
        try:
            yield self
        finally:
            for s, previous in before.items():
                signal.signal(s, previous)
