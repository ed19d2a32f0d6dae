"""Nothing a test starts outlives its module: after each test module, no process descended from this
pytest process and no thread of its own is alive that was not alive before the module, except what
session fixtures started (a shared engine, the test cluster), which lives until the session ends. A
thread is its own when it runs personalens' or the tests' code, or is not a daemon (it would keep the
process from exiting); a library's daemon threads (tqdm's monitor, an engine's helpers) and its thread
pools' idle workers (ended at exit by concurrent.futures) are the library's to end. A module that leaves one fails at its last test's teardown, naming the process or
thread and the test during which it appeared. Processes are read from /proc (Linux), threads from
`threading`."""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
# how long a leftover may take to end (a server stopping, a thread joining) before it counts
SETTLE_S = float(os.environ.get("PL_TEST_SETTLE_S", "10"))


def descendants() -> dict[int, str]:
    """pid -> command line of every live (not zombie) process descended from this one."""
    stats = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue  # ended meanwhile
            if fields[0] != "Z":  # state, ppid, ...
                stats[int(entry)] = int(fields[1])
    mine, me = {}, os.getpid()
    for pid in stats:
        seen, p = set(), pid
        while p in stats and p not in seen and p != me:
            seen.add(p)
            p = stats[p]
        if p == me and pid != me:
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    mine[pid] = f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:200]
            except OSError:
                continue
    return mine


def own(thread: threading.Thread) -> bool:
    """Whether `thread` runs personalens' or the tests' code (a module of the pytest root's, not an
    installed package), or would keep the process alive: a library's non-daemon thread, but for a
    thread pool's idle worker, which concurrent.futures ends at exit."""
    code = getattr(thread, "_target", None) or type(thread).run
    module = getattr(code, "__module__", "") or ""
    where = Path(getattr(sys.modules.get(module), "__file__", None) or "/")
    mine = where.is_relative_to(TRACKER.root) and "site-packages" not in where.parts
    return mine or (not thread.daemon and module != "concurrent.futures.thread")


def threads() -> dict[int, str]:
    """ident -> name of every live thread of its own but the main one."""
    main = threading.main_thread()
    return {t.ident: t.name for t in threading.enumerate() if t is not main and t.ident and own(t)}


@dataclass
class Leftovers:
    session: set[tuple[str, int]] = field(default_factory=set)  # started by session fixtures
    threads_seen_in: dict[int, str] = field(default_factory=dict)  # where each thread was first seen
    # per test, the last pid the kernel gave out before it and after it: what it started lies between
    tests: list[tuple[int, int, str]] = field(default_factory=list)
    root: Path = TESTS

    def snapshot(self) -> dict[tuple[str, int], str]:
        processes = {("process", p): name for p, name in descendants().items()}
        return {**processes, **{("thread", t): name for t, name in threads().items()}}

    def note(self, test: str) -> None:
        for ident in threads():
            self.threads_seen_in.setdefault(ident, test)

    def culprit(self, kind: str, key: int) -> str:
        """The test during which a process started (by its pid) or a thread was first seen."""
        if kind == "thread":
            return self.threads_seen_in.get(key, "a fixture's teardown")
        for first, last, test in reversed(self.tests):
            if first < key <= last or (last < first and (key > first or key <= last)):  # pids wrap around
                return test
        return "the module's last test"

    def left(self, before: dict[tuple[str, int], str]) -> dict[tuple[str, int], str]:
        """What is alive now that was not before, nor started by a session fixture, once SETTLE_S has
        given it time to end."""
        deadline = time.monotonic() + SETTLE_S
        while True:
            new = {k: n for k, n in self.snapshot().items() if k not in before and k not in self.session}
            if not new or time.monotonic() > deadline:
                return new
            time.sleep(0.2)


def last_pid() -> int:
    with open("/proc/sys/kernel/ns_last_pid") as f:
        return int(f.read())


TRACKER = Leftovers()


def pytest_configure(config):
    TRACKER.root = config.rootpath


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef, request):
    if fixturedef.scope != "session":
        yield
        return
    before = TRACKER.snapshot()
    yield
    TRACKER.session |= set(TRACKER.snapshot()) - set(before)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    first = last_pid()
    yield
    TRACKER.tests.append((first, last_pid(), item.nodeid))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    TRACKER.note(item.nodeid)  # before the teardown: the module's own check runs inside its last test's
    yield


@pytest.fixture(scope="module", autouse=True)
def _nothing_left_behind():
    before = TRACKER.snapshot()
    yield
    left = TRACKER.left(before)
    lines = [
        f"{kind} {key} ({name}), started during {TRACKER.culprit(kind, key)}" for (kind, key), name in left.items()
    ]
    assert not lines, "this module left behind:\n" + "\n".join(lines)
