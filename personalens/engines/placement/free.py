"""Whether a layout fits in what its GPUs hold free now, read just before its engines start.

A layout is planned on the GPUs' whole memory (layout.py). Before a loader starts its servers and
engines, the memory each GPU has free must cover what the layout puts there: a judge panel's next
model starts only once the previous model's engines and servers have stopped, and CUDA gives their
memory back as their processes exit, so the loader waits a while for it; memory still held after
that (by a process this command did not stop, or another job) refuses the start in one line rather
than let a server or engine fail on it. GPUs described rather than read (`plan.gpus`) have no free
memory to check."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable

from personalens.engines.placement.gpus import GIB, GpuSpec
from personalens.engines.placement.placed import Layout
from personalens.engines.stop import Stop
from personalens.errors import PersonalensError

WAIT_S = 60.0  # assumed: long enough for stopped servers' processes to exit and CUDA to free their memory
POLL_S = 1.0


def held_by_gpu(layout: Layout) -> dict[int, int]:
    """Per GPU index, the bytes the layout's engines and copies hold there."""
    held: dict[int, int] = defaultdict(int)
    if layout.rules is None:
        return held
    for p in layout.placements or ():
        for part in (p, *p.copies):
            for gpu in part.gpus:
                held[gpu] += part.held_per_gpu(layout.rules)
    return held


def short_of(layout: Layout, spec: GpuSpec | None) -> str | None:
    """None when every GPU has free what the layout holds there (or free memory is unknown); else
    one line naming the GPUs short of it."""
    if spec is None or not spec.free_bytes:
        return None
    short = [
        f"GPU {gpu} ({spec.device_ids((gpu,))[0]}) has {spec.free_bytes[gpu] / GIB:.1f} GiB free, the layout puts "
        f"{need / GIB:.1f} GiB there"
        for gpu, need in sorted(held_by_gpu(layout).items())
        if gpu < len(spec.free_bytes) and need > spec.free_bytes[gpu]
    ]
    if not short:
        return None
    return (
        "the GPUs do not hold free the memory this layout was planned with: "
        + "; ".join(short)
        + " (memory held by another process: a server or engine still running, or another job; nvidia-smi names it)"
    )


def wait_until_free(layout: Layout, read: Callable[[], GpuSpec | None], stop: Stop) -> None:
    """Returns once the GPUs `read` hold the layout's memory free; refuses after WAIT_S seconds."""
    wait_s = WAIT_S
    deadline = time.monotonic() + wait_s
    while (why := short_of(layout, read())) is not None:
        if time.monotonic() >= deadline:
            raise PersonalensError(f"{why}; waited {wait_s:.0f} s for it")
        stop.check()
        stop.wait(POLL_S)
