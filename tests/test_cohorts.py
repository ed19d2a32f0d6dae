"""Lockstep cohorts (simulate/lockstep.py, workers.py) with scripted engines: pure scheduling logic;
tests/test_generate_vllm.py runs the lockstep loop through the real vLLM engine."""

from __future__ import annotations

import dataclasses
import hashlib
import threading

import pytest
from test_lockstep import SAMPLING, dialogues

from personalens.engines.base import Generation
from personalens.engines.chat.token_ids import ChatTokenizer
from personalens.engines.models.config import ModelConfig
from personalens.engines.placement.cohorts import setting as cohorts_setting
from personalens.errors import PersonalensError
from personalens.simulate.dialogue import Dialogue
from personalens.simulate.lockstep import cohort_count, run_lockstep
from personalens.simulate.trace import TraceTotals


def history_render(dialogue: Dialogue, role: str):
    """A prompt holding the whole history, so that a reply depends on every turn before it."""
    turns = [{"role": "user" if t.role == role else "assistant", "content": t.text} for t in dialogue.turns]
    return [{"role": "system", "content": f"{dialogue.scenario.user.user_id} as {role}"}, *turns]


class GreedyEngine:
    """Greedy decoding, scripted: each reply a function of the prompt alone (as a greedy model's
    would be, whatever the batch); about one user reply in four says TERMINATE."""

    def __init__(self, name: str, tokenizer: ChatTokenizer | None = None):
        self.name = name
        self.calls: list[list[str]] = []  # per call: the dialogues' system prompts
        if tokenizer is not None:
            self.chat_tokenizer = tokenizer
        self.checked = 0  # prompt ids compared with a full tokenization

    def generate(self, requests, on_finished=None):
        self.calls.append([r.messages[0]["content"] for r in requests])
        out = []
        for r in requests:
            if r.prompt_ids is not None:
                assert list(r.prompt_ids) == self.chat_tokenizer.encode_chat(r.messages)
                self.checked += 1
            digest = hashlib.sha256(repr(r.messages).encode()).hexdigest()
            user = r.messages[0]["content"].endswith("as user")
            text = f"{self.name} says {digest[:8]}" + (" TERMINATE" if user and digest[0] in "0123" else "")
            out.append(Generation(text, prompt_tokens=len(r.messages), completion_tokens=3))
            if on_finished is not None:
                on_finished(1, 3)
        return out


def run(ds, engines, **options):
    steps = []
    run_lockstep(ds, engines, history_render, SAMPLING, lambda _: None, steps.append, **options)
    return steps


def many(n: int) -> list[Dialogue]:
    return dialogues(*[(f"user{i}", 3 + i % 5) for i in range(n)])


def test_one_and_two_cohorts_give_the_same_dialogues():
    outcomes = []
    for count in (1, 2, 3):
        ds = many(9)
        user, assistant = GreedyEngine("u"), GreedyEngine("a")
        steps = run(ds, {"user": user, "assistant": assistant}, cohorts=count)
        outcomes.append([(d.ended, [(t.role, t.text) for t in d.turns]) for d in ds])
        # every call carries one cohort's dialogues, all waiting on its engine's role
        assert all({s.calls[0].cohort} == {t.cohort for t in s.calls} for s in steps)
        assert {t.cohort for s in steps for t in s.calls} == set(range(count))
        assert all(
            t.roles == (("user",) if t.engine == 0 else ("assistant",)) and t.model == "ua"[t.engine]
            for s in steps
            for t in s.calls
        )
    assert outcomes[0] == outcomes[1] == outcomes[2]
    assert {ended for ended, _ in outcomes[0]} == {"terminated", "max_rounds"}


def test_two_cohorts_run_on_the_two_engines_at_the_same_time():
    """The assistant's first call (cohort 0) and the user agent's second (cohort 1's opening) meet at
    a barrier: they can only both pass it while running side by side."""
    meet = threading.Barrier(2, timeout=10)

    class Meeting(GreedyEngine):
        def __init__(self, name, at_call):
            super().__init__(name)
            self.at_call = at_call

        def generate(self, requests, on_finished=None):
            if len(self.calls) == self.at_call:
                meet.wait()
            return super().generate(requests, on_finished)

    ds = many(6)
    user, assistant = Meeting("u", at_call=1), Meeting("a", at_call=0)
    steps = run(ds, {"user": user, "assistant": assistant})  # auto: distinct engines, 2 cohorts
    assert [len(c) for c in user.calls[:2]] == [3, 3] and len(assistant.calls[0]) == 3
    assert all(d.ended is not None for d in ds)
    assert sorted(s.step for s in steps) == list(range(1, len(steps) + 1))
    assert steps[-1].active == 0 and sum(s.finished for s in steps) == 6


@pytest.mark.parametrize("joins", [True, False])
def test_an_engine_that_joins_calls_gets_a_cohorts_call_while_another_runs(joins):
    """Its first call waits for a second call to arrive: one that joins calls gets cohort 1's call
    while cohort 0's still runs (in threads of their own); one that does not gets them in turn."""

    class Overlapping(GreedyEngine):
        def __init__(self, name):
            super().__init__(name)
            self.joins_calls = joins
            self.running = 0
            self.most = 0  # calls running at once
            self.lock = threading.Lock()
            self.second = threading.Event()

        def generate(self, requests, on_finished=None):
            with self.lock:
                self.running += 1
                self.most = max(self.most, self.running)
                if self.running == 2:
                    self.second.set()
            self.second.wait(timeout=10 if joins else 0.2)
            try:
                return super().generate(requests, on_finished)
            finally:
                with self.lock:
                    self.running -= 1

    ds = many(8)
    user, assistant = Overlapping("u"), Overlapping("a")
    run(ds, {"user": user, "assistant": assistant}, cohorts=2)
    assert (user.most, assistant.most) == ((2, 2) if joins else (1, 1))
    assert all(d.ended is not None for d in ds)
    assert not any(t.name.startswith("lockstep") for t in threading.enumerate())  # every call's thread ended


