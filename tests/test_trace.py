"""The step trace (personalens/simulate/trace.py): the arithmetic of finish times, lockstep's records
of each batched call with a scripted engine that reports finishes on a scripted clock, and the
trace part files `generate` writes beside the dialogues (pure logic; tests/test_pipeline_vllm.py
checks the trace of a real run)."""

from __future__ import annotations

import random

import pytest
from cli_helpers import read_rows
from test_lockstep import SAMPLING, ScriptedEngine, dialogues, render, scenario

from personalens.data.records import Scenario
from personalens.prompts.setting import PromptSetting
from personalens.simulate.generate import Protocol, Scheduling, generate
from personalens.simulate.lockstep import run_lockstep
from personalens.simulate.trace import CallTrace, TraceTotals, finishes
from personalens.store import DIALOGUE_SCHEMA, TRACE_SCHEMA, PartWriter


def test_finish_arithmetic_first_last_and_the_tail_of_fewer_than_a_quarter_running():
    # 8 requests from t=10: finishes at +1..+6, two unreported ones at the return, +20
    done = finishes(8, 10.0, [11.0, 12.0, 13.0, 14.0, 15.0, 16.0], 30.0)
    # after the 7th finish one request (< 8/4) still runs: the tail is from +20 to +20
    assert (done.first, done.last, done.tail, done.reported) == (1.0, 20.0, 0.0, 6)
    # the 7th finish at +7, the 8th at +19: one request ran alone for 12 s
    done = finishes(8, 0.0, [1, 2, 3, 4, 5, 6, 7, 19], 20.0)
    assert (done.first, done.last, done.tail, done.reported) == (1, 19, 12, 8)
    # 5 requests: after the 4th finish 1 < 1.25 still runs; after the 3rd, 2 do (not the tail)
    assert finishes(5, 0.0, [1, 2, 3, 4, 9], 9.0).tail == 5
    assert finishes(4, 0.0, [1, 2, 3, 8], 8.0).tail == 0  # 1 of 4 running is not fewer than a quarter
    one = finishes(1, 0.0, [], 3.0)
    assert (one.first, one.last, one.tail, one.reported) == (3.0, 3.0, 0.0, 0)
    # an engine reporting nothing: every request finished when the call returned
    silent = finishes(6, 2.0, [], 5.0)
    assert (silent.first, silent.last, silent.tail, silent.reported) == (3.0, 3.0, 0.0, 0)
    # reports after the return (a late callback) count at the return; extra reports are ignored
    assert finishes(2, 0.0, [1.0, 9.0, 9.5], 4.0).last == 4.0
    assert finishes(0, 0.0, [], 1.0).tail == 0.0


class ClockedEngine(ScriptedEngine):
    """Advances a scripted clock while a call runs and reports each request's finish through
    `on_finished`, request i of a call finishing `delays[i]` after the call's start."""

    def __init__(self, clock: list[float], delays: list[float], report: bool = True):
        super().__init__("m", {})
        self.clock, self.delays, self.report = clock, delays, report

    def generate(self, requests, on_finished=None):
        start = self.clock[0]
        for delay in sorted(self.delays[: len(requests)]):
            self.clock[0] = start + delay
            if self.report and on_finished is not None:
                on_finished(1, 0)
        self.clock[0] = start + max(self.delays[: len(requests)]) + 0.5  # returns after the last finish
        return super().generate(requests)


def five_in_lockstep(delays: list[float], start: float = 0.0) -> list:
    """The steps of five one-round dialogues on an engine whose requests finish `delays` in."""
    clock = [start]
    engine = ClockedEngine(clock, delays)
    steps = []
    ds = dialogues(("user1", 1), ("user2", 1), ("user3", 1), ("user4", 1), ("user5", 1))
    run_lockstep(
        ds, {"user": engine, "assistant": engine}, render, SAMPLING, lambda _: None, steps.append, lambda: clock[0]
    )
    return steps


def test_lockstep_traces_every_call_with_its_finish_times():
    steps = five_in_lockstep([1.0, 2.0, 3.0, 4.0, 9.0], start=100.0)
    traces = [t for s in steps for t in s.calls]
    assert [(t.step, t.call, t.roles, t.requests) for t in traces] == [(1, 0, ("user",), 5), (2, 0, ("assistant",), 5)]
    first = traces[0]
    # after the 4th finish (+4) one request of five runs alone until +9
    assert (first.first_finished, first.last_finished, first.tail, first.reported) == (1.0, 9.0, 5.0, 5)
    assert first.seconds == 9.5 and first.started == 0.0 and traces[1].started == 9.5
    # the scripted engine: 10 prompt tokens per request, 4 of them cached for assistant turns, 1 word replies
    assert (first.prompt_tokens, first.cached_tokens, first.completion_tokens) == (50, 0, 5)
    assert (traces[1].prompt_tokens, traces[1].cached_tokens) == (50, 20)
    assert all(s.requests == sum(t.requests for t in s.calls) for s in steps)


