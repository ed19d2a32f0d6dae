"""The shard lease (store/lease.py) on real files: one holder at a time, a second invocation refused
in one line naming the holder, a lease taken over when its holder died here or its heartbeat went
stale, and a holder told when its lease was taken (tests/test_lease_faults.py does what clusters
do to it; tests/test_concurrent_shard.py runs two real `generate` invocations of one shard at once)."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from personalens.errors import PersonalensError
from personalens.store import lease as lease_module
from personalens.store.lease import ShardLease, _me, lease_path


def lease(path, **kw) -> ShardLease:
    return ShardLease(path, "generate of shard 0 of 1 in runs/x", **{"wait_s": 0, "stale_s": 60, **kw})


def planted(path, mtime: float | None = None, **holder) -> None:
    """A lease file another invocation left."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dataclasses.asdict(dataclasses.replace(_me(), **holder))))
    if mtime is not None:
        os.utime(path, (mtime, mtime))


def test_a_second_invocation_is_refused_in_one_line_naming_the_holder(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "4711")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "3")
    path = lease_path(tmp_path, "generate", 3, 8)
    assert path == tmp_path / "leases" / "generate.shard-003-of-008.json"
    with lease(path) as first:
        with pytest.raises(PersonalensError) as err, lease(path):
            pass
        line = str(err.value)
        assert "\n" not in line and "is being run by another invocation" in line
        assert f"host {socket.gethostname()}, pid {os.getpid()}, job 4711_3, since {first.holder.since}" in line
        assert path.exists()
    assert not path.exists()  # released at exit
    with lease(path):
        pass


def test_a_waiting_invocation_takes_the_lease_when_the_holder_ends(tmp_path):
    path = lease_path(tmp_path, "judge", 0, 1)
    holder = lease(path).__enter__()
    threading.Timer(1.5, holder.__exit__, (None, None, None)).start()
    started = time.monotonic()
    with lease(path, wait_s=30) as second:
        assert json.loads(path.read_text())["token"] == second.holder.token
    assert 1.0 < time.monotonic() - started < 10


def test_the_lease_of_a_process_that_ended_on_this_host_is_taken_over_at_once(tmp_path):
    path = lease_path(tmp_path, "generate", 0, 1)
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    planted(path, pid=int(ended.stdout), process_start=0)
    with lease(path) as mine:
        assert json.loads(path.read_text())["token"] == mine.holder.token


def test_the_lease_of_a_killed_process_not_yet_reaped_is_taken_over_at_once(tmp_path):
    path = lease_path(tmp_path, "generate", 0, 1)
    killed = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        os.kill(killed.pid, signal.SIGKILL)
        time.sleep(0.5)  # a zombie until waited for
        planted(path, pid=killed.pid, process_start=0)
        with lease(path):
            pass
    finally:
        killed.wait()


def test_a_reused_pid_does_not_keep_a_dead_holders_lease(tmp_path):
    path = lease_path(tmp_path, "generate", 0, 1)
    planted(path, process_start=1)  # this pid, but a process started at another time
    with lease(path):
        pass


def test_a_lease_of_another_host_is_kept_while_its_heartbeat_is_fresh_and_taken_when_stale(tmp_path, caplog):
    path = lease_path(tmp_path, "generate", 0, 1)
    planted(path, host="node-elsewhere", pid=1)
    with pytest.raises(PersonalensError, match="host node-elsewhere, pid 1"), lease(path):
        pass
    # stale by the filesystem's clock: taken once it has not moved for half of stale_s of watching
    planted(path, time.time() - 120, host="node-elsewhere", pid=1)
    with pytest.raises(PersonalensError, match="host node-elsewhere, pid 1"), lease(path, stale_s=2):
        pass
    started = time.monotonic()
    with caplog.at_level(logging.WARNING), lease(path, wait_s=30, stale_s=2) as mine:
        assert json.loads(path.read_text())["token"] == mine.holder.token
        assert 1 <= time.monotonic() - started < 3
    assert re.search(r"its heartbeat is 12\d s old by the filesystem.s clock", caplog.text)


