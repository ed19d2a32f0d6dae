"""Batched engine calls that move a progress bar as their requests finish, and the batch-and-write
loop of the pipelines that judge or generate many independent outputs (judge, PersonalBench)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from personalens.engines.base import Engine, Generation, Request
from personalens.progress import Progress

T = TypeVar("T")


def generate_with_progress(
    engine: Engine, requests: Sequence[Request], bar: Progress, remaining: int
) -> list[Generation]:
    """`engine.generate(requests)` with `bar` moving as requests finish, with the tokens they generated
    (where the engine says so, else all at the end); `remaining`: the items still to do, these
    requests included."""
    reported = {"requests": 0, "tokens": 0}

    def finished(n: int, tokens: int) -> None:
        reported["requests"] += n
        reported["tokens"] += tokens
        bar.update(n, active=remaining - reported["requests"], tokens=tokens)

    generations = engine.generate(requests, on_finished=finished)
    bar.update(
        len(requests) - reported["requests"],
        active=remaining - len(requests),
        tokens=sum(g.completion_tokens for g in generations) - reported["tokens"],
    )
    return generations


def generate_in_chunks(
    items: Sequence[T],
    requests: Callable[[Sequence[T]], list[Request]],
    load: Callable[[], Engine],
    write: Callable[[Sequence[T], list[Generation], Engine], None],
    *,
    label: str,
    unit: str,
    progress: bool,
    chunk: int,
) -> None:
    """Generate `requests` for `items` in calls of `chunk`, each chunk's outputs written before the
    next call (a killed run keeps what finished); `load` is called only when there is work."""
    if not items:
        return
    engine = load()
    bar = Progress(total=len(items), label=label, unit=unit, enabled=progress)
    for start in range(0, len(items), chunk):
        part = items[start : start + chunk]
        write(part, generate_with_progress(engine, requests(part), bar, remaining=len(items) - start), engine)
    bar.close()
