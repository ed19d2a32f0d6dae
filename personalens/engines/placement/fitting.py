"""Whether a command's models fit on the job's GPUs, and how: the two layouts (`shared_layout`, every
model in this process; `own_layout`, each on GPUs of its own), the choice between them (`layouts`),
the largest max_model_len that fits, and the refusal that gives the sizes and the ways out."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from personalens.engines.models.config import MAX_MODEL_LEN_AUTO, ModelConfig
from personalens.engines.placement.gpus import GIB
from personalens.engines.placement.placed import OWN, SHARED, Layout, Placement
from personalens.engines.placement.sizing import ModelNeed, Rules, budgets
from personalens.errors import PersonalensError

# defined: max_model_len is searched in steps of this many tokens (vLLM's KV blocks are 16)
MAX_MODEL_LEN_STEP = 256


def _placed(m: ModelNeed, mode: str, gpus: tuple[int, ...], budget: int, rules: Rules) -> Placement:
    config = m.config if m.config is not None else ModelConfig(m.key)
    run = dataclasses.replace(config, kv_cache_memory_bytes=budget)
    if config.max_model_len == MAX_MODEL_LEN_AUTO:
        run = dataclasses.replace(run, max_model_len=m.max_model_len)
    weights = math.ceil(m.weights / m.tp)
    if mode == "in_process":
        # vLLM checks at start-up that this share of the GPU is free: each engine's own part, so the
        # second engine on a GPU finds it free beside the first
        held = weights + rules.overhead_bytes + m.activation + budget
        run = dataclasses.replace(run, gpu_memory_utilization=held / rules.gpu_bytes)
    return Placement(
        config=config,
        roles=m.roles,
        mode=mode,
        run_config=run,
        key=m.key,
        gpus=gpus,
        weights_per_gpu=weights,
        activation_per_gpu=m.activation,
        kv_per_token_per_gpu=m.kv_per_token,
        kv_cache_memory_bytes=budget,
        max_len_seqs=budget // max(1, m.kv_for(m.max_model_len)) if m.max_model_len else None,
    )


def shared_layout(models: Sequence[ModelNeed], n_gpus: int, rules: Rules) -> Layout:
    """Every model in this process on the first GPUs (or its explicit ones)."""
    if any(m.tp > n_gpus for m in models):
        return Layout(SHARED, None, "a tensor-parallel group is wider than the job's GPUs")
    forced = [m.key for m in models if m.placement == "managed_server"]
    if forced:
        return Layout(SHARED, None, f"{', '.join(forced)}: placement managed_server")
    gpus = {m.key: m.gpus or tuple(range(m.tp)) for m in models}
    given = budgets(models, gpus, rules)
    if given is None:
        return Layout(SHARED, None, "they do not fit together on the first GPUs")
    placed = tuple(_placed(m, "in_process", gpus[m.key], given[m.key], rules) for m in models)
    shared_gpus = len({g for v in gpus.values() for g in v}) < sum(len(v) for v in gpus.values())
    return Layout(SHARED, placed, "every model in this process" + (", sharing GPUs" if shared_gpus else ""))


def own_layout(models: Sequence[ModelNeed], n_gpus: int, rules: Rules) -> Layout:
    """Each model on GPUs of its own: explicit GPUs first, then a model that must run in this process
    on the first GPUs, then the others on the lowest GPUs left, the widest tensor-parallel group
    first. The model on the first GPUs runs in this process unless its placement says
    managed_server; the others get servers."""
    first = next((m for m in models if m.placement == "in_process" and m.gpus is None), None)
    taken = {g for m in models for g in m.gpus or ()}
    free = [g for g in range(n_gpus) if g not in taken]
    own: dict[str, tuple[int, ...]] = {m.key: m.gpus for m in models if m.gpus}
    for m in sorted((m for m in models if not m.gpus), key=lambda m: (m is not first, -m.tp)):
        own[m.key], free = tuple(free[: m.tp]), free[m.tp :]
    if any(len(own[m.key]) < m.tp for m in models):
        need = sum(m.tp for m in models)
        return Layout(OWN, None, f"they need {need} GPUs, the job has {n_gpus}")
    if len({g for v in own.values() for g in v}) < sum(len(v) for v in own.values()):
        return Layout(OWN, None, "explicit GPUs overlap")
    leading = {m.key for m in models if own[m.key] == tuple(range(m.tp)) and m.placement != "managed_server"}
    misplaced = [m.key for m in models if m.placement == "in_process" and m.key not in leading]
    if misplaced:
        return Layout(OWN, None, f"{', '.join(misplaced)}: placement in_process, but not on the first GPUs")
    given = [budgets([m], own, rules) for m in models]
    if any(b is None for b in given):
        return Layout(OWN, None, "a model does not fit its own GPUs")
    placed = tuple(
        _placed(m, "in_process" if m.key in leading else "managed_server", own[m.key], b[m.key], rules)
        for m, b in zip(models, given)
    )
    return Layout(OWN, placed, "each model on GPUs of its own")


def layouts(models: Sequence[ModelNeed], n_gpus: int, rules: Rules) -> Layout:
    """The chosen layout (own GPUs when it fits, else shared; one model in this process), with the
    other one in `others`. Neither may fit: see `refusal`."""
    for m in models:
        if m.gpus is not None and len(m.gpus) != m.tp:
            raise PersonalensError(f"model {m.key}: gpus {list(m.gpus)} must list tensor_parallel_size={m.tp} GPUs")
        if m.gpus is not None and any(not 0 <= g < n_gpus for g in m.gpus):
            raise PersonalensError(f"model {m.key}: gpus {list(m.gpus)} not among the {n_gpus} visible GPUs")
    own, shared = own_layout(models, n_gpus, rules), shared_layout(models, n_gpus, rules)
    if len(models) == 1 and shared.fits:
        chosen, other = shared, own  # one model: the same GPUs either way, in this process
    else:
        chosen, other = (own, shared) if own.fits or not shared.fits else (shared, own)
    return dataclasses.replace(chosen, needs=tuple(models), rules=rules, others=(other,))


def plan_placement(models: Sequence[ModelNeed], n_gpus: int, rules: Rules) -> list[Placement]:
    """The chosen layout's placements; raises PersonalensError, with the sizes, when none fits."""
    chosen = layouts(models, n_gpus, rules)
    if not chosen.fits:
        raise PersonalensError(refusal(models, n_gpus, rules))
    return list(chosen.placements)


