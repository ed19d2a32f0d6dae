"""A batched engine call that moves a progress bar as its requests finish."""

from __future__ import annotations

from collections.abc import Sequence

from personalens.engines.base import Engine, Generation, Request
from personalens.progress import Progress


def generate_with_progress(
    engine: Engine, requests: Sequence[Request], bar: Progress, remaining: int
) -> list[Generation]:
    """`engine.generate(requests)` with `bar` moving as requests finish (where the engine says so,
    else all at the end); `remaining`: the items still to do, these requests included."""
    reported = 0

    def finished(n: int) -> None:
        nonlocal reported
        reported += n
        bar.update(n, active=remaining - reported, tokens=0)

    generations = engine.generate(requests, on_finished=finished)
    bar.update(
        len(requests) - reported,
        active=remaining - len(requests),
        tokens=sum(g.completion_tokens for g in generations),
    )
    return generations
