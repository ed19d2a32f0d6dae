"""Lockstep scheduling: every active dialogue advances one turn per step, each step one batched
generate call per engine, finished dialogues drop out.

When the user agent and the assistant share an engine, both roles' requests of a step go into the
same call, so the engine always sees the largest batch there is; a step of more than `chunk`
requests for one engine is sent in calls of `chunk`, so a step's prompts in memory stay bounded.

An engine with a `chat_tokenizer` gets each prompt as token ids kept per dialogue and role
(engines/tokens.py): a turn costs the tokens it adds, not a new tokenization of the history.

Every call is traced (trace.py): its requests and tokens, and when its requests finished, from the
engine's `on_finished` reports timestamped with `clock`."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from personalens.data.records import Role
from personalens.engines.base import Engine, Message, Request, Sampling
from personalens.engines.tokens import PromptIds
from personalens.simulate.dialogue import Dialogue
from personalens.simulate.trace import CallTrace, call_trace

Render = Callable[[Dialogue, Role], Sequence[Message]]


@dataclass
class StepStats:
    step: int
    requests: int
    active: int  # dialogues still running after the step
    finished: int  # dialogues that ended in this step
    completion_tokens: int
    seconds: float
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens the engine served from its prefix cache
    calls: tuple[CallTrace, ...] = ()  # the step's batched calls, in order


def plan_step(
    active: Iterable[Dialogue], engines: Mapping[Role, Engine]
) -> list[tuple[Engine, list[tuple[Dialogue, Role]]]]:
    """Group the waiting dialogues by the engine that must answer them, in a stable order."""
    groups: dict[int, tuple[Engine, list[tuple[Dialogue, Role]]]] = {}
    for dialogue in active:
        role = dialogue.waiting_on
        if role is None:
            continue
        engine = engines[role]
        groups.setdefault(id(engine), (engine, []))[1].append((dialogue, role))
    return list(groups.values())


def token_prompts(engines: Mapping[Role, Engine]) -> dict[int, PromptIds]:
    """Kept prompt ids per engine (by id) for the engines that tokenize in this process."""
    kept = {}
    for engine in engines.values():
        tokenizer = getattr(engine, "chat_tokenizer", None)
        if tokenizer is not None and id(engine) not in kept:
            kept[id(engine)] = PromptIds(tokenizer)
    return kept


def build_requests(
    waiting: Sequence[tuple[Dialogue, Role]],
    render: Render,
    sampling: Mapping[Role, Sampling],
    kept: PromptIds | None,
) -> list[Request]:
    messages = [render(d, role) for d, role in waiting]
    ids = (
        kept.ids([((d.key, role), role, m) for (d, role), m in zip(waiting, messages)])
        if kept
        else [None] * len(waiting)
    )
    return [
        Request(messages=m, sampling=replace(sampling[role], seed=d.turn_seed()), prompt_ids=i)
        for (d, role), m, i in zip(waiting, messages, ids)
    ]


def run_lockstep(
    dialogues: Sequence[Dialogue],
    engines: Mapping[Role, Engine],
    render: Render,
    sampling: Mapping[Role, Sampling],
    on_finished: Callable[[list[Dialogue]], None],
    on_step: Callable[[StepStats], None] = lambda stats: None,
    clock: Callable[[], float] = time.monotonic,
    *,
    chunk: int = 4096,
    keep_ids: bool = True,
) -> None:
    """Run every dialogue to its end. `on_finished` receives each step's finished dialogues
    (so the caller can write them out at once); `on_step` receives per-step statistics.
    `keep_ids=False` sends chat messages even to engines that could take token ids."""
    active = [d for d in dialogues if d.waiting_on is not None]
    kept = token_prompts(engines) if keep_ids else {}
    begun = clock()
    step = 0
    while active:
        step += 1
        started = clock()
        calls = [
            (engine, waiting[i : i + chunk])
            for engine, waiting in plan_step(active, engines)
            for i in range(0, len(waiting), chunk)
        ]
        traces = []
        for engine, waiting in calls:
            batch = build_requests(waiting, render, sampling, kept.get(id(engine)))
            traces.append(_call(engine, batch, waiting, (step, len(traces)), clock, begun))
        finished = [d for d in active if d.ended is not None]
        active = [d for d in active if d.ended is None]
        for ids in kept.values():
            ids.forget([(d.key, role) for d in finished for role in ("user", "assistant")])
        if finished:
            on_finished(finished)
        on_step(
            StepStats(
                step,
                sum(t.requests for t in traces),
                len(active),
                len(finished),
                sum(t.completion_tokens for t in traces),
                clock() - started,
                sum(t.prompt_tokens for t in traces),
                sum(t.cached_tokens for t in traces),
                tuple(traces),
            )
        )


def _call(
    engine: Engine,
    batch: list[Request],
    waiting: Sequence[tuple[Dialogue, Role]],
    where: tuple[int, int],
    clock: Callable[[], float],
    begun: float,
) -> CallTrace:
    """One batched call: its replies added to their dialogues, and its trace."""
    reported: list[float] = []

    def finished(n: int) -> None:
        now = clock()
        reported.extend([now] * n)

    started = clock()
    generations = engine.generate(batch, on_finished=finished)
    returned = clock()
    if len(generations) != len(batch):
        raise RuntimeError(f"engine {engine.name} returned {len(generations)} replies for {len(batch)} requests")
    for (dialogue, role), gen in zip(waiting, generations):
        dialogue.add(role, gen.text, gen.prompt_tokens, gen.completion_tokens, returned)
    roles = tuple(sorted({role for _, role in waiting}))
    return call_trace(where, engine.name, roles, len(batch), generations, begun, started, reported, returned)
