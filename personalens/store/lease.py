"""One invocation per shard at a time: `generate` and `judge` hold a lease on the shard they write,
`<out_dir>/leases/<command>.shard-KKK-of-NNN.json`, from before they read what is stored until they
exit. A second invocation of the same command and shard waits for it (`lease.wait_s`), then stops in
one line naming the holder (host, pid, job, since).

Made for the shared filesystems of clusters (NFS, Lustre), where `flock` may not reach other hosts:
the lease is taken by hard-linking a whole file to its name (a link to an existing name fails on
every POSIX filesystem, NFS included; a retried link answered "exists" is ours when our draft's link
count says the link was made), and kept alive by a thread that touches its mtime every quarter of
`lease.stale_s`.

A lease is taken over when
- its holder is provably dead: only where the holder ran in this process's PID namespace on this
  boot of this host (all three recorded in the lease), its pid is gone, a zombie, or reused by a
  process started later. A holder in another container (its own PID namespace) is judged by its
  heartbeat alone;
- its heartbeat is older than `stale_s` by the filesystem's own clock (the lease's mtime against
  the mtime of a file the waiter touches beside it, both stamped by the file server on NFS), and
  has not moved for half of `stale_s` of watching (filesystems stamped by their clients' clocks,
  Lustre's, where a skewed holder's mtime can look old while it still moves);
- or its mtime has not moved for `stale_s` of watching, whatever any clock says.
No rule reads this host's wall clock, so a waiter whose clock runs ahead or behind takes no live
lease. Taking over renames the stale file to a name of its own first, so two invocations taking over
at once cannot both win, and puts it back if it changed meanwhile (renewed, or another's).

The holder renews the lease and checks that it is still its own (`confirm`) before each part file it
writes becomes visible (store/parts.py), so a step that ends after a takeover lands nothing. Every
OSError of a renewal (an NFS soft mount's EIO, a Lustre eviction) is retried; a holder that has not
renewed for half of `stale_s` is stopped through `on_lost` with one line, before a waiter may take
the lease over, and so is one that finds its lease taken (it was frozen past `stale_s`)."""

from __future__ import annotations

import errno
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
RETRY_S = 2.0  # at most this long between tries of a failed renewal (stale_s / 20 when shorter)


@dataclass(frozen=True)
class Holder:
    host: str
    pid: int
    job: str  # SLURM's job (array job_task) id; "" outside SLURM
    since: str  # when it took the lease (UTC, ISO 8601)
    token: str  # this lease's own id
    process_start: int = 0  # the pid's start in clock ticks after boot (Linux; 0 unknown)
    pid_ns: str = ""  # its PID namespace ("pid:[inode]" of /proc/self/ns/pid); "" unknown
    boot: str = ""  # the host's boot id (/proc/sys/kernel/random/boot_id); "" unknown

    def describe(self) -> str:
        job = f", job {self.job}" if self.job else ""
        return f"host {self.host}, pid {self.pid}{job}, since {self.since}"

    def sees_processes_of(self, other: Holder) -> bool:
        """Whether `other`'s pid names a process this one can look at: one host, boot and PID namespace."""
        same = (self.host, self.boot, self.pid_ns) == (other.host, other.boot, other.pid_ns)
        return same and bool(self.boot and self.pid_ns)


def lease_path(out_dir: Path, command: str, index: int, count: int) -> Path:
    return Path(out_dir) / "leases" / f"{command}.shard-{index:03d}-of-{count:03d}.json"


