"""The lockstep scheduler and the protocol rules, with a scripted engine (pure logic only;
tests/test_generate_vllm.py runs the same code through the real vLLM engine)."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from personalens.data.records import Scenario, Situation, Task, UserProfile
from personalens.engines.base import Generation, Sampling, rejected
from personalens.simulate.dialogue import Dialogue, strip_terminate
from personalens.simulate.lockstep import run_lockstep


def scenario(user: str, task: str = "SD-Alarm-task-1", kind: str = "SD") -> Scenario:
    profile = UserProfile(
        index=int(user[4:]), user_id=user, demographics={}, interests={}, affinities={}, interactions={}
    )
    return Scenario(
        profile,
        Task(task, kind, "d", "i", "g", ("Alarm",), ()),
        Situation("Paris", "Phone", "Morning", "Monday", "Quiet"),
    )


class ScriptedEngine:
    """Replies from a per-dialogue script; records every batch it is sent."""

    def __init__(self, name: str, scripts: dict[str, list[str]], default: str = "ok"):
        self.name = name
        self.scripts = {k: iter(v) for k, v in scripts.items()}
        self.default = default
        self.calls: list[list[tuple[str, str]]] = []  # per call: (dialogue id, role)

    def generate(self, requests, on_finished=None):
        batch = []
        out = []
        for r in requests:
            dialogue_id, role = r.messages[0]["content"].split("|")
            batch.append((dialogue_id, role))
            text = next(self.scripts.get(f"{dialogue_id}:{role}", iter(())), self.default)
            out.append(
                Generation(
                    text,
                    prompt_tokens=10,
                    completion_tokens=len(text.split()),
                    cached_tokens=4 if role == "assistant" else 0,
                )
            )
        self.calls.append(batch)
        return out


def render(dialogue: Dialogue, role: str):
    return [{"role": "user", "content": f"{dialogue.scenario.user.user_id}|{role}"}]


SAMPLING = {"user": Sampling(temperature=0.5, max_tokens=8), "assistant": Sampling(max_tokens=8)}


def dialogues(*specs: tuple[str, int]) -> list[Dialogue]:
    return [Dialogue(scenario(u), setting="base", trial=0, seed=i, max_rounds=m) for i, (u, m) in enumerate(specs)]


def simulate(ds, engines, **options):
    finished_batches = []
    clock = itertools.count()
    run_lockstep(ds, engines, render, SAMPLING, finished_batches.append, clock=lambda: float(next(clock)), **options)
    return finished_batches


def test_step_statistics_count_each_steps_requests_and_tokens():
    engine = ScriptedEngine("m", {"user1:user": ["hi there", "ok TERMINATE"]}, default="fine")
    steps = []
    ds = dialogues(("user1", 5), ("user2", 1))
    run_lockstep(ds, {"user": engine, "assistant": engine}, render, SAMPLING, lambda _: None, steps.append)
    # user turns cost 10 prompt tokens, none cached; assistant turns 10 with 4 cached
    assert [(s.requests, s.active, s.finished) for s in steps] == [(2, 2, 0), (2, 1, 1), (1, 1, 0), (1, 0, 1)]
    assert [s.completion_tokens for s in steps] == [2 + 1, 1 + 1, 2, 1]
    assert [(s.prompt_tokens, s.cached_tokens) for s in steps] == [(20, 0), (20, 8), (10, 0), (10, 4)]


def test_each_step_sends_exactly_the_waiting_dialogues_and_finished_ones_drop_out():
    engine = ScriptedEngine("m", {"user1:user": ["hi", "thanks TERMINATE"]})
    ds = dialogues(("user1", 5), ("user2", 2), ("user3", 3))
    finished = simulate(ds, {"user": engine, "assistant": engine})
    # one shared engine: one call per step holding every active dialogue, roles alternating
    assert engine.calls[0] == [("user1", "user"), ("user2", "user"), ("user3", "user")]
    assert engine.calls[1] == [("user1", "assistant"), ("user2", "assistant"), ("user3", "assistant")]
    # step 4: user1 says TERMINATE, step 4's assistant reply ends it; user2 ends at 2 rounds
    assert [[d.scenario.user.user_id for d in batch] for batch in finished] == [["user1", "user2"], ["user3"]]
    assert engine.calls[4] == [("user3", "user")]  # user1 and user2 no longer sent
    assert len(engine.calls) == 6
    by_user = {d.scenario.user.user_id: d for d in ds}
    assert by_user["user1"].ended == "terminated" and by_user["user1"].rounds == 2
    assert by_user["user2"].ended == "max_rounds" and by_user["user2"].rounds == 2
    assert by_user["user3"].ended == "max_rounds" and by_user["user3"].rounds == 3


def test_terminate_is_removed_and_the_assistant_answers_once_more():
    engine = ScriptedEngine(
        "m",
        {
            "user1:user": ["book a table", "perfect, thanks! TERMINATE"],
            "user1:assistant": ["which time?", "booked", "goodbye!"],
        },
    )
    (d,) = dialogues(("user1", 20))
    simulate([d], {"user": engine, "assistant": engine})
    assert [(t.role, t.text) for t in d.turns] == [
        ("user", "book a table"),
        ("assistant", "which time?"),
        ("user", "perfect, thanks!"),
        ("assistant", "booked"),
    ]
    assert d.ended == "terminated"


def test_terminate_in_the_opening_message_is_not_an_ending():
    engine = ScriptedEngine("m", {"user1:user": ["hello TERMINATE", "more please", "fine"]})
    (d,) = dialogues(("user1", 2))
    simulate([d], {"user": engine, "assistant": engine})
    assert d.opening_terminate
    assert d.turns[0].text == "hello TERMINATE"  # kept as data
    assert d.ended == "max_rounds" and d.rounds == 2


def test_max_rounds_counts_assistant_replies():
    engine = ScriptedEngine("m", {})
    (d,) = dialogues(("user1", 3))
    simulate([d], {"user": engine, "assistant": engine})
    assert [t.role for t in d.turns] == ["user", "assistant"] * 3
    assert d.ended == "max_rounds"


def test_two_engines_get_one_call_each_per_step_with_their_role_only():
    user_engine = ScriptedEngine("u", {"user1:user": ["a", "b TERMINATE"]})
    assistant_engine = ScriptedEngine("a", {})
    ds = dialogues(("user1", 4), ("user2", 4))
    simulate(ds, {"user": user_engine, "assistant": assistant_engine}, cohorts=1)
    assert all(role == "user" for call in user_engine.calls for _, role in call)
    assert all(role == "assistant" for call in assistant_engine.calls for _, role in call)
    # both dialogues wait on the same role at every step, so each step calls exactly one engine
    assert len(user_engine.calls) + len(assistant_engine.calls) == 8
    assert [len(c) for c in user_engine.calls] == [2, 2, 1, 1]


def test_per_turn_seeds_are_distinct_and_reproducible():
    seen = []

    class SeedEngine(ScriptedEngine):
        def generate(self, requests, on_finished=None):
            seen.extend(r.sampling.seed for r in requests)
            return super().generate(requests)

    engine = SeedEngine("m", {})
    (d,) = dialogues(("user1", 2))
    simulate([d], {"user": engine, "assistant": engine})
    first = list(seen)
    assert len(set(first)) == len(first) == 4
    seen.clear()
    (d,) = dialogues(("user1", 2))
    simulate([d], {"user": engine, "assistant": engine})
    assert seen == first


def test_a_reply_for_the_wrong_role_is_refused():
    (d,) = dialogues(("user1", 2))
    with pytest.raises(ValueError, match="waiting on user"):
        d.add("assistant", "hi", 1, 1, 0.0)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Great, thanks! TERMINATE", "Great, thanks!"),
        ("TERMINATE", ""),
        ("All set. 'TERMINATE'", "All set."),
    ],
)
def test_strip_terminate(text, expected):
    assert strip_terminate(text) == expected


# --- dialogues that outgrow the context, and requests an engine refuses -------------------------


class Measuring:
    """A stand-in for an in-process engine's tokenizer: a prompt is as many tokens as its messages
    hold characters (pure logic; tests/test_context_vllm.py does this with the real engine)."""

    @staticmethod
    def encode_chats(conversations):
        return [[0] * sum(len(m["content"]) for m in c) for c in conversations]


class GrowingEngine(ScriptedEngine):
    """A scripted engine with a context of `max_model_len` tokens, as `Measuring` counts them."""

    def __init__(self, max_model_len: int, refuse: dict[str, str] | None = None):
        super().__init__("m", {})
        self.max_model_len = max_model_len
        self.chat_tokenizer = Measuring()
        self.refuse = refuse or {}  # dialogue id -> the message its first request is refused with

    def generate(self, requests, on_finished=None):
        out = super().generate(requests, on_finished)
        for i, (dialogue_id, _) in enumerate(self.calls[-1]):
            if dialogue_id in self.refuse:
                out[i] = rejected(self.refuse.pop(dialogue_id))
        return out


def growing(dialogue: Dialogue, role: str):
    """A prompt that grows by 10 characters a turn: `<user>|<role>` then the turns' padding."""
    return [{"role": "user", "content": f"{dialogue.scenario.user.user_id}|{role}" + "x" * 10 * len(dialogue.turns)}]


