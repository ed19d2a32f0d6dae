"""The layouts a job could take for its bottleneck model (engines/placement/alternatives.py: over more
GPUs, as several engines, the other models beside it by memory share), each modelled as the run
takes it (plan/throughput.py `as_run`) on the same dialogues as the configured layout; the fastest
that fits is chosen, with the overrides under which the job builds it. Pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from personalens.engines.placement.alternatives import Alternative, places
from personalens.engines.placement.placed import Layout
from personalens.plan.engine_model import Turn
from personalens.plan.gpu_model import GpuFigures
from personalens.plan.speculative import SpecDecode
from personalens.plan.throughput import as_run


def compared(
    configured: Layout,
    alternatives: Sequence[Alternative],
    gpu: GpuFigures,
    work: Sequence[Sequence[Sequence[Turn]]],
    scale: float,
    in_flight_setting: str | int = "auto",
    cohorts_setting: int = 0,
    spec: Mapping[str, SpecDecode] | None = None,
) -> list[dict]:
    """One row per layout: the configured one first, then each alternative that is not the same
    placements, with its GPUs per engine, engines, and modelled seconds (`largest_shard_s`: the
    sample's times `scale`) or why it does not fit; the fastest that fits is `chosen`. A row's
    `overrides` make the job (`generate`, `judge`) build it (none for the configured layout). `spec`: as
    `compare`'s."""
    rows = [_row("as configured", configured, (), gpu, work, scale, in_flight_setting, cohorts_setting, spec)]
    if alternatives:
        rows[0] |= _shape(configured, alternatives[0].model)
    for a in alternatives:
        if a.layout is not None and places(a.layout) == places(configured):
            continue  # the configured layout itself
        shape = {"tp": a.tp, "engines": a.engines}
        if a.layout is None:
            rows.append(
                {"name": a.name, **shape, "fits": False, "chosen": False, "overrides": list(a.overrides), "why": a.why}
            )
            continue
        rows.append(
            _row(a.name, a.layout, a.overrides, gpu, work, scale, in_flight_setting, cohorts_setting, spec) | shape
        )
    timed = [r for r in rows if "seconds" in r]
    if timed:
        min(timed, key=lambda r: r["seconds"])["chosen"] = True
    return rows


def _shape(layout: Layout, model: str) -> dict:
    """The GPUs per engine and the engines of `model` in `layout`."""
    placed = next(p for p in layout.placements or () if p.config.name == model)
    return {"tp": len(placed.gpus), "engines": 1 + len(placed.copies)}


def _row(
    name: str,
    layout: Layout,
    overrides: Sequence[str],
    gpu: GpuFigures,
    work: Sequence[Sequence[Sequence[Turn]]],
    scale: float,
    in_flight_setting: str | int,
    cohorts_setting: int,
    spec: Mapping[str, SpecDecode] | None,
) -> dict:
    row = {"name": name, "fits": True, "overrides": list(overrides), "chosen": False}
    result = as_run(layout, gpu, work, in_flight_setting, cohorts_setting, spec)
    if result is not None:
        row |= {
            "tokens_per_s": result.tokens_per_s,
            "seconds": result.seconds,
            "largest_shard_s": result.seconds * scale,
            "busy_share": dict(result.busy),
        }
    return row
