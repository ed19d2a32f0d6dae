"""Lockstep scheduling: every active dialogue advances one turn per step, each step one batched
generate call per engine, finished dialogues drop out.

With distinct engines for the user agent and the assistant, the dialogues are dealt into cohorts
(`cohort_count`) whose steps interleave: while one cohort's assistant turns run on the assistant's
engine, another's user turns run on the user agent's, each engine in a thread of its own
(workers.py), so that neither waits for the other. A step is then one cohort's. Where both engines
join calls (`joins_calls`: a call that arrives while another runs joins the engine's batch), a
cohort's call does not wait for the engine's running call either, and `auto` makes small cohorts
(engines/placement/cohorts.py), so that the engines stay full while a cohort's last replies finish.

With a `Window` (window.py) at most that many dialogues are in flight, shared out among the cohorts;
the others wait in the shard and start as dialogues end, so that the histories in flight stay in
the engines' prefix caches.

When the user agent and the assistant share an engine, both roles' requests of a step go into the
same call, so the engine always sees the largest batch there is; a step of more than `chunk`
requests for one engine is sent in calls of `chunk`, so a step's prompts in memory stay bounded.

An engine with a `chat_tokenizer` gets each prompt as token ids kept per dialogue and role
(engines/chat/token_ids.py): a turn costs the tokens it adds, not a new tokenization of the history. A server
engine that knows its model's tokenizer has one too: it sends the messages, the ids measure them.

Before a request is sent, a dialogue whose prompt (as kept ids) leaves less than its role's `room`
inside the engine's `max_model_len` ends on context instead (dialogue.py), whether the model runs in
this process or in a server, so both end the same dialogues; a request the engine refuses ends its
dialogue alone, on context when the prompt was too long for the model, else as failed. The rest of
the call goes on.

Every call is traced (trace.py): its requests and tokens, and when its requests finished, from the
engine's `on_finished` reports timestamped with `clock`."""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from personalens.data.records import Role
from personalens.engines.base import Engine, Generation, Message, Request, Sampling, conversation
from personalens.engines.chat.reasoning import THINKING
from personalens.engines.chat.token_ids import PromptIds
from personalens.engines.placement.cohorts import auto_cohorts, least_share, window_share
from personalens.errors import PersonalensError
from personalens.simulate.dialogue import Dialogue, TurnRecord
from personalens.simulate.trace import CallTrace, call_trace
from personalens.simulate.window import Window
from personalens.simulate.workers import EngineWorkers

log = logging.getLogger(__name__)

Render = Callable[[Dialogue, Role], Sequence[Message]]


# auto's dialogues per cohort where both engines join calls: bench/cohorts.py's timed engines
# (docs/performance.md) gained most with cohorts of about this size
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
    # the dialogues still running that the step advanced (lockstep; empty: any of the run's may have)
    advanced: tuple[Dialogue, ...] = ()


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
        Request(
            messages=m,
            sampling=replace(sampling[role], seed=d.turn_seed()),
            prompt_ids=i,
            affinity=conversation(*d.key),
        )
        for (d, role), m, i in zip(waiting, messages, ids)
    ]


def fitting(
    engine: Engine,
    batch: list[Request],
    waiting: Sequence[tuple[Dialogue, Role]],
    room: Mapping[Role, int],
    now: float,
) -> tuple[list[Request], list[tuple[Dialogue, Role]]]:
    """The requests whose prompt leaves at least their role's `room` tokens inside the engine's
    `max_model_len`, with their dialogues; the others' dialogues end on context. Prompts kept as ids
    are measured as they are; chat messages only where the engine tokenizes here (lockstep.token_ids
    false); an engine without a known context or tokenizer (a server whose config names no
    tokenizer) keeps them all, and refuses what does not fit (`answer`)."""
    limit = getattr(engine, "max_model_len", None)
    tokenizer = getattr(engine, "chat_tokenizer", None)
    if not limit or (tokenizer is None and any(r.prompt_ids is None for r in batch)):
        return batch, list(waiting)
    lengths = [len(r.prompt_ids) if r.prompt_ids is not None else None for r in batch]
    untokenized = [i for i, n in enumerate(lengths) if n is None]
    for i, ids in zip(
        untokenized, tokenizer.encode_chats([batch[i].messages for i in untokenized]) if untokenized else []
    ):
        lengths[i] = len(ids)
    kept_batch, kept_waiting = [], []
    for request, (dialogue, role), length in zip(batch, waiting, lengths):
        if length + room.get(role, 0) > limit:
            dialogue.out_of_context(now)
        else:
            kept_batch.append(request)
            kept_waiting.append((dialogue, role))
    return kept_batch, kept_waiting


