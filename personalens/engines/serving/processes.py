"""The processes of the vLLM servers personalens starts (managed.py), held by the command's `Servers`:
each behind the launcher (launcher.py), all waited for together until each answers as itself, watched
while the command runs, and stopped when the command ends, however it ends (its `Stop` closes them);
the launcher also stops its server when personalens is killed outright (SIGKILL).

A server that exits while the command needs it stops the command at once, with one line: the model,
the exit status, the last lines of its log and the log's path. Its watcher thread requests the
command's stop with that line (`ServerExited`); the engine waiting on it raises it at its next check,
and the command ends with it (exit status 2), its part files closed, so that a resumed run finishes.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from personalens.engines.stop import Stop
from personalens.errors import PersonalensError

log = logging.getLogger(__name__)

GRACE_S = 10.0  # between SIGTERM and SIGKILL when a server is stopped
POLL_S = 1.0  # between two rounds of health checks while servers load
TAIL_LINES = 5  # of a server's log, in the line that reports its exit
PORT_TAKEN = "Address already in use"  # what vLLM's server prints when its port was taken before it bound it
# set in every server process (children included), so a run's servers can be found (`grep` /proc/*/environ)
MARKER_ENV = "PERSONALENS_SERVER_LOG"


class ServerStartError(PersonalensError):
    """A managed server died or did not become healthy in time."""


class ServerExited(PersonalensError):
    """A managed server exited while the command needed it."""


@dataclass
class Launched:
    """One command started behind the launcher. `key` and `model` (the served model name) make
    `answers` check that the server on `port` is this one, not another that took the port."""

    name: str
    process: subprocess.Popen  # the launcher
    log: Path
    port: int
    key: str | None = field(default=None, repr=False)
    model: str | None = None
    log_start: int = 0  # where this launch's output begins in `log` (a relaunch appends to it)
    stopping: bool = False  # set before personalens stops it: its exit is then no failure

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def answers(self) -> str | None:
        """None when this server answers on its port as itself; else what is missing."""
        root = f"http://127.0.0.1:{self.port}"
        try:
            if httpx.get(f"{root}/health", timeout=5).status_code != 200:
                return "no healthy answer on /health"
            if self.key is None:
                return None
            models = httpx.get(f"{root}/v1/models", headers={"Authorization": f"Bearer {self.key}"}, timeout=5)
        except httpx.HTTPError:
            return "no answer on /health"
        if models.status_code != 200:
            return f"port {self.port} answers /health, but /v1/models refuses its key (HTTP {models.status_code})"
        try:
            served = [m.get("id") for m in models.json().get("data", [])]
        except (ValueError, AttributeError):  # not an OpenAI models list: another program's port
            return (
                f"port {self.port} answers /health, but /v1/models is not a models list: port taken by another server"
            )
        if self.model not in served:
            return f"port {self.port} answers /health, but serves {served}, not {self.model}"
        return None

    def lost_port(self) -> bool:
        """Whether this launch ended because its port was taken before vLLM bound it."""
        return PORT_TAKEN in _log_since(self.log, self.log_start)

    def exit_line(self, when: str) -> str:
        return (
            f"the vLLM server of {self.name} exited with {describe_status(self.process.returncode)} {when}; "
            f"log {self.log}, its last lines: {_tail(self)}"
        )


def describe_status(status: int | None) -> str:
    """An exit status in words: the launcher exits with 128 + N when its server was killed by signal N."""
    if status is None:
        return "no status"
    if status < 0:
        return f"status {status} (the launcher was killed by {signal.Signals(-status).name})"
    if status > 128 and status - 128 in signal.valid_signals():
        return f"status {status} (killed by {signal.Signals(status - 128).name})"
    return f"status {status}"


class Servers:
    """The managed servers of one command: launched behind the launcher, waited for together, watched
    while the command runs and stopped when it ends (`stop.close()`, which the command calls however
    it ends). A server that exits while it is needed requests the command's `stop` with its exit line
    (`ServerExited`), which every engine raises at its next check."""

    def __init__(self, stop: Stop):
        self.stop = stop
        self._running: list[Launched] = []
        self._lock = threading.Lock()  # the watcher threads' and this thread's view of `_running`
        _no_proxy_for_this_machine()
        stop.at_close(self.stop_all)

    def launch(
        self,
        name: str,
        command: Sequence[str],
        env: Mapping[str, str],
        log: Path,
        port: int,
        grace: float = GRACE_S,
        *,
        key: str | None = None,
        model: str | None = None,
    ) -> Launched:
        """Starts `command` behind the launcher, its output appended to `log`."""
        log.parent.mkdir(parents=True, exist_ok=True)
        watchdog = [sys.executable, "-m", "personalens.engines.serving.launcher", "--parent", str(os.getpid())]
        # started and recorded in one piece, so that `stop_all` knows every launcher that runs
        with self.stop.uninterrupted(), open(log, "a") as out:
            start = out.tell()
            # a session of its own: a Ctrl-C at the terminal reaches personalens, which stops it in order
            process = subprocess.Popen(
                [*watchdog, "--grace", str(grace), "--", *command],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=dict(env),
                start_new_session=True,
            )
            launched = Launched(name, process, log, port, key=key, model=model, log_start=start)
            with self._lock:
                self._running.append(launched)
        return launched

    def wait_ready(
        self,
        servers: Sequence[Launched],
        timeout: float,
        relaunch: Callable[[int], Launched] | None = None,
        tries: int = 3,
    ) -> list[Launched]:
        """Waits for every server together until each answers as itself, then watches them. A server
        that exits first fails the wait at once, unless it lost its port: then `relaunch(i)` starts
        the i-th again (on another port), up to `tries` times. A stop requested meanwhile is raised.
        Returns the servers, relaunched ones replaced."""
        servers, ready, lost = list(servers), [False] * len(servers), [0] * len(servers)
        missing = [""] * len(servers)
        t0 = time.monotonic()
        while True:
            self.stop.check()
            for i, server in enumerate(servers):
                if ready[i]:
                    continue
                if server.process.poll() is not None:
                    if relaunch is not None and lost[i] < tries and server.lost_port():
                        lost[i] += 1
                        self._forget(server)
                        servers[i] = relaunch(i)
                        log.warning(
                            f"port {server.port} of {server.name}'s server was taken before vLLM bound it; "
                            f"starting it again on port {servers[i].port}"
                        )
                        continue
                    raise ServerStartError(server.exit_line("before it was ready"))
                missing[i] = server.answers() or ""
                if not missing[i]:
                    ready[i] = True
                    log.info(f"vLLM server for {server.name} ready after {time.monotonic() - t0:.0f} s")
            if all(ready):
                break
            if time.monotonic() - t0 > timeout:
                i = ready.index(False)
                why = f" ({missing[i]})" if missing[i].startswith("port") else ""
                raise ServerStartError(
                    f"the vLLM server of {servers[i].name} was not ready after {timeout:.0f} s{why}; "
                    f"log {servers[i].log}, its last lines: {_tail(servers[i])}"
                )
            self.stop.wait(POLL_S)
        for server in servers:
            threading.Thread(target=self._watch, args=(server,), name=f"watch {server.name}", daemon=True).start()
        return servers

    def stop_all(self) -> None:
        """Asks every launcher to stop its server's process group, then waits for them all (together,
        not one grace period after another)."""
        with self._lock:
            running, self._running = self._running, []
            for launched in running:
                launched.stopping = True
        for launched in running:
            if launched.process.poll() is None:
                launched.process.send_signal(signal.SIGTERM)
        for launched in running:
            try:
                launched.process.wait(timeout=GRACE_S + 15)
            except subprocess.TimeoutExpired:
                launched.process.kill()  # the launcher itself hung: its server may outlive it
                launched.process.wait()

    def _watch(self, server: Launched) -> None:
        server.process.wait()
        with self._lock:
            if server.stopping or server not in self._running:
                return
        self.stop.request(ServerExited(server.exit_line("while the command was using it")))

    def _forget(self, server: Launched) -> None:
        with self._lock:
            if server in self._running:
                self._running.remove(server)


def _no_proxy_for_this_machine() -> None:
    """Cluster nodes often set http_proxy; the servers are on this machine, so no proxy is used for them."""
    for name in ("no_proxy", "NO_PROXY"):
        kept = [h for h in os.environ.get(name, "").split(",") if h]
        os.environ[name] = ",".join([*kept, "127.0.0.1"] if "127.0.0.1" not in kept else kept)


def _log_since(path: Path, start: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(start)
            return f.read().decode(errors="replace")
    except OSError as err:
        return f"(unreadable: {err})"


def _tail(server: Launched) -> str:
    lines = [line.strip() for line in _log_since(server.log, server.log_start).splitlines() if line.strip()]
    return " | ".join(lines[-TAIL_LINES:]) or "(empty)"
