"""What clusters do to the shard lease (store/lease.py), done to it on real files and through the
`generate` and `judge` commands (scripted engines): a holder in another PID namespace (a real
`unshare --pid` where this machine allows it), clocks skewed either way, EIO from the mount while
the heartbeat renews, a step that ends after its lease was taken over (its part must not land), and
rows stored twice, which every reader keeps once (store/duplicates.py). tests/test_concurrent_shard.py
runs two real `generate` invocations of one shard on vLLM."""

from __future__ import annotations

import dataclasses
import errno
import json
import logging
import os
import shutil
import subprocess
import sys
import time

import pyarrow.parquet as pq
import pytest
from test_fidelity import PromptRecorder, config
from test_shard_lease import lease, planted

from personalens.errors import PersonalensError
from personalens.judge import command as judge_command
from personalens.merge.check import merge
from personalens.simulate import command as simulate_command
from personalens.store import lease as lease_module
from personalens.store.lease import _me, lease_path
from personalens.store.results import load_runs

COMMANDS = {"generate": simulate_command.generate, "judge": judge_command.judge}
SKEW_S = 135  # how far a waiter's clock runs from the file server's (the case)

# a holder in a PID namespace of its own, on this host: it prints its pid once it holds the leases
HOLDER = """
import sys, time
from personalens.store.lease import ShardLease
leases = [ShardLease(p, "held", wait_s=0, stale_s=600).__enter__() for p in sys.argv[1:]]
print(leases[0].holder.pid, flush=True)
time.sleep(120)
"""


def run_with(out, name, engine, *overrides):
    engines = lambda: {"user_agent": engine, "assistant": engine, "judge": engine}  # noqa: E731
    return COMMANDS[name](config(f"run.out_dir={out}", *overrides), engines)


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    """A shard `generate` wrote (scripted engines), copied by each test that needs one."""
    out = tmp_path_factory.mktemp("generated") / "run"
    run_with(out, "generate", PromptRecorder())
    return out


def copy_of(generated, tmp_path):
    return shutil.copytree(generated, tmp_path / "run")


def parts(out, table: str) -> list[str]:
    return sorted(p.name for p in (out / table).rglob("*") if p.is_file())


class Hooked(PromptRecorder):
    """Scripted replies; `action` runs during its `at`-th generate call (the middle of a step)."""

    def __init__(self, at: int, action):
        super().__init__()
        self.at, self.action, self.calls = at, action, 0

    def generate(self, requests, on_finished=None):
        self.calls += 1
        if self.calls == self.at:
            self.action()
        return super().generate(requests, on_finished)


def other_namespace_holder(paths):
    """A real holder in its own PID namespace (`unshare`), or None where this machine refuses one."""
    if shutil.which("unshare") is None:
        return None
    proc = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", sys.executable, "-c", HOLDER, *map(str, paths)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    line = proc.stdout.readline()
    if not line:
        proc.wait()
        return None
    return proc, int(line)


def test_a_live_holder_in_another_pid_namespace_keeps_its_lease_for_generate_and_judge(generated, tmp_path):
    out = copy_of(generated, tmp_path)  # judge needs dialogues
    paths = [lease_path(out, name, 0, 1) for name in COMMANDS]
    started = other_namespace_holder(paths)
    if started is None:  # no unshare here: the lease a containerised holder leaves, planted
        pid = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True).stdout)
        for path in paths:
            planted(path, pid=pid, process_start=0, pid_ns="pid:[1]")
        proc, pid = None, pid
    else:
        proc, pid = started
    try:
        held = json.loads(paths[0].read_text())
        assert held["pid_ns"] != _me().pid_ns and held["host"] == _me().host and held["boot"] == _me().boot
        for name in COMMANDS:
            # its pid means nothing here (or names another process): the heartbeat decides, and it is fresh
            with pytest.raises(PersonalensError, match=rf"{name} of shard 0 of 1 .* \(host .*, pid {pid}, since "):
                run_with(out, name, PromptRecorder(), "lease.wait_s=0")
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()


def test_a_dead_holder_in_another_pid_namespace_is_taken_over_by_its_heartbeat(tmp_path):
    path = lease_path(tmp_path, "generate", 0, 1)
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    for other in ({"pid_ns": "pid:[1]"}, {"boot": "another-boot"}, {"pid_ns": ""}):
        planted(path, pid=int(ended.stdout), process_start=0, **other)
        with pytest.raises(PersonalensError, match="is being run by another invocation"), lease(path):
            pass  # not taken at once on its pid
        started = time.monotonic()
        with lease(path, wait_s=10, stale_s=1):
            assert 1 <= time.monotonic() - started < 4  # its mtime did not move for stale_s


@pytest.mark.parametrize("skew", [SKEW_S, -SKEW_S])
def test_a_waiter_whose_clock_is_skewed_takes_no_live_lease_for_generate_and_judge(
    generated, tmp_path, monkeypatch, skew
):
    out = copy_of(generated, tmp_path)
    real = time.time
    monkeypatch.setattr(lease_module.time, "time", lambda: real() + skew)  # the waiter's clock only
    for name in COMMANDS:
        planted(lease_path(out, name, 0, 1), host="node-elsewhere", pid=4711)  # fresh by the file server
        with pytest.raises(PersonalensError, match=rf"{name} of shard 0 of 1 .* \(host node-elsewhere, pid 4711"):
            run_with(out, name, PromptRecorder(), "lease.wait_s=0", "lease.stale_s=60")