def roles_of(waiting: Sequence[tuple[Dialogue, Role]]) -> tuple[str, ...]:
    return tuple(sorted({role for _, role in waiting}))


def answer(dialogue: Dialogue, role: Role, gen: Generation, now: float) -> None:
    """A reply's answer added to its dialogue (its thinking kept beside it); a reply that stopped
    inside its thinking, or a refused request, ends the dialogue instead."""
    if gen.error is None and gen.finish_reason == THINKING:
        dialogue.stopped_in_thinking(
            TurnRecord(
                role, "", gen.prompt_tokens, gen.completion_tokens, THINKING, gen.reasoning, gen.reasoning_tokens
            ),
            now,
        )
    elif gen.error is None:
        dialogue.add(
            role,
            gen.text,
            gen.prompt_tokens,
            gen.completion_tokens,
            now,
            gen.finish_reason,
            gen.reasoning,
            gen.reasoning_tokens,
        )
    elif gen.over_context:
        dialogue.out_of_context(now, gen.error)
    else:
        dialogue.fail(gen.error, now)


def cohort_count(requested: int, engines: Mapping[Role, Engine], dialogues: int = 0) -> int:
    """`requested` cohorts, or for 0 (auto) engines/placement/cohorts.py's `auto_cohorts` for these
    engines and `dialogues`: 1 when one engine serves both roles; for distinct engines, small cohorts
    when both join calls (`joins_calls`), else 2, so that each engine has a cohort's turns while the
    other answers the other's. Engines that cannot
    step at the same time as another in this process (`overlaps: False`: in-process vLLM engines
    whose engine core runs in this process, which share vLLM's forward context) take turns: auto
    gives 1, and more is refused."""
    if requested < 0:
        raise ValueError(f"cohorts must be >= 0 (0: auto), got {requested}")
    distinct = {id(engines[role]): engines[role] for role in ("user", "assistant")}
    exclusive = [e.name for e in distinct.values() if not getattr(e, "overlaps", True)]
    if len(distinct) > 1 and exclusive:
        if requested > 1:
            raise PersonalensError(
                f"lockstep.cohorts={requested}: {', '.join(exclusive)} run(s) vLLM's engine core in this process "
                "(VLLM_ENABLE_V1_MULTIPROCESSING=0), whose steps cannot overlap another engine's: set "
                "lockstep.cohorts=1, or leave that variable unset"
            )
        return 1
    return requested or auto_cohorts(dialogues, len(distinct) > 1, joining(engines))


def joining(engines: Mapping[Role, Engine]) -> bool:
    """Whether the user agent's and the assistant's engines both join calls (`joins_calls`)."""
    return all(getattr(engines[role], "joins_calls", False) for role in ("user", "assistant"))


