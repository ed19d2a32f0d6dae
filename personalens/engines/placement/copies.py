"""Copies of models on the GPUs a layout leaves free (`replicas`): a fixed number where the config
asks for one, else shared out by work, each next copy to the model whose engines take the longest per
dialogue. Each copy is a managed vLLM server with the KV cache the model has alone on its GPUs.

Where every model runs in this process sharing the first GPUs (the shared layout) and each asks for
the same number N of engines (`replicas: N`), the copies come in groups instead: N - 1 more groups
of GPUs each like the first, every model's copy on its group's GPUs with the KV cache and memory
share it has in the first, so that each engine of every model has an engine of each other model
beside it. A dialogue's requests go to the same copy of each model (engines/replicated.py picks it
from the dialogue alone), so each group of GPUs serves its own dialogues."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from personalens.engines.placement.fitting import shared_layout
from personalens.engines.placement.placed import SHARED, Layout, Placement
from personalens.engines.placement.sizing import ModelNeed, Rules
from personalens.errors import PersonalensError


def engine_time(m: ModelNeed, work: Mapping[str, float]) -> float:
    """A model's work per dialogue in units that compare across models: the tokens its roles generate
    (`work`, per role; a role left out counts 1) times the weights each of its GPUs reads per decoded
    token. Decoding reads every weight once a step, so this is in proportion to one engine's time."""
    return sum(work.get(role, 1.0) for role in m.roles) * m.weights / m.tp


def _alone(m: ModelNeed, rules: Rules) -> Placement:
    """The model alone on tensor_parallel_size GPUs of its own (GPUs 0.. here): it fits, as the
    layout placed it with as much room or less."""
    return shared_layout([dataclasses.replace(m, gpus=None, placement="auto")], m.tp, rules).placements[0]


def _copy(alone: Placement, gpus: Sequence[int], k: int) -> Placement:
    run = dataclasses.replace(
        alone.config, kv_cache_memory_bytes=alone.kv_cache_memory_bytes, max_model_len=alone.run_config.max_model_len
    )
    return dataclasses.replace(alone, mode="managed_server", run_config=run, gpus=tuple(gpus), copy=k)


def with_copies(chosen: Layout, n_gpus: int, work: Mapping[str, float] | None = None) -> Layout:
    """`chosen` with copies on the GPUs it leaves free: first the models that ask for N engines
    (`replicas: N`, N - 1 copies each, in their order; refused when the free GPUs cannot hold them),
    then the GPUs still free to the models set to `replicas: auto`, one copy at a time to the one
    whose engines take the longest per dialogue (`engine_time` over its engines), as long as
    one fits."""
    groups = _groups(chosen)
    if groups is not None:
        return _grouped(chosen, groups, n_gpus)
    rules = chosen.rules
    used = {g for p in chosen.placements for g in p.gpus}
    free = [g for g in range(n_gpus) if g not in used]
    given: dict[str, list[Placement]] = {m.key: [] for m in chosen.needs}
    whys = []
    for m in chosen.needs:
        if m.replicas is None or m.replicas == 1:
            continue
        more = m.replicas - 1
        if more * m.tp > len(free):
            raise PersonalensError(
                f"model {m.key}: replicas {m.replicas} asks for {m.replicas} engines: {more} more "
                f"cop{'y' if more == 1 else 'ies'} of {m.tp} GPU(s) each need {more * m.tp} GPU(s), the layout leaves "
                f"{len(free)} free ({', '.join(map(str, free)) or 'none'}) of the job's {n_gpus}. Ways out: replicas "
                "auto (copies on whatever GPUs are free) or a smaller number, more GPUs, or a smaller "
                "tensor_parallel_size"
            )
        alone = _alone(m, rules)
        for k in range(1, more + 1):
            given[m.key].append(_copy(alone, free[(k - 1) * m.tp : k * m.tp], k))
        free = free[more * m.tp :]
        whys.append(f"replicas {m.replicas} for {m.key}")
    auto = [m for m in chosen.needs if m.replicas is None]
    load = {m.key: engine_time(m, work or {}) for m in auto}
    alone = {}
    while fitting := [m for m in auto if m.tp <= len(free)]:
        m = max(fitting, key=lambda m: load[m.key] / (1 + len(given[m.key])))  # the first of equals
        alone.setdefault(m.key, _alone(m, rules))
        given[m.key].append(_copy(alone[m.key], free[: m.tp], len(given[m.key]) + 1))
        free = free[m.tp :]
    if alone:
        counts = ", ".join(
            f"{len(given[k])} cop{'y' if len(given[k]) == 1 else 'ies'} of {k}" for k in given if k in alone
        )
        whys.append(
            f"replicas auto shares the free GPUs out by work ({counts}: each next copy to the model whose engines "
            "take the longest per dialogue, as generated tokens x weights per GPU)"
        )
    placements = tuple(dataclasses.replace(p, copies=tuple(given.get(p.key, ()))) for p in chosen.placements)
    return dataclasses.replace(chosen, placements=placements, copies_why="; ".join(whys))


def _groups(chosen: Layout) -> int | None:
    """N where the chosen layout is the shared one, of several models that each ask for N > 1
    engines; else None."""
    asked = {m.replicas for m in chosen.needs}
    if chosen.name != SHARED or len(chosen.needs) < 2 or len(asked) != 1:
        return None
    [n] = asked
    return n if n is not None and n > 1 else None


def _grouped(chosen: Layout, n: int, n_gpus: int) -> Layout:
    """`chosen` (shared) with N - 1 more groups of GPUs, each holding a copy of every model placed as
    the first group holds it: the group's GPUs are the first group's, shifted by its width."""
    width = 1 + max(g for p in chosen.placements for g in p.gpus)
    if n * width > n_gpus:
        raise PersonalensError(
            f"replicas {n} for every model in this process ({', '.join(m.key for m in chosen.needs)}) asks for {n} "
            f"groups of the {width} GPU(s) they share: {n * width} GPUs, the job has {n_gpus}. Ways out: fewer "
            "replicas, more GPUs, or placement auto for the smaller models (their copies on GPUs of their own)"
        )

    def copy(p: Placement, k: int) -> Placement:
        # the run config's memory share is the model's own part of each GPU, as in process beside the others
        return dataclasses.replace(p, mode="managed_server", gpus=tuple(g + k * width for g in p.gpus), copy=k)

    placements = tuple(dataclasses.replace(p, copies=tuple(copy(p, k) for k in range(1, n))) for p in chosen.placements)
    why = (
        f"replicas {n} for every model in this process: {n} groups of GPU(s) "
        + " and ".join(",".join(str(g + k * width) for g in range(width)) for k in range(n))
        + ", each with an engine of every model sharing its GPUs by memory share (the copies in managed vLLM servers)"
    )
    return dataclasses.replace(chosen, placements=placements, copies_why=why)