def capped(models: Sequence[ModelNeed], cap: int, only: frozenset[str] | None = None) -> list[ModelNeed]:
    """The models with max_model_len at most `cap` (only those keyed in `only`, when given)."""
    return [
        dataclasses.replace(m, max_model_len=min(m.max_model_len or cap, cap)) if only is None or m.key in only else m
        for m in models
    ]


def largest_max_model_len(
    models: Sequence[ModelNeed], n_gpus: int, rules: Rules, only: frozenset[str] | None = None
) -> int | None:
    """The largest max_model_len (in MAX_MODEL_LEN_STEP tokens, every model's capped at it, or only
    those keyed in `only`) at which these models fit, when they do not at their own; None when they
    fit, or fit at no length."""
    longest = max((m.max_model_len or 0 for m in models if only is None or m.key in only), default=0)
    if layouts(models, n_gpus, rules).fits or longest < MAX_MODEL_LEN_STEP:
        return None

    def fits(steps: int) -> bool:
        return layouts(capped(models, steps * MAX_MODEL_LEN_STEP, only), n_gpus, rules).fits

    lo, hi = 0, longest // MAX_MODEL_LEN_STEP  # fits(lo) assumed, fits(hi) known false
    if not fits(1):
        return None
    lo = 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo * MAX_MODEL_LEN_STEP


def refusal(models: Sequence[ModelNeed], n_gpus: int, rules: Rules) -> str:
    sizes = "; ".join(
        f"{m.key} ({'/'.join(m.roles)}): weights {m.weights / GIB:.1f} GiB, tp {m.tp} -> "
        f"{m.fixed_per_gpu(rules) / GIB:.1f} GiB per GPU with overhead and activations "
        f"({m.activation / GIB:.1f} GiB for {m.batched_tokens} batched tokens), {m.describe_kv()}, "
        f"memory share {m.utilization:g} ({m.share(rules) / GIB:.1f} GiB)"
        for m in models
    )
    forced = [m.key for m in models if m.placement == "in_process"]
    ways = f"placement auto for {', '.join(forced)}, " if forced else ""
    fitting = largest_max_model_len(models, n_gpus, rules)
    shorter = (
        f"max_model_len {fitting:,} (the largest that fits)" if fitting else "a smaller max_model_len"
    ) + " or max_num_batched_tokens"
    return (
        f"these models do not fit on {n_gpus} GPU(s) of {rules.gpu_bytes / GIB:.1f} GiB: {sizes}. Ways out: {ways}"
        f"more GPUs, a larger tensor_parallel_size, {shorter}, a smaller user agent or judge model, or an external "
        "`engine: server` endpoint on another node (docs/cluster.md)"
    )