def test_a_step_split_into_calls_traces_each_call_and_shared_engines_carry_both_roles():
    clock = [0.0]
    engine = ClockedEngine(clock, [1.0, 1.0, 1.0], report=False)
    ds = dialogues(("user1", 2), ("user2", 2), ("user3", 2))
    steps = []
    run_lockstep(
        ds,
        {"user": engine, "assistant": engine},
        render,
        SAMPLING,
        lambda _: None,
        steps.append,
        lambda: clock[0],
        chunk=2,
    )
    assert [[(t.call, t.requests) for t in s.calls] for s in steps] == [[(0, 2), (1, 1)]] * 4
    assert all(t.reported == 0 and t.first_finished == t.last_finished == t.seconds for s in steps for t in s.calls)
    # two engines: one call per engine and step, each with its own role
    user, assistant = ClockedEngine(clock, [1.0] * 3), ClockedEngine(clock, [2.0] * 3)
    steps = []
    run_lockstep(
        dialogues(("user1", 1)),
        {"user": user, "assistant": assistant},
        render,
        SAMPLING,
        lambda _: None,
        steps.append,
        lambda: clock[0],
    )
    assert [(t.model, t.roles) for s in steps for t in s.calls] == [("m", ("user",)), ("m", ("assistant",))]


def test_totals_give_the_closing_lines_share_of_tail():
    totals = TraceTotals()
    assert "0 batched calls, 0% of their wall time" in totals.line()
    for s in five_in_lockstep([1.0, 1.0, 1.0, 1.0, 5.0]):
        for t in s.calls:
            totals.add(t)
    # each call: 5.5 s, of which 4 s with one request of five running
    assert (totals.calls, totals.seconds, totals.tail) == (2, 11.0, 8.0)
    assert "2 batched calls, 73% of their wall time in the straggler tail" in totals.line()


def test_totals_say_each_engines_prompt_tokens_prefilled_and_cached():
    totals = TraceTotals()
    assert totals.line().endswith("prompt tokens prefilled / cached: none")
    for engine, prompt, cached in ((0, 1_000, 250), (1, 400, 300), (0, 1_000, 750)):
        totals.add(
            CallTrace(1, engine, "m", ("user",), 2, prompt, cached, 10, 0.0, 1.0, 0.5, 1.0, 0.5, 2, engine=engine)
        )
    assert totals.prefilled("engine 0 (m)") == 0.5 and totals.prefilled("engine 1 (m)") == 0.25
    assert totals.line().endswith("prompt tokens prefilled / cached: engine 0 (m) 50% / 50%, engine 1 (m) 25% / 75%")


def run_generate(scenarios: list[Scenario], out, done: set, engine, scheduling: Scheduling | None = None) -> str:
    summary = generate(
        scenarios,
        setting=PromptSetting("base"),
        templates=None,
        load_engines=lambda: {"user": engine, "assistant": engine},
        protocol=Protocol(1, 1, SAMPLING),
        trials=1,
        seed=0,
        writer=PartWriter(out / "dialogues" / "shard-000-of-001", DIALOGUE_SCHEMA),
        trace_writer=PartWriter(out / "trace" / "shard-000-of-001", TRACE_SCHEMA),
        done=done,
        run_id="r",
        config_hash="h",
        progress=False,
        scheduling=scheduling or Scheduling(),
    )
    return summary.line()


@pytest.fixture
def scripted_render(monkeypatch):
    from personalens.simulate import generate as generate_module

    monkeypatch.setattr(generate_module, "renderer", lambda templates, setting, family, history: render)


def test_generate_writes_one_trace_row_per_call_and_a_resumed_run_appends_its_own(tmp_path, scripted_render):
    clock = [0.0]
    engine = ClockedEngine(clock, [0.0] * 4)
    out = tmp_path / "run"
    line = run_generate([scenario("user1"), scenario("user2")], out, set(), engine)
    assert "2 batched calls" in line and "straggler tail" in line
    rows = read_rows(out / "trace")
    assert [(r["step"], r["call"], r["roles"], r["requests"], r["run_id"]) for r in rows] == [
        (1, 0, ["user"], 2, "r"),
        (2, 0, ["assistant"], 2, "r"),
    ]
    assert all(r["seconds"] >= r["last_finished"] >= r["first_finished"] >= 0 for r in rows)
    # resumed with user1 done: one more dialogue, its calls appended under a later session
    done = {("user1", "SD-Alarm-task-1", "base", 0)}
    run_generate([scenario("user1"), scenario("user3")], out, done, engine)
    again = read_rows(out / "trace")
    assert len(again) == 4 and len({r["session_started"] for r in again}) == 2
    assert sorted(r["requests"] for r in again) == [1, 1, 2, 2]


def test_an_engines_busy_time_is_the_union_of_its_calls_in_any_order_they_end():
    # calls that overlap on one engine (a cohort's call joining a running one), added in any order
    rng = random.Random(7)
    for _ in range(200):
        spans = [(s, s + rng.randint(0, 6)) for s in (rng.randint(0, 40) for _ in range(rng.randint(1, 12)))]
        totals = TraceTotals()
        for started, end in spans:
            totals.add(CallTrace(1, 0, "m", ("user",), 1, 10, 0, 5, float(started), float(end - started), 0, 0, 0, 1))
        covered = {t for started, end in spans for t in range(started, end)}  # unit slots of integer spans
        assert totals.busy == {"engine 0 (m)": float(len(covered))}
