"""Two real `generate` invocations of one shard at once (the real CLI, vLLM on the embedded model):
the first is frozen mid-run (SIGSTOP) past its lease; the second, started meanwhile, waits, then
takes the lease over (store/lease.py) and finishes the shard, resuming the first's stored turns; a
third that will not wait is refused in one line naming the holder. The first, resumed, stops with
exit 2 naming who took its lease, and lands nothing more: every dialogue is stored once, and each
stored dialogue's turns form one chain, each turn answering the turn before it
(tests/test_shard_chains.py reads hand-made chains of two invocations; tests/test_lease_faults.py
does the same to `generate` and `judge` with scripted engines)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from cli_helpers import ENGINE_CORE_HERE, read_rows, run_cli, start_cli

from personalens.store import stored_turns

pytestmark = pytest.mark.vllm

KEY = ("user_id", "task_id", "setting", "trial")


def wait_for(ready, proc: subprocess.Popen, log: Path, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert proc.poll() is None, log.read_text()[-4000:]
        assert time.monotonic() < deadline, f"not ready after {timeout} s: {log.read_text()[-4000:]}"
        time.sleep(0.2)


def test_a_holder_frozen_past_its_lease_is_taken_over_and_lands_nothing_when_it_resumes(tmp_path):
    out = tmp_path / "run"
    args = ["generate", "data.users=0", "data.kinds=SD", "protocol=quick", "protocol.user_agent.max_tokens=16",
            "protocol.assistant.max_tokens=16", f"run.out_dir={out}", "progress=false", "lease.stale_s=6"]  # fmt: skip
    turns = out / "turns" / "shard-000-of-001"
    first = start_cli(*args, log=tmp_path / "first.log", env=ENGINE_CORE_HERE)
    second = None
    try:
        wait_for(lambda: any(turns.glob("part-*.parquet")), first, tmp_path / "first.log")
        os.killpg(first.pid, signal.SIGSTOP)  # held mid-run, while the others start
        try:
            second = start_cli(*args, log=tmp_path / "second.log", env=ENGINE_CORE_HERE)
            refused = run_cli(*args, "lease.wait_s=0", check=False, env=ENGINE_CORE_HERE)  # beside it
            # its heartbeat frozen: unmoved for stale_s / 2 and stale_s old by the filesystem's clock
            wait_for(
                lambda: "took over the lease" in (tmp_path / "second.log").read_text(), second, tmp_path / "second.log"
            )
        finally:
            os.killpg(first.pid, signal.SIGCONT)
        assert first.wait(timeout=600) == 2, (tmp_path / "first.log").read_text()[-4000:]
        assert second.wait(timeout=600) == 0, (tmp_path / "second.log").read_text()[-4000:]
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    assert refused.returncode == 2
    line = refused.stderr.strip().splitlines()[-1]
    assert re.search(
        rf"generate of shard 0 of 1 in .* is being run by another invocation \(host .*, pid {first.pid}, since ", line
    )
    took = (tmp_path / "second.log").read_text()
    assert "waiting up to 600 s for host" in took and "took over the lease of host" in took
    assert re.search(rf"pid {first.pid}, since .*: its heartbeat is \d+ s old by the filesystem's clock", took)
    stopped = (tmp_path / "first.log").read_text()
    assert re.search(
        rf"lost its lease .* to host .*, pid {second.pid}, since .*nothing more of this one's is written", stopped
    )

    dialogues = read_rows(out / "dialogues")
    assert len(dialogues) == 4 and len({tuple(d[k] for k in KEY) for d in dialogues}) == 4
    chains = stored_turns(turns)
    for d in dialogues:
        chain = chains[tuple(d[k] for k in KEY)]
        assert [t["text"] for t in chain] == [t["text"] for t in d["turns"]]
        assert [t["follows_session"] for t in chain] == [None] + [t["session_started"] for t in chain[:-1]]
    assert len(read_rows(turns)) == sum(len(d["turns"]) for d in dialogues)  # no turn stored twice
