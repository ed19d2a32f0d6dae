"""Continuous scheduling (personalens/simulate/continuous.py) with a scripted engine that takes
requests while it runs: each dialogue advances as soon as its own turn is done, at most `in_flight`
dialogues run, the prompts and seeds are lockstep's, and every submission is traced (pure logic;
tests/test_token_prompts_vllm.py runs it through the real vLLM engine)."""

from __future__ import annotations

import pytest
from cli_helpers import read_rows
from test_lockstep import SAMPLING, Measuring, ScriptedEngine, dialogues, growing, render, scenario
from test_trace import run_generate, scripted_render  # noqa: F401  # scripted_render: a fixture

from personalens.engines.base import Generation, dropped, rejected
from personalens.errors import PersonalensError
from personalens.simulate.continuous import run_continuous
from personalens.simulate.generate import Scheduling
from personalens.simulate.lockstep import run_lockstep


class TickingEngine:
    """Each request takes `ticks[dialogue]` engine steps (default 1); a reply is the request's seed,
    with TERMINATE in every user turn of the dialogues in `terminate` (an ending from their second
    user turn on). `finished()` is one engine step: the clock moves one tick. Also answers batched
    calls, for lockstep."""

    def __init__(self, ticks: dict[str, int] | None = None, terminate: frozenset[str] = frozenset()):
        self.name = "ticking"
        self.ticks, self.terminate = ticks or {}, terminate
        self.now = 0.0
        self.queue: list[tuple[str, float, object]] = []
        self.submitted: list[tuple[float, list[str]]] = []  # per submission: when, "dialogue:role" of each request
        self.ids = 0

    def reply(self, request) -> Generation:
        dialogue, role = request.messages[0]["content"].split("|")
        said = request.sampling.seed % 1000
        text = f"{said} TERMINATE" if role == "user" and dialogue in self.terminate else str(said)
        return Generation(text, prompt_tokens=10, completion_tokens=2, cached_tokens=3)

    def submit(self, requests):
        self.submitted.append((self.now, [r.messages[0]["content"].replace("|", ":") for r in requests]))
        ids = []
        for r in requests:
            self.ids += 1
            ids.append(f"r{self.ids}")
            dialogue = r.messages[0]["content"].split("|")[0]
            self.queue.append((ids[-1], self.now + self.ticks.get(dialogue, 1), r))
        return ids

    def finished(self):
        self.now += 1
        done = [(rid, self.reply(r)) for rid, due, r in self.queue if due <= self.now]
        self.queue = [q for q in self.queue if q[1] > self.now]
        return done

    def idle(self):
        return not self.queue

    def generate(self, requests, on_finished=None):
        return [self.reply(r) for r in requests]


def run(ds, engine, **kw):
    finished, steps = [], []
    run_continuous(
        ds,
        {"user": engine, "assistant": engine},
        render,
        SAMPLING,
        finished.append,
        steps.append,
        lambda: engine.now,
        **kw,
    )
    return finished, steps


def test_a_dialogue_advances_as_soon_as_its_own_turn_is_done():
    engine = TickingEngine({"user2": 5})
    ds = dialogues(("user1", 2), ("user2", 2))
    finished, steps = run(ds, engine)
    # user1's turns take one step each: its whole dialogue (4 turns) is done while user2's opening runs
    assert engine.submitted[:4] == [
        (0.0, ["user1:user", "user2:user"]),
        (1.0, ["user1:assistant"]),
        (2.0, ["user1:user"]),
        (3.0, ["user1:assistant"]),
    ]
    assert [[d.scenario.user.user_id for d in batch] for batch in finished] == [["user1"], ["user2"]]
    assert ds[0].finished == 4.0 and ds[1].finished == 20.0
    assert all(d.ended == "max_rounds" and d.rounds == 2 for d in ds)
    # every step's statistics add up to the turns and tokens
    assert sum(s.requests for s in steps) == 8 and sum(s.completion_tokens for s in steps) == 16
    assert sum(s.finished for s in steps) == 2 and steps[-1].active == 0