def test_one_shared_engine_keeps_one_cohort_and_both_roles_in_a_call():
    engine = GreedyEngine("m")
    ds = many(4)
    ds[0].turns, ds[0].started = [], None
    assert cohort_count(0, {"user": engine, "assistant": engine}) == 1
    assert cohort_count(0, {"user": engine, "assistant": GreedyEngine("a")}) == 2
    assert cohort_count(3, {"user": engine, "assistant": engine}) == 3
    steps = run(ds, {"user": engine, "assistant": engine})
    assert [len(c) for c in engine.calls[:2]] == [4, 4]  # every dialogue in every call until one ends
    assert all(t.cohort == 0 and t.engine == 0 for s in steps for t in s.calls)


def test_auto_makes_small_cohorts_where_both_engines_join_calls():
    joining, other, queued = GreedyEngine("u"), GreedyEngine("a"), GreedyEngine("q")
    joining.joins_calls = other.joins_calls = True
    both = {"user": joining, "assistant": other}
    assert [cohort_count(0, both, n) for n in (0, 10, 64, 65, 1_020)] == [2, 2, 4, 5, 64]  # 16 dialogues each
    assert cohort_count(0, {"user": joining, "assistant": queued}, 1_020) == 2  # one answers a call at a time
    assert cohort_count(0, {"user": joining, "assistant": joining}, 1_020) == 1  # one engine, one cohort
    assert cohort_count(5, both, 1_020) == 5


def test_engines_that_cannot_step_side_by_side_take_turns():
    """Two in-process vLLM engines whose engine cores run in this process share vLLM's forward context
    (VLLM_ENABLE_V1_MULTIPROCESSING=0): auto keeps them in one cohort, more is refused in one line."""
    exclusive = GreedyEngine("a")
    exclusive.overlaps = False
    other = GreedyEngine("b")
    assert cohort_count(0, {"user": exclusive, "assistant": other}) == 1
    assert cohort_count(1, {"user": exclusive, "assistant": other}) == 1
    with pytest.raises(PersonalensError, match=r"lockstep.cohorts=2: a run\(s\) vLLM's engine core in this process"):
        cohort_count(2, {"user": other, "assistant": exclusive})
    assert cohort_count(3, {"user": exclusive, "assistant": exclusive}) == 3  # one engine: nothing overlaps


def test_nothing_to_simulate_needs_no_engine():
    ended = many(2)
    for d in ended:
        d.fail("refused", 0.0)
    assert run([], {}) == [] and run(ended, {}) == []


def test_a_failing_engine_stops_the_run_and_leaves_no_thread_behind():
    class Failing(GreedyEngine):
        def generate(self, requests, on_finished=None):
            raise RuntimeError("server exited")

    before = threading.active_count()
    with pytest.raises(RuntimeError, match="server exited"):
        run(many(4), {"user": GreedyEngine("u"), "assistant": Failing("a")})
    assert threading.active_count() == before


def test_kept_prompt_ids_stay_exact_with_cohorts_in_threads():
    """Each engine tokenizes in its own thread while the run forgets ended dialogues' ids."""
    config = ModelConfig(name="SmolLM2-135M-Instruct")
    user = GreedyEngine("u", ChatTokenizer.load(config))
    assistant = GreedyEngine("a", ChatTokenizer.load(config))
    ds = many(8)
    run(ds, {"user": user, "assistant": assistant}, cohorts=2)
    assert user.checked == sum(t.role == "user" for d in ds for t in d.turns) > 8
    assert assistant.checked == sum(t.role == "assistant" for d in ds for t in d.turns) > 8


def test_the_trace_totals_say_each_engines_busy_share():
    ds = many(6)
    steps = run(ds, {"user": GreedyEngine("u"), "assistant": GreedyEngine("a")})
    totals = TraceTotals()
    for s in steps:
        for t in s.calls:
            totals.add(t)
    assert sorted(totals.busy) == ["engine 0 (u)", "engine 1 (a)"]
    assert "busy: engine 0 (u) " in totals.line() and ", engine 1 (a) " in totals.line()
    # calls added in the order they end: overlapping ones count once
    clocked = TraceTotals()
    for started, seconds in [(0.0, 2.0), (1.0, 2.0), (5.0, 1.0)]:
        clocked.add(dataclasses.replace(steps[0].calls[0], started=started, seconds=seconds))
    assert clocked.busy == {"engine 0 (u)": 4.0} and clocked.span == 6.0
    assert "busy: engine 0 (u) 67% of 6.0 s" in clocked.line()


@pytest.mark.parametrize(("value", "expected"), [("auto", 0), (1, 1), (4, 4)])
def test_the_cohorts_setting(value, expected):
    assert cohorts_setting(value) == expected


@pytest.mark.parametrize("value", [0, -1, "two", True, 1.5])
def test_a_bad_cohorts_setting_is_refused(value):
    with pytest.raises(PersonalensError, match="lockstep.cohorts"):
        cohorts_setting(value)
