"""One invocation per shard at a time: `generate` and `judge` hold a lease on the shard they write,
`<out_dir>/leases/<command>.shard-KKK-of-NNN.json`, from before they read what is stored until they
exit. A second invocation of the same command and shard waits for it (`lease.wait_s`), then stops in
one line naming the holder (host, pid, job, since).

Made for the shared filesystems of clusters (NFS, Lustre), where `flock` may not reach other hosts:
the lease is taken by hard-linking a whole file to its name (a link to an existing name fails on
every POSIX filesystem, NFS included), and kept alive by a thread that touches its mtime every
quarter of `lease.stale_s`. A lease is taken over when its holder is provably dead on this host (its
pid gone, or reused by a process started later), when its mtime is older than `stale_s` by this
host's clock, or when its mtime has not moved for `stale_s` of watching it (clocks that disagree).
Taking over renames the stale file to a name of its own first, so two invocations taking over at
once cannot both win. A holder that finds its lease taken (it stalled past `stale_s`) is told through
`on_lost`, and the command stops."""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from personalens.errors import PersonalensError

log = logging.getLogger(__name__)

POLL_S = 1.0  # how often a waiting invocation looks at the lease again


@dataclass(frozen=True)
class Holder:
    host: str
    pid: int
    job: str  # SLURM's job (array job_task) id; "" outside SLURM
    since: str  # when it took the lease (UTC, ISO 8601)
    token: str  # this lease's own id
    process_start: int = 0  # the pid's start in clock ticks after boot (Linux; 0 unknown)

    def describe(self) -> str:
        job = f", job {self.job}" if self.job else ""
        return f"host {self.host}, pid {self.pid}{job}, since {self.since}"


def lease_path(out_dir: Path, command: str, index: int, count: int) -> Path:
    return Path(out_dir) / "leases" / f"{command}.shard-{index:03d}-of-{count:03d}.json"