def test_the_dialogues_are_those_of_lockstep_same_prompts_and_seeds():
    specs = [("user1", 3), ("user2", 2), ("user3", 4), ("user4", 1)]
    terminate = frozenset({"user1", "user3"})
    by_lockstep = dialogues(*specs)
    engine = TickingEngine(terminate=terminate)
    run_lockstep(by_lockstep, {"user": engine, "assistant": engine}, render, SAMPLING, lambda _: None)
    by_continuous = dialogues(*specs)
    run(by_continuous, TickingEngine({"user1": 3, "user3": 2}, terminate))
    turns = [[(t.role, t.text) for t in d.turns] for d in by_lockstep]
    assert turns == [[(t.role, t.text) for t in d.turns] for d in by_continuous]
    assert [d.ended for d in by_lockstep] == [d.ended for d in by_continuous]
    assert [d.ended for d in by_continuous] == ["terminated", "max_rounds", "terminated", "max_rounds"]


def test_at_most_in_flight_dialogues_run_and_the_next_starts_as_one_ends():
    engine = TickingEngine({"user1": 3})
    ds = dialogues(("user1", 1), ("user2", 1), ("user3", 1), ("user4", 1), ("user5", 1))
    run(ds, engine, in_flight=2)
    running: set[str] = set()
    for _, asked in engine.submitted:
        running |= {a.split(":")[0] for a in asked}
        running -= {d.scenario.user.user_id for d in ds if d.finished is not None and d.finished <= _}
        assert len(running) <= 2
    starts = [a for _, asked in engine.submitted for a in asked if a.endswith(":user")]
    assert starts[:2] == ["user1:user", "user2:user"]
    # user2 ends first (one step per turn), so user3 starts before user1's opening is back
    assert engine.submitted[2] == (2.0, ["user3:user"])
    assert all(d.ended == "max_rounds" for d in ds)


def test_every_submission_is_traced_once_its_last_request_is_back():
    engine = TickingEngine({"user1": 1, "user2": 1, "user3": 1, "user4": 1, "user5": 4})
    ds = dialogues(("user1", 1), ("user2", 1), ("user3", 1), ("user4", 1), ("user5", 1))
    _, steps = run(ds, engine)
    traces = [t for s in steps for t in s.calls]
    assert sum(t.requests for t in traces) == 10
    opening = next(t for t in traces if t.step == 0)
    # five openings submitted at 0: four back at 1, user5's at 4; after the fourth, one of five runs
    assert (opening.requests, opening.roles, opening.started, opening.seconds) == (5, ("user",), 0.0, 4.0)
    assert (opening.first_finished, opening.last_finished, opening.tail, opening.reported) == (1.0, 4.0, 3.0, 5)
    assert (opening.prompt_tokens, opening.cached_tokens, opening.completion_tokens) == (50, 15, 10)
    # the step that completed it is the one that finished user5's opening
    assert next(s.step for s in steps if opening in s.calls) == 4


def test_an_engine_that_cannot_take_requests_while_it_runs_is_refused():
    engine = ScriptedEngine("batch-only", {})
    with pytest.raises(PersonalensError, match="batch-only does not: use scheduling=lockstep"):
        run_continuous(dialogues(("user1", 1)), {"user": engine, "assistant": engine}, render, SAMPLING, print)


@pytest.mark.parametrize("kw", [{"mode": "eager"}, {"chunk": 0}, {"in_flight": -1}, {"cohorts": -1}])
def test_scheduling_options_are_checked(kw):
    with pytest.raises(PersonalensError):
        Scheduling(**kw)


def test_generate_writes_the_dialogues_and_a_trace_row_per_submission(tmp_path, scripted_render):  # noqa: F811
    engine = TickingEngine({"user2": 3})
    line = run_generate(
        [scenario("user1"), scenario("user2")], tmp_path, set(), engine, Scheduling("continuous", in_flight=1)
    )
    assert "2 dialogues simulated" in line and "straggler tail" in line
    assert sorted(r["user_id"] for r in read_rows(tmp_path / "dialogues")) == ["user1", "user2"]
    # one dialogue at a time: every submission is one request, user1's two turns, then user2's
    trace = sorted(read_rows(tmp_path / "trace"), key=lambda r: r["started"])
    assert [(r["requests"], r["roles"]) for r in trace] == [(1, ["user"]), (1, ["assistant"])] * 2
    assert all(r["seconds"] >= r["last_finished"] >= r["first_finished"] >= 0 for r in trace)


