"""`personalens generate` end to end through the real vLLM engine on the embedded model:
well-formed Parquet, resume mid-dialogue after SIGTERM, refusal to mix configurations."""

from __future__ import annotations

import re
import signal
from collections import Counter

import pytest
from cli_helpers import REPO, kill_once, read_rows, run_cli, start_cli
from omegaconf import OmegaConf

from personalens.data import load_scenarios
from personalens.engines.dtype import choose_dtype, read_cpu_flags

pytestmark = pytest.mark.vllm

SAMPLE = REPO / "data" / "sample"


def expected_keys(users: str, setting: str = "base", trials: int = 1) -> set[tuple]:
    scenarios = load_scenarios(SAMPLE, users, "both")
    return {(s.user.user_id, s.task.task_id, setting, t) for s in scenarios for t in range(trials)}


def keys(rows: list[dict]) -> list[tuple]:
    return [(r["user_id"], r["task_id"], r["setting"], r["trial"]) for r in rows]


def test_generate_writes_one_wellformed_row_per_dialogue_and_resumes(tmp_path):
    out = tmp_path / "run"
    args = ["generate", "data.users=0", "protocol=quick", f"run.out_dir={out}", "progress=false"]
    first = run_cli(*args)
    rows = read_rows(out / "dialogues")
    assert sorted(keys(rows)) == sorted(expected_keys("0"))
    assert "dialogues simulated" in first.stderr and "tokens/s" in first.stderr
    # later turns of a dialogue extend its earlier prompts, and every dialogue shares the fixed
    # instructions: a good part of the prompt tokens must come from vLLM's prefix cache
    cached = re.search(r"prompts (\d+) tokens, (\d+)% from the prefix cache", first.stderr)
    assert cached and int(cached[1]) > 0 and int(cached[2]) >= 30, first.stderr
    for row in rows:
        roles = [t["role"] for t in row["turns"]]
        assert roles[0] == "user" and all(a != b for a, b in zip(roles, roles[1:]))
        assert row["rounds"] == roles.count("assistant")
        # the default fidelity option (official): after the 3rd assistant reply the user agent still
        # answers, and a TERMINATE there earns a 4th assistant reply
        if row["ended"] == "terminated":
            assert roles[-1] == "assistant" and row["rounds"] <= 4
        else:
            assert row["ended"] == "max_rounds" and roles[-1] == "user" and row["rounds"] == 3
        assert all(t["completion_tokens"] > 0 and t["prompt_tokens"] > 0 for t in row["turns"])
        assert all("TERMINATE" not in t["text"] for t in row["turns"][1:])
        assert row["assistant_model"] == row["user_model"] == "SmolLM2-135M-Instruct"
        assert row["kind"] == ("SD" if row["task_id"].startswith("SD-") else "MD")
    # the step trace: one row per batched call (one engine serves both roles: one call per step),
    # with vLLM's per-request finishes all reported, in order within the call's wall time
    trace = sorted(read_rows(out / "trace" / "shard-000-of-001"), key=lambda r: r["step"])
    assert [r["step"] for r in trace] == list(range(1, len(trace) + 1)) and all(r["call"] == 0 for r in trace)
    assert sum(r["requests"] for r in trace) == sum(len(row["turns"]) for row in rows)
    assert sum(r["completion_tokens"] for r in trace) == sum(
        t["completion_tokens"] for row in rows for t in row["turns"]
    )
    for r in trace:
        assert r["reported"] == r["requests"] and r["roles"] in (["user"], ["assistant"], ["assistant", "user"])
        assert 0 < r["first_finished"] <= r["last_finished"] <= r["seconds"] and 0 <= r["tail"] <= r["last_finished"]
        assert r["prompt_tokens"] > r["cached_tokens"] >= 0 and r["model"] == "SmolLM2-135M-Instruct"
    assert all(a["started"] + a["seconds"] <= b["started"] for a, b in zip(trace, trace[1:]))
    assert re.search(rf"{len(trace)} batched calls, \d+% of their wall time in the straggler tail", first.stderr)
    saved = OmegaConf.load(out / "generate.yaml")
    assert saved.config.assistant.dtype == "auto"  # as configured; what it became is recorded beside it
    expected = choose_dtype("auto", on_cpu=True, cpu_flags=read_cpu_flags())
    assert saved.resolved.assistant.dtype == OmegaConf.create(vars(expected))
    assert "vllm" in (out / "logs" / "generate.log").read_text()

    # same command again: nothing left to do, nothing duplicated
    again = run_cli(*args)
    assert "0 dialogues simulated" in again.stderr
    assert sorted(keys(read_rows(out / "dialogues"))) == sorted(keys(rows))

    # a changed configuration into the same output is refused, and writes nothing
    refused = run_cli(*args, "protocol.assistant.max_tokens=50", check=False)
    assert refused.returncode == 2
    assert "different configuration" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert len(read_rows(out / "dialogues")) == len(rows)


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
        f"run.out_dir={out}",
        "progress=false",
    ]
    log = tmp_path / "first.log"
    proc = start_cli(*args, log=log)
    status = kill_once(proc, lambda: any((out / "dialogues").rglob("part-*.parquet")), log, sig=signal.SIGTERM)
    # it finished the step in flight, stored its turns, and stopped as asked
    assert status == 128 + signal.SIGTERM and "stopped by SIGTERM" in log.read_text(), log.read_text()[-4000:]
    before = read_rows(out / "dialogues")
    assert before and len(before) < len(expected_keys("0"))
    stored = read_rows(out / "turns")

    # resumed with verbose=true: the libraries' logs come to the terminal's stderr, stdout stays empty
    log_file = out / "logs" / "generate.log"  # written by the stopped run
    logged = log_file.read_text()
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
