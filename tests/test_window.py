"""lockstep.in_flight (simulate/window.py, engines/placement/inflight.py): how many dialogues lockstep
keeps in flight, with scripted engines; bench/cohorts.py runs it through the real `generate`
(tests/test_cohorts_bench.py)."""

from __future__ import annotations

import functools

import pytest
from test_cohorts import GreedyEngine, history_render, many
from test_engine_layout import Recorder, conf, loader
from test_lockstep import SAMPLING, dialogues

from personalens.engines.placement.gpus import simulated
from personalens.engines.placement.inflight import Cache, caches, held, window
from personalens.errors import PersonalensError
from personalens.simulate.command import in_flight as in_flight_setting
from personalens.simulate.lockstep import run_lockstep
from personalens.simulate.window import AUTO, Window, lockstep_window


def run(ds, engines, **options):
    steps = []
    run_lockstep(ds, engines, history_render, SAMPLING, lambda _: None, steps.append, **options)
    return steps


def outcome(ds):
    return [(d.ended, [(t.role, t.text) for t in d.turns]) for d in ds]


@pytest.mark.parametrize("count", [1, 2])
def test_a_window_keeps_that_many_in_flight_and_changes_no_dialogue(count):
    free = many(10)
    run(free, {"user": GreedyEngine("u"), "assistant": GreedyEngine("a")}, cohorts=count)
    held = many(10)
    user, assistant = GreedyEngine("u"), GreedyEngine("a")
    steps = run(held, {"user": user, "assistant": assistant}, cohorts=count, window=Window.fixed(4))
    assert outcome(held) == outcome(free)  # replies depend on the prompt alone (greedy)
    # each cohort holds its share of 4; the shard's first dialogues go first, the others as they end
    assert max(t.requests for s in steps for t in s.calls) == 4 // count
    first = {name.split(" ")[0] for call in user.calls[:count] for name in call}
    assert first == {f"user{i}" for i in range(4)}
    assert {name.split(" ")[0] for call in user.calls for name in call} == {f"user{i}" for i in range(10)}
    assert max(s.active for s in steps) <= 4


@pytest.mark.parametrize("grown", [6, None])
def test_cohorts_beyond_the_windows_size_start_when_it_grows(grown):
    # 4 cohorts; 1 dialogue in flight until the first ends, then `grown` (None: every one)
    ds = many(12)
    user, assistant = GreedyEngine("u"), GreedyEngine("a")
    window = Window(lambda _: grown, {}, lambda _: 1)
    steps = run(ds, {"user": user, "assistant": assistant}, cohorts=4, window=window)
    free = many(12)
    run(free, {"user": GreedyEngine("u"), "assistant": GreedyEngine("a")}, cohorts=4)
    assert outcome(ds) == outcome(free)
    assert steps[0].calls[0].requests == 1 and {t.cohort for t in steps[0].calls} == {0}
    assert {t.cohort for s in steps for t in s.calls} == {0, 1, 2, 3}  # the other three joined later
    assert max(s.active for s in steps) == (6 if grown else 11)
    assert all(d.ended is not None for d in ds)


def test_cohorts_of_engines_that_join_calls_take_the_window_in_parts_of_16():
    user, assistant = GreedyEngine("u"), GreedyEngine("a")
    user.joins_calls = assistant.joins_calls = True
    ds = many(40)
    steps = run(ds, {"user": user, "assistant": assistant}, window=Window.fixed(20))  # auto: 3 cohorts
    # the window's 20: 16 for cohort 0, 4 for cohort 1, none for cohort 2 (not 7, 7 and 6)
    first = {t.cohort: t.requests for s in steps if s.step <= 2 for t in s.calls}
    assert first == {0: 16, 1: 4}
    assert max(s.active for s in steps) <= 20 and all(d.ended is not None for d in ds)


def test_every_dialogue_in_flight_without_a_window():
    steps = run(many(10), {"user": GreedyEngine("u"), "assistant": GreedyEngine("a")}, cohorts=1)
    assert steps[0].calls[0].requests == 10


def ended(*turns: tuple[str, int, int]):
    """A dialogue with these (role, prompt tokens, reply tokens) turns."""
    [d] = dialogues(("user9", 20))
    for role, prompt, reply in turns:
        d.add(role, "word", prompt, reply, 0.0)
    return d


def test_auto_starts_from_max_model_len_and_learns_from_the_dialogues():
    cached = (Cache(("user_agent",), 1_000, 16), Cache(("assistant",), 1_000, 16, 2))
    rule, start = functools.partial(window, cached), functools.partial(held, cached)
    sized = Window(rule, {"user_agent": 400, "assistant": 400}, start)
    # 1,000 // 400 on the user agent's one engine: as few as the caches keep, before any has ended
    assert sized.size([]) == 2 and rule({"user_agent": 400, "assistant": 400}) is None
    # ended: the user agent keeps 100 at most (its last prompt and reply), the assistant 150
    sized.add([ended(("user", 50, 10), ("assistant", 70, 20), ("user", 90, 10), ("assistant", 140, 10))])
    assert sized.tokens([]) == {"user_agent": 100, "assistant": 150}
    assert sized.size([]) == 10  # min(1,000 // 100, 2 x 1,000 // 150)
    # a dialogue still running that already holds more counts, as the first to end are the short ones:
    # then an assistant engine keeps 1,000 // 320 = 3, below a quarter of its 16: nothing held back
    longer = ended(("user", 240, 10), ("assistant", 300, 20))
    assert sized.tokens([longer]) == {"user_agent": 250, "assistant": 320}
    assert held(cached, sized.tokens([longer])) == 4 and sized.size([longer]) is None


def test_the_setting_and_what_it_makes():
    assert [in_flight_setting(v) for v in ("auto", "all", 7)] == [AUTO, 0, 7]
    for bad in ("some", 0, -1, True, 2.5):
        with pytest.raises(PersonalensError, match="lockstep.in_flight: expected auto, all or a whole number"):
            in_flight_setting(bad)
    cache = (Cache(("user_agent", "assistant"), 1_000, 256),)
    assert lockstep_window(0, cache, {}) is None and lockstep_window(AUTO, (), {"user": 10}) is None
    assert lockstep_window(3, (), {}).size([]) == 3
    # auto: one engine serving both roles keeps both roles' sequences
    assert lockstep_window(AUTO, cache, {"user": 100, "assistant": 150}).size([]) == 4


def test_the_run_sizes_the_window_from_the_layout_plan_models(tmp_path):
    """8 x 80 GB: the 70B user agent on GPUs 0-3, the 8B assistant with three copies; the loader gives
    `generate` the layout's caches, one engine per copy; without GPUs, none (every dialogue in flight)."""
    models = {"assistant": conf(tmp_path, "llama31_8b"), "user_agent": conf(tmp_path, "llama31_70b")}
    load = loader(models, tmp_path, simulated(8, 80), Recorder())
    assistant, seventy = load.layout.placements
    assert (
        load.caches
        == (
            Cache(("assistant",), assistant.kv_tokens, 256, 4),
            Cache(("user_agent",), seventy.kv_tokens, 256, 1),
        )
        == caches(load.layout.placements)
    )
    assert loader(models, tmp_path, None, Recorder()).caches == ()