@dataclass
class _Cohort:
    """Dialogues that advance together, one turn per batched call; its current step's calls."""

    index: int
    active: list[Dialogue]
    step: int = 0  # the run's number of its current step
    started: float = 0.0
    running: bool = False  # its step's calls are queued or running
    traces: list[CallTrace | None] = field(default_factory=list)


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
    room: Mapping[Role, int] | None = None,
    cohorts: int = 0,
    window: Window | None = None,
) -> None:
    """Run every dialogue to its end. `on_finished` receives each step's finished dialogues
    (so the caller can write them out at once); `on_step` receives per-step statistics.
    `keep_ids=False` sends chat messages even to engines that could take token ids. `room`: the
    tokens a role's prompt must leave for its reply (default: its sampling's reply_tokens).

    The dialogues are dealt round-robin into `cohorts` cohorts (0: `cohort_count`'s choice); each
    cohort's next step is queued as soon as its previous one finished, its calls to each engine
    behind the calls queued there before (workers.py), so while one cohort's assistant turns run,
    another's user turns run on the user agent's engine. A step is one cohort's; steps are numbered
    in the order they start.

    With a `window`, the dialogues wait in the shard's order and each cohort takes its share of the
    window's size, again whenever its dialogues end (window.py)."""
    if all(d.waiting_on is None for d in dialogues):
        return  # nothing to simulate: `generate` loads no engines then
    room = {role: s.reply_tokens for role, s in sampling.items()} if room is None else room
    kept = token_prompts(engines) if keep_ids else {}
    locks = {key: threading.Lock() for key in kept}  # a worker makes ids while the caller forgets some
    numbers: dict[int, int] = {}
    for role in ("user", "assistant"):
        numbers.setdefault(id(engines[role]), len(numbers))
    count = cohort_count(cohorts, engines, sum(d.waiting_on is not None for d in dialogues))
    least = least_share(count, not cohorts, joining(engines))  # a cohort's part of the window
    if window is None:
        groups = [_Cohort(k, [d for d in dialogues[k::count] if d.waiting_on is not None]) for k in range(count)]
    else:
        groups = [_Cohort(k, []) for k in range(count)]
    waiting = deque(d for d in dialogues if d.waiting_on is not None) if window is not None else deque()
    sizes: list[int | None] = []

    def admit(idle: Iterable[_Cohort]) -> None:
        """Fills the `idle` cohorts up to their shares of the window's size from the waiting
        dialogues: the window split evenly, in parts of at least `least` dialogues (cohorts beyond
        the parts have none until it grows)."""
        if not waiting or window is None:
            return
        size = window.size(d for c in groups for d in c.active)
        if size != (sizes[-1] if sizes else None):
            sizes.append(size)
            log.info(
                f"lockstep: {size if size is not None else 'every'} dialogue(s) in flight, "
                f"{len(waiting)} waiting (lockstep.in_flight)"
            )
        if size is None:
            size = len(waiting) + sum(len(c.active) for c in groups)
        for cohort in idle:
            share = window_share(size, count, least, cohort.index)
            while waiting and len(cohort.active) < share:
                cohort.active.append(waiting.popleft())

    begun = clock()
    steps = itertools.count(1)

    with EngineWorkers(engines.values()) as workers:

        def send(cohort: _Cohort, engine: Engine, waiting: list[tuple[Dialogue, Role]], call: int) -> CallTrace:
            key = id(engine)
            with locks.get(key, contextlib.nullcontext()):
                batch = build_requests(waiting, render, sampling, kept.get(key))
                batch, sent = fitting(engine, batch, waiting, room, clock())
            return _call(
                engine,
                batch,
                sent,
                (cohort.step, call),
                clock,
                begun,
                roles_of(waiting),
                len(waiting) - len(sent),
                workers.stopped,
                (cohort.index, numbers[key]),
            )

        def start(cohort: _Cohort) -> None:
            cohort.step, cohort.started, cohort.running = next(steps), clock(), True
            calls = [
                (engine, waiting[i : i + chunk])
                for engine, waiting in plan_step(cohort.active, engines)
                for i in range(0, len(waiting), chunk)
            ]
            cohort.traces = [None] * len(calls)
            for call, (engine, waiting) in enumerate(calls):
                workers.submit(engine, (cohort.index, call), functools.partial(send, cohort, engine, waiting, call))

        admit(groups)
        for cohort in groups:
            if cohort.active:
                start(cohort)
        while workers.busy:
            (index, call), trace = workers.next()
            cohort = groups[index]
            cohort.traces[call] = trace
            if any(t is None for t in cohort.traces):
                continue
            traces = [t for t in cohort.traces if t is not None]
            finished = [d for d in cohort.active if d.ended is not None]
            cohort.active = [d for d in cohort.active if d.ended is None]
            if window is not None:
                window.add(finished)  # before on_finished releases their turns
            for key, ids in kept.items():
                with locks[key]:
                    ids.forget([(d.key, role) for d in finished for role in ("user", "assistant")])
            if finished:
                on_finished(finished)
            on_step(
                StepStats(
                    cohort.step,
                    sum(t.requests for t in traces),
                    sum(len(c.active) for c in groups),
                    len(finished),
                    sum(t.completion_tokens for t in traces),
                    clock() - cohort.started,
                    sum(t.prompt_tokens for t in traces),
                    sum(t.cached_tokens for t in traces),
                    tuple(traces),
                    tuple(cohort.active),
                )
            )
            cohort.running = False
            # this cohort, and those the window had no part for, which it may have now
            idle = [c for c in groups if not c.running]
            admit(idle)
            for c in idle:
                if c.active:
                    start(c)


def _call(
    engine: Engine,
    batch: list[Request],
    waiting: Sequence[tuple[Dialogue, Role]],
    where: tuple[int, int],
    clock: Callable[[], float],
    begun: float,
    roles: tuple[str, ...],
    context_ended: int = 0,
    stopped: Callable[[], None] = lambda: None,
    unit: tuple[int, int] = (0, 0),
) -> CallTrace:
    """One batched call (`where`: its step and index in the step; `unit`: its cohort and engine
    number): its replies added to their dialogues, and its trace. `stopped` raises once the run is
    stopping."""
    reported: list[float] = []

    def finished(n: int, tokens: int) -> None:
        stopped()
        now = clock()
        reported.extend([now] * n)

    started = clock()
    generations = engine.generate(batch, on_finished=finished) if batch else []
    returned = clock()
    if len(generations) != len(batch):
        raise RuntimeError(f"engine {engine.name} returned {len(generations)} replies for {len(batch)} requests")
    for (dialogue, role), gen in zip(waiting, generations):
        answer(dialogue, role, gen, returned)
    return call_trace(
        where, engine.name, roles, len(batch), generations, begun, started, reported, returned, context_ended, *unit
    )
