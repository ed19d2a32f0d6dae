"""Continuous scheduling (`scheduling=continuous`): each dialogue's next request is submitted as
soon as its previous one finished, so no dialogue waits for the slowest reply of a round, and the
engine's queue is refilled while it runs. At most `in_flight` dialogues run at once (0: all), the
next starting when one ends: few enough that the engine's prefix cache keeps the histories of the
dialogues in flight between their turns (docs/performance.md). A request the engine stops running
without reporting it finished is answered as lockstep's engine answers it (engines/base.py
`dropped`): its dialogue ends `failed`, the others go on.

Same prompts, token ids and seeds as lockstep (lockstep.py builds them); the engines must take
requests while they run (engines/base.py `Submitting`: in-process vLLM). The trace has one record
per submission (the requests submitted together after one engine step), complete when its last
request finished: nothing waits for its tail, which says how unevenly its replies ended."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from personalens.data.records import Role
from personalens.engines.base import Engine, Generation, Sampling, dropped
from personalens.errors import PersonalensError
from personalens.simulate.dialogue import Dialogue
from personalens.simulate.lockstep import (
    Render,
    StepStats,
    answer,
    build_requests,
    fitting,
    plan_step,
    roles_of,
    token_prompts,
)
from personalens.simulate.trace import CallTrace, call_trace


@dataclass
class _Submission:
    """Requests submitted together, and what became of them (for the trace)."""

    step: int
    call: int
    model: str
    roles: tuple[str, ...]
    requests: int
    started: float
    context_ended: int = 0  # dialogues of the group that ended on context instead of a request
    done: list[float] = field(default_factory=list)
    generations: list[Generation] = field(default_factory=list)

    def trace(self, begun: float) -> CallTrace:
        return call_trace(
            (self.step, self.call),
            self.model,
            self.roles,
            self.requests,
            self.generations,
            begun,
            self.started,
            self.done,
            max(self.done, default=self.started),  # complete when its last request finished
            self.context_ended,
        )


def run_continuous(
    dialogues: Sequence[Dialogue],
    engines: Mapping[Role, Engine],
    render: Render,
    sampling: Mapping[Role, Sampling],
    on_finished: Callable[[list[Dialogue]], None],
    on_step: Callable[[StepStats], None] = lambda stats: None,
    clock: Callable[[], float] = time.monotonic,
    *,
    keep_ids: bool = True,
    in_flight: int = 0,
    room: Mapping[Role, int] | None = None,
) -> None:
    """Run every dialogue to its end, as run_lockstep does; a "step" here is one engine step that
    finished requests, and `on_step` gets the submissions it completed as its calls."""
    missing = sorted({e.name for e in engines.values() if not hasattr(e, "submit")})
    if missing:
        raise PersonalensError(
            f"scheduling=continuous needs engines that take requests while they run (in-process vLLM); "
            f"{', '.join(missing)} does not: use scheduling=lockstep"
        )
    room = {role: s.reply_tokens for role, s in sampling.items()} if room is None else room
    kept = token_prompts(engines) if keep_ids else {}
    waiting = deque(d for d in dialogues if d.waiting_on is not None)
    running: dict[tuple[int, str], tuple[Dialogue, Role, _Submission]] = {}
    begun = clock()
    step = 0
    unsent: list[CallTrace] = []  # records of groups whose dialogues all ended on context

    def finish(ended: list[Dialogue]) -> None:
        for ids in kept.values():
            ids.forget([(d.key, role) for d in ended for role in ("user", "assistant")])
        on_finished(ended)

    def submit(ready: Sequence[Dialogue]) -> list[Dialogue]:
        """Submit the next request of each ready dialogue; returns those that ended on context instead."""
        ended = []
        for call, (engine, asked) in enumerate(plan_step(ready, engines)):
            requests = build_requests(asked, render, sampling, kept.get(id(engine)))
            requests, sent_for = fitting(engine, requests, asked, room, clock())
            ended += [d for d, _ in asked if d.ended is not None]
            sent = _Submission(
                step, call, engine.name, roles_of(asked), len(requests), clock(), len(asked) - len(sent_for)
            )
            if not requests:
                unsent.append(sent.trace(begun))
                continue
            for request_id, (dialogue, role) in zip(engine.submit(requests), sent_for):
                running[(id(engine), request_id)] = (dialogue, role, sent)
        return ended

    def start(ready: list[Dialogue]) -> int:
        """Submit `ready`; a dialogue that ends at once is written and one still waiting takes its
        place. Returns how many ended."""
        ended_in_all = 0
        while ready:
            ended = submit(ready)
            if not ended:
                break
            finish(ended)
            ended_in_all += len(ended)
            ready = [waiting.popleft() for _ in range(min(len(ended), len(waiting)))]
        return ended_in_all

    ended_at_start = start([waiting.popleft() for _ in range(min(in_flight or len(waiting), len(waiting)))])
    if ended_at_start or unsent:  # dialogues that ended before sending anything still count
        on_step(StepStats(0, 0, len(running), ended_at_start, 0, 0.0, calls=tuple(unsent)))
        unsent.clear()
    while running:
        step += 1
        started = clock()
        for engine in {id(e): e for e in engines.values()}.values():
            if not any(key[0] == id(engine) for key in running):
                continue
            done = engine.finished()
            if engine.idle():  # it runs none of its requests: one it never reported finished was dropped
                answered = {request_id for request_id, _ in done}
                mine = [key[1] for key in running if key[0] == id(engine)]
                done = [*done, *((request_id, dropped()) for request_id in mine if request_id not in answered)]
            now = clock()
            advanced, completed = [], []
            for request_id, gen in done:
                dialogue, role, sent = running.pop((id(engine), request_id))
                answer(dialogue, role, gen, now)
                sent.done.append(now)
                sent.generations.append(gen)
                advanced.append(dialogue)
                if len(sent.done) == sent.requests:
                    completed.append(sent.trace(begun))
            ended = [d for d in advanced if d.ended is not None]
            if ended:
                finish(ended)
            ready = [d for d in advanced if d.ended is None]
            ended_at_once = start(ready + [waiting.popleft() for _ in range(min(len(ended), len(waiting)))])
            completed += unsent
            unsent.clear()
            on_step(
                StepStats(
                    step,
                    len(done),
                    len({id(d) for d, _, _ in running.values()}),
                    len(ended) + ended_at_once,
                    sum(g.completion_tokens for _, g in done),
                    clock() - started,
                    sum(g.prompt_tokens for _, g in done),
                    sum(g.cached_tokens for _, g in done),
                    tuple(completed),
                )
            )