def test_a_retried_link_answered_exists_is_ours_when_the_link_count_says_it_was_made(tmp_path, monkeypatch):
    path = lease_path(tmp_path, "generate", 0, 1)
    link = os.link

    def made_then_exists(src, dst):  # the server made the link; the client's retry was told "exists"
        link(src, dst)
        raise FileExistsError(17, "File exists")

    monkeypatch.setattr(lease_module.os, "link", made_then_exists)
    started = time.monotonic()
    with lease(path, wait_s=30) as mine:
        assert json.loads(path.read_text())["token"] == mine.holder.token
        assert time.monotonic() - started < 1  # not waiting on its own lease
        monkeypatch.setattr(lease_module.os, "link", link)
        with pytest.raises(PersonalensError, match="is being run by another invocation"), lease(path):
            pass  # a link that was not made is still refused


def test_a_takeover_that_finds_the_lease_renewed_since_it_looked_puts_it_back(tmp_path):
    path = lease_path(tmp_path, "generate", 0, 1)
    with lease(path) as holder:
        seen = path.stat().st_mtime
        os.utime(path, (seen - 1000, seen - 1000))  # what a waiter saw: stale
        stale = path.stat().st_mtime
        holder.confirm()  # renewed just before the waiter renames it away
        waiter = lease(path)
        waiter._take_over(holder.holder, stale, "its heartbeat is 1000 s old")
        assert json.loads(path.read_text())["token"] == holder.holder.token
        holder.confirm()  # still its own


def test_a_heartbeat_that_stops_moving_is_taken_over_whatever_the_clocks_say(tmp_path):
    # the holder's clock runs an hour ahead: its mtime looks fresh here, but it never moves
    path = lease_path(tmp_path, "generate", 0, 1)
    planted(path, time.time() + 3600, host="node-elsewhere", pid=1)
    started = time.monotonic()
    with lease(path, wait_s=30, stale_s=2):
        assert 2 <= time.monotonic() - started < 10


def test_a_held_lease_is_refreshed_and_a_holder_whose_lease_was_taken_is_told(tmp_path):
    path = lease_path(tmp_path, "generate", 0, 1)
    lost = []
    with lease(path, stale_s=0.4, on_lost=lost.append):
        os.utime(path, (0, 0))
        time.sleep(0.3)
        assert time.time() - path.stat().st_mtime < 5  # the heartbeat touched it
        planted(path, host="node-elsewhere", pid=99)  # taken over while this one stalled
        time.sleep(0.5)
    assert len(lost) == 1 and "lost its lease" in lost[0] and "host node-elsewhere, pid 99" in lost[0]
    assert path.exists()  # the other holder's lease is left alone


def test_generate_and_judge_take_their_shards_lease_before_they_read_or_write_anything(tmp_path):
    from test_fidelity import PromptRecorder, config

    from personalens.judge import command as judge_command
    from personalens.simulate import command as simulate_command

    out = tmp_path / "run"
    engine = PromptRecorder()
    engines = lambda: {"user_agent": engine, "assistant": engine, "judge": engine}  # noqa: E731
    for name, command in (("generate", simulate_command.generate), ("judge", judge_command.judge)):
        path = lease_path(out, name, 0, 1)
        planted(path, host="node-elsewhere", pid=4711, job="81_0")
        with pytest.raises(
            PersonalensError, match=rf"{name} of shard 0 of 1 .* \(host node-elsewhere, pid 4711, job 81_0"
        ):
            command(config(f"run.out_dir={out}", "lease.wait_s=0"), engines)
        assert not (out / f"{name}.yaml").exists()  # refused before its config was saved
        path.unlink()
        assert command(config(f"run.out_dir={out}", "lease.wait_s=0"), engines) == 0
        assert not path.exists()  # released when it ended


def test_a_holder_whose_lease_is_gone_stops_once_half_the_stale_time_passed(tmp_path):
    path = lease_path(tmp_path, "generate", 0, 1)
    lost = []
    with lease(path, stale_s=1, on_lost=lost.append) as mine:
        path.unlink()  # taken over and released by another invocation, or deleted by hand
        started = time.monotonic()
        with pytest.raises(PersonalensError, match="is gone .* another invocation took the shard over and ended"):
            mine.confirm()  # retried until stale_s / 2 after the last renewal
        assert time.monotonic() - started < 1
    assert len(lost) == 1 and "is gone" in lost[0]