def test_a_dialogue_whose_next_prompt_leaves_too_little_room_ends_on_context():
    engine = GrowingEngine(max_model_len=40)
    steps, finished = [], []
    ds = dialogues(("user1", 9), ("user2", 9))
    run_lockstep(
        ds,
        {"user": engine, "assistant": engine},
        growing,
        SAMPLING,
        finished.extend,
        steps.append,
        keep_ids=False,
        room={"user": 8, "assistant": 8},
    )
    # prompts are 10, 20, 30 ... characters: the fourth turn's 40 + room 8 > 40, so both end after three turns
    assert [d.ended for d in ds] == ["context", "context"]
    assert [len(d.turns) for d in ds] == [3, 3] and [d.rounds for d in ds] == [1, 1]
    assert all(d.error is None for d in ds) and finished == ds
    # nothing was sent for them in the last step: its trace says why
    last = steps[-1]
    assert last.requests == 0 and last.finished == 2
    assert [(c.requests, c.context_ended) for c in last.calls] == [(0, 2)]


def test_the_room_defaults_to_the_roles_max_tokens():
    engine = GrowingEngine(max_model_len=40)
    ds = dialogues(("user1", 9))
    sampling = {"user": Sampling(temperature=0.5, max_tokens=25), "assistant": Sampling(max_tokens=1)}
    run_lockstep(ds, {"user": engine, "assistant": engine}, growing, sampling, lambda _: None, keep_ids=False)
    # user prompts: 10 + 25 fits, 30 + 25 does not; assistant prompts leave 1 token: 20 + 1 fits
    assert ds[0].ended == "context" and len(ds[0].turns) == 2


