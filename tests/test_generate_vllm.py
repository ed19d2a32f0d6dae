"""`personalens generate` through the real vLLM engine on the embedded model: a run stopped by
SIGTERM resumes mid-dialogue with no turn lost or duplicated. The rows, the trace, the saved config,
a rerun that finds everything done and the refusal to mix configurations are checked on the
dialogues of tests/test_pipeline_vllm.py's run, which generates the same selection."""

from __future__ import annotations

import re
import signal
from collections import Counter

import pytest
from cli_helpers import REPO, kill_once, read_rows, run_cli, start_cli

from personalens.data import load_scenarios

pytestmark = pytest.mark.vllm

SAMPLE = REPO / "data" / "sample"


def expected_keys(users: str) -> set[tuple]:
    return {(s.user.user_id, s.task.task_id, "base", 0) for s in load_scenarios(SAMPLE, users, "both")}


def keys(rows: list[dict]) -> list[tuple]:
    return [(r["user_id"], r["task_id"], r["setting"], r["trial"]) for r in rows]


# short replies: nearly every reply of the embedded model runs to its budget, so a run's time grows
# with it; this test checks the turns kept and resumed, not what they say
SHORT_REPLIES = ("protocol.user_agent.max_tokens=16", "protocol.assistant.max_tokens=24")


def test_a_stopped_run_resumes_mid_dialogue_with_no_turn_lost_or_duplicated(tmp_path):
    out = tmp_path / "run"
    # single-domain dialogues end after 1 round, multi-domain ones after 4: SIGTERM lands after the
    # first part file (the SD dialogues) and before the MD dialogues finish
    args = [
        "generate",
        "data.users=0",
        "protocol=quick",
        "protocol.max_rounds_sd=1",
        "protocol.max_rounds_md=4",
        *SHORT_REPLIES,
        f"run.out_dir={out}",
        "progress=false",
    ]
    log = tmp_path / "first.log"
    proc = start_cli(*args, log=log)
    status = kill_once(proc, lambda: any((out / "dialogues").rglob("part-*.parquet")), log, sig=signal.SIGTERM)
    # it abandoned the step in flight at the engine's next step, kept the earlier steps' turns, and stopped
    assert status == 128 + signal.SIGTERM and "stopped by SIGTERM" in log.read_text(), log.read_text()[-4000:]
    before = read_rows(out / "dialogues")
    assert before and len(before) < len(expected_keys("0"))
    stored = read_rows(out / "turns")

    # resumed with verbose=true: the libraries' logs come to the terminal's stderr, stdout stays empty
    log_file = out / "logs" / "generate.log"  # written by the stopped run
    logged = log_file.read_text()
    assert "vllm" in logged  # the libraries' logs go to the command's log file
    resumed = run_cli(*args, "verbose=true")
    assert "(EngineCore pid=" in resumed.stderr and resumed.stdout == ""
    assert log_file.read_text() == logged
    after = read_rows(out / "dialogues")
    counts = Counter(keys(after))
    assert set(counts) == expected_keys("0")
    assert max(counts.values()) == 1
    # the dialogues written before the stop were kept, not simulated again
    first = {k: r["turns"] for k, r in zip(keys(before), before)}
    assert all(r["turns"] == first[k] for k, r in zip(keys(after), after) if k in first)
    # the unfinished ones went on from their stored turns, which they still hold unchanged
    final = dict(zip(keys(after), after))
    unfinished = {(t["user_id"], t["task_id"], t["setting"], t["trial"]) for t in stored} - set(first)
    resumed_from = re.search(r"(\d+) resumed from (\d+) stored turns", resumed.stderr)
    assert unfinished and resumed_from and int(resumed_from[1]) == len(unfinished), resumed.stderr[-3000:]
    for t in stored:
        turn = final[(t["user_id"], t["task_id"], t["setting"], t["trial"])]["turns"][t["index"]]
        assert {f: turn[f] for f in ("role", "text", "completion_tokens")} == {
            f: t[f] for f in ("role", "text", "completion_tokens")
        }
    turns = read_rows(out / "turns")
    assert len(turns) == sum(len(r["turns"]) for r in after)  # every turn stored once
    # the step trace: the stopped run's steps, then the resumed run's, appended under its own session
    sessions = Counter(r["session_started"] for r in read_rows(out / "trace"))
    assert len(sessions) == 2 and min(sessions) < max(sessions)
    assert all(n >= 1 for n in sessions.values())
    assert {t["session_started"] for t in turns} == set(sessions)
    # each dialogue names the invocation that wrote it: the kept ones the stopped run, the rest the resumed one
    written_by = {k: r["session_started"] for k, r in zip(keys(after), after)}
    assert set(written_by.values()) == set(sessions)
    assert {written_by[k] for k in first} == {min(sessions)}