def test_context_endings_and_refusals_as_lockstep_has_them():
    class Growing(TickingEngine):
        """A context of 40 "tokens" (characters, as test_lockstep's Measuring counts them); user2's
        first request is refused."""

        max_model_len = 40
        chat_tokenizer = Measuring()

        def reply(self, request):
            if request.messages[0]["content"].startswith("user2|") and not self.refused:
                self.refused = True
                return rejected("bad grammar")
            return super().reply(request)

    engine = Growing()
    engine.refused = False
    ds = dialogues(("user1", 9), ("user2", 9), ("user3", 9))
    finished, steps = [], []
    run_continuous(
        ds,
        {"user": engine, "assistant": engine},
        growing,
        SAMPLING,
        finished.extend,
        steps.append,
        lambda: engine.now,
        keep_ids=False,
        in_flight=2,
        room={"user": 8, "assistant": 8},
    )
    # as in lockstep: prompts of 10, 20, 30 characters fit, the fourth leaves less than 8 of 40
    assert [d.ended for d in ds] == ["context", "failed", "context"]
    assert [len(d.turns) for d in ds] == [3, 0, 3] and ds[1].error == "bad grammar"
    assert sorted(d.scenario.user.user_id for d in finished) == ["user1", "user2", "user3"]
    assert sum(s.finished for s in steps) == 3
    traces = [t for s in steps for t in s.calls]
    assert sum(t.context_ended for t in traces) == 2 and sum(t.refused for t in traces) == 1


class Dropping(TickingEngine):
    """Drops user2's first assistant request once submitted: it stops running it and never reports it
    finished, as vLLM may. Past 100 steps (far more than these runs need) the run is taken to never end."""

    def __init__(self):
        super().__init__()
        self.dropped = False

    def submit(self, requests):
        ids = super().submit(requests)
        victim = next((q for q in self.queue if q[2].messages[0]["content"] == "user2|assistant"), None)
        if victim is not None and not self.dropped:
            self.queue.remove(victim)
            self.dropped = True
        return ids

    def finished(self):
        assert self.now < 100, "the run never ends: it waits on the dropped request"
        return super().finished()


class DroppedInLockstep(TickingEngine):
    """Lockstep's engine over the same drop: its call answers that request as `dropped`."""

    def generate(self, requests, on_finished=None):
        out = []
        for r in requests:
            lost = r.messages[0]["content"] == "user2|assistant" and not getattr(self, "dropped", False)
            self.dropped = getattr(self, "dropped", False) or lost
            out.append(dropped() if lost else self.reply(r))
        return out


def test_a_dropped_request_ends_its_dialogue_as_failed_as_lockstep_records_it_and_the_others_complete():
    specs = [("user1", 2), ("user2", 2), ("user3", 2)]
    by_continuous = dialogues(*specs)
    finished, steps = run(by_continuous, Dropping(), in_flight=2)  # user3 takes user2's place once it ends
    by_lockstep = dialogues(*specs)
    engine = DroppedInLockstep()
    run_lockstep(by_lockstep, {"user": engine, "assistant": engine}, render, SAMPLING, lambda _: None)
    record = [[d.ended, d.error, [(t.role, t.text) for t in d.turns]] for d in by_lockstep]
    assert [[d.ended, d.error, [(t.role, t.text) for t in d.turns]] for d in by_continuous] == record
    assert [d.ended for d in by_continuous] == ["max_rounds", "failed", "max_rounds"]
    assert by_continuous[1].error == "vLLM dropped the request without a reply" and len(by_continuous[1].turns) == 1
    assert sorted(d.scenario.user.user_id for batch in finished for d in batch) == ["user1", "user2", "user3"]
    assert sum(t.refused for s in steps for t in s.calls) == 1