class ShardLease:
    """Held inside its `with` block. `wait_s`: how long to wait for a live holder; `stale_s`: how old
        a heartbeat may grow before the lease is taken over; `on_lost`: called once, from the heartbeat
        thread, with a line saying who took the lease; `check` is called while it waits (the command's
    stop, which it raises)."""

    def __init__(
        self,
        path: Path,
        what: str,
        *,
        wait_s: float,
        stale_s: float,
        on_lost: Callable[[str], None] | None = None,
        check: Callable[[], None] = lambda: None,
    ):
        if wait_s < 0 or stale_s <= 0:
            raise PersonalensError(f"lease.wait_s must be >= 0 and lease.stale_s > 0, got {wait_s} and {stale_s}")
        self.path, self.what = Path(path), what
        self.wait_s, self.stale_s = wait_s, stale_s
        self._on_lost, self._check = on_lost, check
        self.holder = _me()
        self._done = threading.Event()
        self._beat: threading.Thread | None = None

    def __enter__(self) -> ShardLease:
        self._take()
        self._beat = threading.Thread(target=self._heartbeat, name=f"lease {self.path.name}", daemon=True)
        self._beat.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        if self._beat is not None:
            self._beat.join()
        held = _read(self.path)
        if held is not None and held[0] == self.holder:
            self.path.unlink(missing_ok=True)

    def _take(self) -> None:
        deadline = time.monotonic() + self.wait_s
        watched: tuple[Holder, float, float] | None = None  # a holder, its mtime, since when we saw it so
        told = False
        while not self._link():
            held = _read(self.path)
            if held is None:  # released meanwhile
                continue
            holder, mtime = held
            if watched is None or watched[:2] != (holder, mtime):
                watched = (holder, mtime, time.monotonic())
            why = self._dead(holder, mtime, time.monotonic() - watched[2])
            if why is not None:
                self._take_over(holder, why)
                continue
            if time.monotonic() >= deadline:
                raise PersonalensError(
                    f"{self.what} is being run by another invocation ({holder.describe()}; lease {self.path}): "
                    f"waited {self.wait_s:g} s; run it again once that one ends, or delete the lease if it is "
                    "no longer running"
                )
            if not told:
                log.warning(f"{self.what}: waiting up to {self.wait_s:g} s for {holder.describe()} (lease {self.path})")
                told = True
            time.sleep(min(POLL_S, max(deadline - time.monotonic(), 0.0)))
            self._check()

    def _link(self) -> bool:
        """Whether the lease was free and is now ours."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        draft = self.path.with_name(f".{self.path.name}.{self.holder.token}")
        draft.write_text(json.dumps(asdict(self.holder)))
        try:
            os.link(draft, self.path)
        except FileExistsError:
            return False
        except OSError:  # NFS may answer a retried link with an error though it was made: the link count says
            if os.stat(draft).st_nlink != 2:
                raise
        finally:
            draft.unlink(missing_ok=True)
        return True

    def _dead(self, holder: Holder, mtime: float, unchanged_s: float) -> str | None:
        """Why `holder`'s lease may be taken over (None: it may still be running)."""
        if holder.host == self.holder.host and not _alive(holder):
            return "its process has ended"
        if time.time() - mtime > self.stale_s:
            return f"its heartbeat is {time.time() - mtime:.0f} s old"
        if unchanged_s > self.stale_s:
            return f"its heartbeat has not moved for {unchanged_s:.0f} s"
        return None

    def _take_over(self, holder: Holder, why: str) -> None:
        grave = self.path.with_name(f".{self.path.name}.stale-{self.holder.token}")
        try:
            os.rename(self.path, grave)
        except FileNotFoundError:
            return  # another invocation took it over first
        moved = _read(grave)
        if moved is not None and moved[0] != holder:  # a lease taken after we looked: put it back
            try:
                os.link(grave, self.path)
            except FileExistsError:
                pass
        else:
            log.warning(f"{self.what}: took over the lease of {holder.describe()}: {why}")
        grave.unlink(missing_ok=True)

    def _heartbeat(self) -> None:
        while not self._done.wait(self.stale_s / 4):
            held = _read(self.path)
            if held is None or held[0] != self.holder:
                taker = held[0].describe() if held is not None else "nobody (the lease file is gone)"
                if self._on_lost is not None:
                    self._on_lost(
                        f"{self.what}: lost its lease {self.path} to {taker} (a heartbeat more than "
                        f"{self.stale_s:g} s late); the other invocation goes on with the shard"
                    )
                return
            try:
                os.utime(self.path)
            except OSError as err:
                log.warning(f"{self.what}: cannot refresh the lease {self.path}: {err}")


def _read(path: Path) -> tuple[Holder, float] | None:
    """The lease's holder and mtime; None where there is no lease."""
    try:
        mtime = os.stat(path).st_mtime
        return Holder(**json.loads(path.read_text())), mtime
    except FileNotFoundError:
        return None
    except (ValueError, TypeError) as err:
        raise PersonalensError(f"{path}: not a lease personalens wrote ({err}); delete it and run again") from None


def _me() -> Holder:
    pid = os.getpid()
    array = os.environ.get("SLURM_ARRAY_JOB_ID")
    job = f"{array}_{os.environ.get('SLURM_ARRAY_TASK_ID', '')}" if array else os.environ.get("SLURM_JOB_ID", "")
    since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return Holder(socket.gethostname(), pid, job, since, uuid.uuid4().hex, _process_start(pid))


def _stat(pid: int) -> list[str]:
    """The fields of /proc/<pid>/stat after the command name (empty where there is none)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def _process_start(pid: int) -> int:
    """The process's start time in clock ticks after boot (/proc; 0 where there is none)."""
    fields = _stat(pid)
    return int(fields[19]) if len(fields) > 19 and fields[19].isdigit() else 0


def _alive(holder: Holder) -> bool:
    """Whether `holder`'s process (on this host) still runs: its pid exists, has not exited (a zombie
    its parent has not reaped yet) and, where known, was started when the holder's was (not a later
    process given the same pid)."""
    try:
        os.kill(holder.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: it exists
    fields = _stat(holder.pid)
    if fields and fields[0] in ("Z", "X"):
        return False
    return not holder.process_start or _process_start(holder.pid) in (0, holder.process_start)
