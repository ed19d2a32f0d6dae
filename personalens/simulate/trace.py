"""The step trace: one record per batched generate call of a lockstep run, saying where the call's
wall time went. A call lasts until its slowest request finishes; while only a few requests are still
running, an accelerator decodes small batches and idles most of its width (the straggler tail).

Finish times come from the engine's `on_finished` callback (vLLM's per-request progress, a server's
replies as they arrive), timestamped here in the caller; requests an engine does not report count as
finished when the call returns. Pure arithmetic over those times; generate.py writes the records."""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field

from personalens.engines.base import Generation

TAIL_SHARE = 0.25  # the tail: fewer than this share of a call's requests still running


@dataclass(frozen=True)
class CallTrace:
    step: int  # the lockstep step (1-based) the call belongs to
    call: int  # its index among the step's calls
    model: str
    roles: tuple[str, ...]  # the roles whose requests the call carried, sorted
    requests: int
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    started: float  # seconds from the start of the lockstep run to the call's start
    seconds: float  # the call's wall time
    first_finished: float  # seconds from the call's start until its first request finished
    last_finished: float  # ... until its last request finished
    tail: float  # how long fewer than a quarter of its requests were still running
    reported: int  # finishes the engine reported during the call (the rest: at its return)
    # dialogues of the call's group that ended on context instead of sending a request (their prompt
    # left too little room for a reply), and requests the engine refused
    context_ended: int = 0
    refused: int = 0
    cut: int = 0  # replies cut at their max_tokens (finish_reason "length")
    cohort: int = 0  # the lockstep cohort whose step the call belongs to
    engine: int = 0  # the run's number of the engine that answered (0: the user agent's)


@dataclass(frozen=True)
class Finishes:
    """When a call's requests finished, as offsets from the call's start."""

    first: float
    last: float
    tail: float
    reported: int


def finishes(requests: int, started: float, reported: Sequence[float], returned: float) -> Finishes:
    """`reported`: the clock times of the finishes the engine reported, in order (one per request,
    at most `requests`); the requests not reported finished at `returned`."""
    times = sorted(min(t, returned) - started for t in reported[:requests])
    times += [returned - started] * (requests - len(times))
    if not times:
        return Finishes(0.0, 0.0, 0.0, 0)
    # after the j-th finish (1-based) requests - j are running: the tail starts at the first j
    # with requests - j < TAIL_SHARE * requests
    j = int(requests * (1 - TAIL_SHARE)) + 1
    return Finishes(times[0], times[-1], times[-1] - times[j - 1], min(len(reported), requests))


def call_trace(
    where: tuple[int, int],
    model: str,
    roles: tuple[str, ...],
    requests: int,
    generations: Sequence[Generation],
    begun: float,
    started: float,
    reported: Sequence[float],
    returned: float,
    context_ended: int = 0,
    cohort: int = 0,
    engine: int = 0,
) -> CallTrace:
    """The record of one call (`where`: its step and index) or submission of `requests` requests,
    started at `started` and complete at `returned` (clock times; `begun`: the run's start);
    `context_ended`: the group's dialogues that ended on context before it was sent; `cohort` and
    `engine`: its cohort and engine number."""
    done = finishes(requests, started, reported, returned)
    return CallTrace(
        step=where[0],
        call=where[1],
        model=model,
        roles=roles,
        requests=requests,
        prompt_tokens=sum(g.prompt_tokens for g in generations),
        cached_tokens=sum(g.cached_tokens for g in generations),
        completion_tokens=sum(g.completion_tokens for g in generations),
        started=started - begun,
        seconds=returned - started,
        first_finished=done.first,
        last_finished=done.last,
        tail=done.tail,
        reported=done.reported,
        context_ended=context_ended,
        refused=sum(g.error is not None for g in generations),
        cut=sum(g.finish_reason == "length" for g in generations),
        cohort=cohort,
        engine=engine,
    )


@dataclass
class TraceTotals:
    """Running totals for the closing line: how much of the calls' wall time was straggler tail, and
    how much of the run each engine was busy answering a call: the union of its calls' spans, exact
    whether its calls run one at a time (lockstep), overlap (calls that join a running batch) or are
    submissions (continuous), in whatever order they are added."""

    calls: int = 0
    seconds: float = 0.0
    tail: float = 0.0
    # per engine ("engine N (model)"): the disjoint spans in which it answered a call, in order
    spans: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    span: float = 0.0  # seconds from the run's start to the end of its last call
    prompt: dict[str, int] = field(default_factory=dict)  # per engine: prompt tokens of its calls
    cached: dict[str, int] = field(default_factory=dict)  # per engine: of them, served from its prefix cache

    def add(self, trace: CallTrace) -> None:
        self.calls += trace.requests > 0  # a record of dialogues ended on context alone sent nothing
        self.seconds += trace.seconds
        self.tail += trace.tail
        if trace.requests:
            engine = f"engine {trace.engine} ({trace.model})"
            end = trace.started + trace.seconds
            self.spans[engine] = _joined(self.spans.get(engine, []), (trace.started, end))
            self.span = max(self.span, end)
            self.prompt[engine] = self.prompt.get(engine, 0) + trace.prompt_tokens
            self.cached[engine] = self.cached.get(engine, 0) + trace.cached_tokens

    @property
    def busy(self) -> dict[str, float]:
        """Per engine, the seconds in which it was answering at least one call."""
        return {engine: sum(b - a for a, b in spans) for engine, spans in self.spans.items()}

    def line(self) -> str:
        share = self.tail / self.seconds if self.seconds > 0 else 0.0
        busy = ", ".join(f"{engine} {seconds / self.span:.0%}" for engine, seconds in sorted(self.busy.items()))
        return (
            f"{self.calls} batched calls, {share:.0%} of their wall time in the straggler tail "
            f"(fewer than {TAIL_SHARE:.0%} of a call's requests still running); busy: {busy or 'none'} "
            f"of {self.span:.1f} s; prompt tokens prefilled / cached: {self.prefill_line() or 'none'}"
        )

    def prefilled(self, engine: str) -> float:
        """The share of an engine's prompt tokens it computed (not served from its prefix cache)."""
        prompt = self.prompt.get(engine, 0)
        return 1 - self.cached.get(engine, 0) / prompt if prompt else 0.0

    def prefill_line(self) -> str:
        return ", ".join(
            f"{engine} {self.prefilled(engine):.0%} / {1 - self.prefilled(engine):.0%}"
            for engine in sorted(self.prompt)
            if self.prompt[engine]
        )


def _joined(spans: list[tuple[float, float]], new: tuple[float, float]) -> list[tuple[float, float]]:
    """Disjoint sorted `spans` with `new` added, merged with those it overlaps or touches."""
    i = bisect.bisect_left(spans, (new[0],))
    if i and spans[i - 1][1] >= new[0]:
        i -= 1
    j = i
    start, end = new
    while j < len(spans) and spans[j][0] <= end:
        start, end = min(start, spans[j][0]), max(end, spans[j][1])
        j += 1
    return [*spans[:i], (start, end), *spans[j:]]