class ShardLease:
    """Held inside its `with` block. `wait_s`: how long to wait for a live holder; `stale_s`: how old
    a heartbeat may grow before the lease is taken over; `on_lost`: called once, with a line saying
    why this invocation no longer holds the lease (taken, or not renewed for stale_s / 2); `check` is
    called while it waits (the command's stop, which it raises)."""

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
        self.lost: str | None = None  # why the lease is no longer ours
        self._renewed = 0.0  # time.monotonic() of the last renewal that found the lease ours
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._beat: threading.Thread | None = None

    def __enter__(self) -> ShardLease:
        self._take()
        self._renewed = time.monotonic()
        self._beat = threading.Thread(target=self._heartbeat, name=f"lease {self.path.name}", daemon=True)
        self._beat.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        if self._beat is not None:
            self._beat.join()
        try:
            held = _read(self.path)
            if held is not None and held[0] == self.holder:
                self.path.unlink(missing_ok=True)
        except (OSError, PersonalensError) as err:  # left to go stale
            log.warning(f"{self.what}: cannot release the lease {self.path}: {err}")

    def confirm(self) -> None:
        """Renews the lease and raises unless it is still this invocation's, at this moment: called
        before a part file becomes visible. A renewal that fails is retried until stale_s / 2 have
        passed since the last one."""
        while self.lost is None:
            try:
                self._renew()
                if self.lost is None:
                    return
            except (OSError, PersonalensError) as err:
                if not self._overdue(err):
                    time.sleep(self._retry_s)
        raise PersonalensError(self.lost)

    @property
    def _retry_s(self) -> float:
        return min(RETRY_S, self.stale_s / 20)

    def _renew(self) -> None:
        """Touches the lease, then reads it back: ours (renewed), or taken (lost)."""
        _touch(self.path)
        held = _read(self.path)
        if held is None:
            raise FileNotFoundError(errno.ENOENT, "gone", str(self.path))
        if held[0] != self.holder:
            self._lose(
                f"{self.what}: lost its lease {self.path} to {held[0].describe()} (it was not renewed for "
                f"{self.stale_s:g} s); the other invocation goes on with the shard, and nothing more of "
                "this one's is written"
            )
            return
        self._renewed = time.monotonic()

    def _overdue(self, err: Exception) -> bool:
        """Whether the renewals failing with `err` have failed for too long: the lease is then given up."""
        quiet = time.monotonic() - self._renewed
        if quiet < self.stale_s / 2:
            return False
        if isinstance(err, FileNotFoundError):
            self._lose(
                f"{self.what}: its lease {self.path} is gone ({quiet:.0f} s since it last renewed it): another "
                "invocation took the shard over and ended, or it was deleted; nothing more of this one's is "
                "written: run it again to resume what is left"
            )
        else:
            self._lose(
                f"{self.what}: cannot renew its lease {self.path} ({err}; {quiet:.0f} s since it last could), "
                f"so it stops before another invocation may take the shard over after {self.stale_s:g} s; "
                "what it finished is written: run it again once the filesystem answers"
            )
        return True

    def _lose(self, line: str) -> None:
        with self._lock:
            if self.lost is not None:
                return
            self.lost = line
        if self._on_lost is not None:
            self._on_lost(line)

    def _heartbeat(self) -> None:
        pause = self.stale_s / 4
        while not self._done.wait(pause) and self.lost is None:
            try:
                self._renew()
                pause = self.stale_s / 4
            except (OSError, PersonalensError) as err:
                if self._overdue(err):
                    return
                if pause != self._retry_s:  # the first failure of a run of them
                    log.warning(f"{self.what}: cannot renew the lease {self.path} ({err}); trying again")
                pause = self._retry_s

    def _take(self) -> None:
        deadline = time.monotonic() + self.wait_s
        watched: tuple[Holder, float, float] | None = None  # a holder, its mtime, since when we saw it so
        told = False
        clock = self.path.with_name(f".clock-{self.holder.token}")
        try:
            while not self._link():
                held = _read(self.path)
                if held is None:  # released meanwhile
                    continue
                holder, mtime = held
                if watched is None or watched[:2] != (holder, mtime):
                    watched = (holder, mtime, time.monotonic())
                why = self._dead(holder, mtime - _filesystem_now(clock), time.monotonic() - watched[2])
                if why is not None:
                    self._take_over(holder, mtime, why)
                    continue
                if time.monotonic() >= deadline:
                    raise PersonalensError(
                        f"{self.what} is being run by another invocation ({holder.describe()}; lease {self.path}): "
                        f"waited {self.wait_s:g} s; run it again once that one ends, or delete the lease if it "
                        "is no longer running"
                    )
                if not told:
                    log.warning(
                        f"{self.what}: waiting up to {self.wait_s:g} s for {holder.describe()} (lease {self.path})"
                    )
                    told = True
                time.sleep(min(POLL_S, max(deadline - time.monotonic(), 0.0)))
                self._check()
        except OSError as err:
            raise PersonalensError(f"{self.what}: cannot take the lease {self.path}: {err}") from None
        finally:
            clock.unlink(missing_ok=True)

    def _link(self) -> bool:
        """Whether the lease was free and is now ours."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        draft = self.path.with_name(f".{self.path.name}.{self.holder.token}")
        draft.write_text(json.dumps(asdict(self.holder)))
        try:
            os.link(draft, self.path)
        except FileExistsError:  # NFS may answer a retried link "exists" though it was made: the link count says
            if os.stat(draft).st_nlink != 2:
                return False
        except OSError:  # or another error
            if os.stat(draft).st_nlink != 2:
                raise
        finally:
            draft.unlink(missing_ok=True)
        return True

    def _dead(self, holder: Holder, age: float, unchanged_s: float) -> str | None:
        """Why `holder`'s lease may be taken over (None: it may still be running); `age`: how much
        older its mtime is than the filesystem's clock; `unchanged_s`: how long it was seen unmoved."""
        if self.holder.sees_processes_of(holder) and not _alive(holder):
            return "its process has ended"
        if -age > self.stale_s and unchanged_s > self.stale_s / 2:
            return f"its heartbeat is {-age:.0f} s old by the filesystem's clock"
        if unchanged_s > self.stale_s:
            return f"its heartbeat has not moved for {unchanged_s:.0f} s"
        return None

    def _take_over(self, holder: Holder, mtime: float, why: str) -> None:
        grave = self.path.with_name(f".{self.path.name}.stale-{self.holder.token}")
        try:
            os.rename(self.path, grave)
        except FileNotFoundError:
            return  # another invocation took it over first
        moved = _read(grave)
        if moved is not None and moved != (holder, mtime):  # renewed, or a lease taken after we looked: put it back
            try:
                os.link(grave, self.path)
            except FileExistsError:
                pass
        else:
            log.warning(f"{self.what}: took over the lease of {holder.describe()}: {why}")
        grave.unlink(missing_ok=True)