def test_a_refused_request_ends_its_dialogue_alone():
    too_long = "This model's maximum context length is 40 tokens. However, your prompt contains 55 input tokens"
    engine = GrowingEngine(max_model_len=10_000, refuse={"user1": "bad grammar", "user2": too_long})
    ds = dialogues(("user1", 2), ("user2", 2), ("user3", 2))
    steps = []
    engines = {"user": engine, "assistant": engine}
    run_lockstep(ds, engines, growing, SAMPLING, lambda _: None, steps.append, keep_ids=False)
    assert [d.ended for d in ds] == ["failed", "context", "max_rounds"]
    assert ds[0].error == "bad grammar" and ds[1].error == too_long and ds[2].error is None
    assert [len(d.turns) for d in ds] == [0, 0, 4]
    assert steps[0].calls[0].refused == 2 and steps[0].finished == 2


def test_an_engine_without_a_known_context_sends_every_prompt():
    engine = ScriptedEngine("m", {})  # a server: no max_model_len, no tokenizer here
    ds = dialogues(("user1", 2))
    run_lockstep(ds, {"user": engine, "assistant": engine}, growing, SAMPLING, lambda _: None, room={"user": 10**9})
    assert ds[0].ended == "max_rounds"


def test_finish_reasons_are_kept_per_turn():
    class Cutting(ScriptedEngine):
        def generate(self, requests, on_finished=None):
            return [
                dataclasses.replace(g, finish_reason="length" if i % 2 else "stop")
                for i, g in enumerate(super().generate(requests, on_finished))
            ]

    engine = Cutting("m", {})
    ds = dialogues(("user1", 1), ("user2", 1))
    run_lockstep(ds, {"user": engine, "assistant": engine}, render, SAMPLING, lambda _: None)
    assert [[t.finish_reason for t in d.turns] for d in ds] == [["stop", "stop"], ["length", "length"]]