@pytest.mark.parametrize("skew", [SKEW_S, -SKEW_S])
def test_a_holder_stamping_its_skewed_clock_keeps_its_lease_while_it_beats(tmp_path, monkeypatch, skew):
    # a filesystem stamped by its clients' clocks (Lustre): the holder's mtimes run `skew` from the waiter's
    path = lease_path(tmp_path, "generate", 0, 1)
    monkeypatch.setattr(lease_module, "_touch", lambda p: os.utime(p, (time.time() + skew,) * 2))
    holder = lease(path, stale_s=1)
    holder.holder = dataclasses.replace(holder.holder, host="node-elsewhere")
    with holder:
        os.utime(path, (time.time() + skew,) * 2)
        with pytest.raises(PersonalensError, match="host node-elsewhere"), lease(path, wait_s=3, stale_s=1):
            pass
        holder.confirm()  # still its own


def test_eio_in_the_heartbeat_is_retried_and_a_lease_that_cannot_be_renewed_stops_its_holder(tmp_path, monkeypatch):
    path = lease_path(tmp_path, "judge", 0, 1)
    failing = {"left": 3}
    touch = lease_module._touch

    def flaky(p):
        if failing["left"]:
            failing["left"] -= 1
            raise OSError(errno.EIO, "Input/output error")
        touch(p)

    monkeypatch.setattr(lease_module, "_touch", flaky)
    lost = []
    with lease(path, stale_s=2, on_lost=lost.append) as mine:
        time.sleep(1.2)  # a beat at 0.5 s, its retries every 0.1 s: three fail, the fourth renews
        assert failing["left"] == 0 and not lost and mine.lost is None
        renewed = path.stat().st_mtime
        failing["left"] = 10**6  # the mount answers EIO from now on
        time.sleep(0.3)
        started = time.monotonic()
        while not lost and time.monotonic() - started < 5:
            time.sleep(0.05)
        given_up = time.time()
    assert len(lost) == 1 and "cannot renew its lease" in lost[0] and "Input/output error" in lost[0]
    assert given_up - renewed < 2  # before the lease grew stale_s old: before anyone may take it over
    with pytest.raises(PersonalensError, match="cannot renew its lease"):
        mine.confirm()


@pytest.mark.parametrize("name", COMMANDS)
def test_eio_that_outlasts_half_the_lease_stops_the_command_and_lands_nothing_more(
    generated, tmp_path, monkeypatch, name
):
    out = copy_of(generated, tmp_path) if name == "judge" else tmp_path / "run"
    tables = ("turns", "trace", "dialogues") if name == "generate" else ("judgments",)
    seen = {}

    def eio(path):
        raise OSError(errno.EIO, "Input/output error")

    def mount_fails():
        seen.update({table: parts(out, table) for table in tables})
        monkeypatch.setattr(lease_module, "_touch", eio)

    with pytest.raises(PersonalensError, match=rf"{name} of shard 0 of 1 .*: cannot renew its lease .*Input/output"):
        run_with(out, name, Hooked(3, mount_fails), "lease.stale_s=1", "judging.chunk=4")
    assert seen[tables[0]]  # the steps before had landed their parts
    assert {table: parts(out, table) for table in tables} == seen  # nothing landed once it could not renew


@pytest.mark.parametrize("name", COMMANDS)
def test_a_step_that_ends_after_its_lease_was_taken_over_lands_nothing(generated, tmp_path, name):
    out = copy_of(generated, tmp_path) if name == "judge" else tmp_path / "run"
    path = lease_path(out, name, 0, 1)
    tables = ("turns", "trace", "dialogues") if name == "generate" else ("judgments",)
    seen = {}

    def taken_over():  # the heartbeat stalled past stale_s and a second invocation took the shard
        seen.update({table: parts(out, table) for table in tables})
        os.rename(path, path.with_name("gone"))
        planted(path, host="node-elsewhere", pid=4711, job="82_0")

    with pytest.raises(PersonalensError, match=r"lost its lease .* to host node-elsewhere, pid 4711, job 82_0"):
        run_with(out, name, Hooked(3, taken_over), "judging.chunk=4")
    assert seen[tables[0]]  # the steps before had landed their parts
    assert {table: parts(out, table) for table in tables} == seen
    assert json.loads(path.read_text())["host"] == "node-elsewhere"  # the other's lease is left alone


def test_rows_stored_twice_are_read_once_named_in_one_warning_and_in_merge_json(generated, tmp_path, caplog):
    out = copy_of(generated, tmp_path)
    run_with(out, "judge", PromptRecorder())
    once = load_runs([out])
    copied = {}
    for table in ("dialogues", "judgments"):  # a late job's copy of one part of each
        folder = out / table / "shard-000-of-001"
        first = sorted(folder.glob("part-*.parquet"))[0]
        shutil.copy(first, folder / "part-09999-late.parquet")
        copied[table] = pq.read_metadata(first).num_rows
    with caplog.at_level(logging.WARNING, logger="personalens"):
        twice = load_runs([out])
    assert twice == once  # the same rows, the same copies
    warnings = [r.getMessage() for r in caplog.records if "stored more than once" in r.getMessage()]
    assert len(warnings) == 1
    assert f"{copied['dialogues']} dialogue(s) and {copied['judgments']} judgment(s)" in warnings[0]
    assert "part-09999-late.parquet" in warnings[0] and "nothing needs re-running" in warnings[0]

    expected = {(d.scenario.user_id, d.scenario.task_id, d.setting, d.scenario.trial): 0 for d in once.dialogues}
    result = merge(out, expected, list(config().judging.dimensions), 1)
    assert result.ok, result.format()
    assert (result.dialogues, result.judgments) == (len(once.dialogues), len(once.judgments))
    status = json.loads((out / "merge.json").read_text())
    assert status["complete"] and len(status["duplicates"]["dialogues"]) == copied["dialogues"]
    assert len(status["duplicates"]["judgments"]) == copied["judgments"]