def _read(path: Path) -> tuple[Holder, float] | None:
    """The lease's holder and mtime; None where there is no lease. The mtime is taken from the open
    file (NFS revalidates a file's attributes when it is opened, rather than answer from its cache)."""
    try:
        with open(path) as file:
            mtime = os.fstat(file.fileno()).st_mtime
            return Holder(**json.loads(file.read())), mtime
    except FileNotFoundError:
        return None
    except (ValueError, TypeError) as err:
        raise PersonalensError(f"{path}: not a lease personalens wrote ({err}); delete it and run again") from None


def _touch(path: Path) -> None:
    """Sets `path`'s mtime to now by the filesystem's clock (an NFS server's own, for a time of None)."""
    os.utime(path)


def _filesystem_now(clock: Path) -> float:
    """The filesystem's clock: the mtime of `clock` (a file of this invocation's) just touched."""
    clock.touch()
    return os.stat(clock).st_mtime


def _me() -> Holder:
    pid = os.getpid()
    array = os.environ.get("SLURM_ARRAY_JOB_ID")
    job = f"{array}_{os.environ.get('SLURM_ARRAY_TASK_ID', '')}" if array else os.environ.get("SLURM_JOB_ID", "")
    since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return Holder(
        socket.gethostname(), pid, job, since, uuid.uuid4().hex, _process_start(pid), _pid_namespace(), _boot_id()
    )


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


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
    """Whether `holder`'s process (in this PID namespace) still runs: its pid exists, has not exited
    (a zombie its parent has not reaped yet) and, where known, was started when the holder's was (not
    a later process given the same pid)."""
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
