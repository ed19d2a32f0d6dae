"""Where each distinct model of a run goes, and how much KV cache it gets, decided before any loads.

Pure: the inputs are the models' architectures (architecture.py), their weights' size, their dtype,
tensor-parallel degree and batch limits, and the GPUs this job may use. Two layouts are tried:
- **own GPUs**: each model on GPUs no other model uses, the one on the first GPUs in this process,
  the others in vLLM servers of their own (an in-process engine always uses the first GPUs);
- **in process**: every model in this process on the first GPUs, each with an explicit per-GPU KV-cache
  budget (vLLM's profiling would count an earlier engine's memory as its own, so a fraction of
  memory is not safe), the GPUs' free memory split so that every model holds as many tokens.
When both fit, own GPUs wins (for one model they are the same): every model gets whole GPUs (more KV cache, no contention), and the
job's GPUs do not sit idle. A layout that fits neither way is refused with the sizes and the ways out.
The GPUs the chosen layout leaves free then hold copies of models (`replicas`), each a vLLM server of
its own with the KV cache the model would have alone on those GPUs.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from personalens.engines.architecture import DTYPE_BYTES, Architecture
from personalens.errors import PersonalensError

GIB = 1024**3
# vLLM's max_num_batched_tokens when none is set: its largest default for GPUs under 160 GB (the
# offline LLM class on an H100/H200; A100s and servers default lower), so a bound for all of them
DEFAULT_BATCHED_TOKENS = 16_384


def weights_bytes(model_dir: Path, arch: Architecture, dtype_bytes: int) -> tuple[int, str]:
    """The weights' size in memory when run in a `dtype_bytes` dtype, and where it came from: the
    safetensors index, else the files (both scaled from the checkpoint's own dtype: float32 on a
    bfloat16 checkpoint takes twice its files), else config.json's parameter count. Quantized
    checkpoints are taken at their size on disk."""
    index = model_dir / "model.safetensors.index.json"
    files = sorted(model_dir.glob("*.safetensors"))
    total = json.loads(index.read_text()).get("metadata", {}).get("total_size") if index.is_file() else None
    if total:
        size, source = int(total), f"{index.name} total_size"
    elif files:
        size, source = sum(f.stat().st_size for f in files), f"{len(files)} safetensors file(s)"
    else:
        return arch.parameters() * dtype_bytes, "estimated from config.json's parameter count"
    stored = DTYPE_BYTES.get(arch.checkpoint_dtype or "")
    if arch.quantized or stored is None or stored == dtype_bytes:
        return size, source
    return size * dtype_bytes // stored, f"{source}, {arch.checkpoint_dtype} on disk x {dtype_bytes}/{stored}"


def batched_tokens(configured: int | None, chunked_prefill: bool | None, max_model_len: int | None) -> int:
    """The tokens of vLLM's largest forward pass: max_num_batched_tokens as set, else its default,
    which covers a whole max_model_len prompt when chunked prefill is off."""
    if configured is not None:
        return configured
    if chunked_prefill is False and max_model_len:
        return max(DEFAULT_BATCHED_TOKENS, max_model_len)
    return DEFAULT_BATCHED_TOKENS


@dataclass(frozen=True)
class ModelNeed:
    """One distinct model of the run, with what it must be given."""

    key: str  # e.g. the model config's name
    roles: tuple[str, ...]
    arch: Architecture
    weights: int  # bytes, all GPUs together
    dtype_bytes: int
    tp: int = 1
    placement: str = "auto"  # auto | in_process | managed_server
    gpus: tuple[int, ...] | None = None  # explicit GPU indices (of the visible ones)
    kv_cache_bytes: int | None = None  # per GPU, set in the model config: given as it is, not sized
    # tokens of the longest sequence (vLLM's max_model_len): vLLM refuses to start unless its KV cache
    # holds one such sequence, so the budget is never below that; None: not known
    max_model_len: int | None = None
    batched_tokens: int = DEFAULT_BATCHED_TOKENS  # vLLM's max_num_batched_tokens (its profile run)
    max_num_seqs: int = 256
    replicas: int | None = None  # engines of this model in all; None: auto (copies on free GPUs, by `replicas`)

    @property
    def activation(self) -> int:
        """Per GPU: vLLM does not shrink a pinned KV cache to make room for activations."""
        seqs = min(self.max_num_seqs, self.batched_tokens)
        return self.arch.activation_bytes(self.batched_tokens, seqs, self.dtype_bytes, self.tp)

    @property
    def kv_per_token(self) -> int:
        return self.arch.kv_bytes_per_token(self.dtype_bytes, self.tp)

    def kv_for(self, tokens: int) -> int:
        return self.arch.kv_bytes_for(tokens, self.dtype_bytes, self.tp)


@dataclass(frozen=True)
class Rules:
    """The assumptions a plan rests on, printed with it."""

    gpu_bytes: int  # memory of one GPU
    utilization: float = 0.9  # share of a GPU vLLM may use
    # per GPU and engine besides activations: the CUDA context, CUDA graphs, communication buffers
    overhead_bytes: int = 2 * GIB


@dataclass(frozen=True)
class Placement:
    key: str
    roles: tuple[str, ...]
    mode: str  # in_process | managed_server
    gpus: tuple[int, ...]
    weights_per_gpu: int
    activation_per_gpu: int
    kv_per_token_per_gpu: int  # full-attention layers' bytes; windowed layers stop growing at their window
    kv_cache_memory_bytes: int  # per GPU, what vLLM is given
    max_len_seqs: int | None  # sequences of max_model_len the KV cache holds at once (vLLM needs one)

    def held_per_gpu(self, rules: Rules) -> int:
        return self.weights_per_gpu + rules.overhead_bytes + self.activation_per_gpu + self.kv_cache_memory_bytes

    def as_dict(self) -> dict:
        return dict(self.__dict__, roles=list(self.roles), gpus=list(self.gpus))


@dataclass(frozen=True)
class Candidate:
    """One way of placing the models, the planner's verdict on it and why."""

    name: str  # "own GPUs" | "in process"
    placements: tuple[Placement, ...] | None  # None: does not fit
    why: str


def visible_gpus(env: Mapping[str, str], device_count: int) -> tuple[str, ...]:
    """The GPUs this job may use: CUDA_VISIBLE_DEVICES, then SLURM's GPU lists, then all devices."""
    for name in ("CUDA_VISIBLE_DEVICES", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS"):
        value = env.get(name)
        if value is not None:
            return tuple(g.strip() for g in value.split(",") if g.strip())
    return tuple(str(i) for i in range(device_count))


def _floor(m: ModelNeed) -> int:
    """The least KV cache per GPU vLLM starts with: one sequence of max_model_len."""
    if m.kv_cache_bytes is not None:
        return m.kv_cache_bytes
    return m.kv_for(m.max_model_len) if m.max_model_len else 0


def _fixed_per_gpu(m: ModelNeed, rules: Rules) -> int:
    return math.ceil(m.weights / m.tp) + rules.overhead_bytes + m.activation + (m.kv_cache_bytes or 0)


def _split(models: Sequence[ModelNeed], free: int) -> dict[str, int] | None:
    """`free` bytes of one GPU split among its models so that each holds as many tokens (a share in
    proportion to its KV bytes per token), none below its floor; configured budgets are fixed."""
    sized = [m for m in models if m.kv_cache_bytes is None]
    given: dict[str, int] = {}
    while sized:
        per_token = sum(m.kv_per_token for m in sized)
        shares = {m.key: int(free * m.kv_per_token / per_token) for m in sized}
        short = [m for m in sized if shares[m.key] < _floor(m)]
        if not short:
            return given | shares
        for m in short:  # held at its floor; the rest is split again among the others
            given[m.key] = _floor(m)
            free -= _floor(m)
        sized = [m for m in sized if m not in short]
    return given if free >= 0 else None


def _budgets(models: Sequence[ModelNeed], gpus: Mapping[str, tuple[int, ...]], rules: Rules) -> dict[str, int] | None:
    """Per-GPU KV budgets when these models run on `gpus`, or None when one GPU is too small. A model
    spread over several GPUs gets the smallest of its shares (vLLM gives every rank the same)."""
    usable = int(rules.gpu_bytes * rules.utilization)
    budget: dict[str, int] = {}
    for g in {g for m in models for g in gpus[m.key]}:
        here = [m for m in models if g in gpus[m.key]]
        free = usable - sum(_fixed_per_gpu(m, rules) for m in here)
        shares = _split(here, free) if free >= 0 else None
        if shares is None or any(shares.get(m.key, 0) < _floor(m) for m in here if m.kv_cache_bytes is None):
            return None
        for m in here:
            budget[m.key] = min(budget.get(m.key, math.inf), shares.get(m.key, m.kv_cache_bytes or 0))
    return {m.key: m.kv_cache_bytes if m.kv_cache_bytes is not None else int(budget[m.key]) for m in models}


def _placed(m: ModelNeed, mode: str, gpus: tuple[int, ...], budget: int) -> Placement:
    return Placement(
        key=m.key,
        roles=m.roles,
        mode=mode,
        gpus=gpus,
        weights_per_gpu=math.ceil(m.weights / m.tp),
        activation_per_gpu=m.activation,
        kv_per_token_per_gpu=m.kv_per_token,
        kv_cache_memory_bytes=budget,
        max_len_seqs=budget // max(1, m.kv_for(m.max_model_len)) if m.max_model_len else None,
    )


def shared_layout(models: Sequence[ModelNeed], n_gpus: int, rules: Rules) -> Candidate:
    """Every model in this process on the first GPUs (or its explicit ones)."""
    name = "in process"
    if any(m.tp > n_gpus for m in models):
        return Candidate(name, None, "a tensor-parallel group is wider than the job's GPUs")
    forced = [m.key for m in models if m.placement == "managed_server"]
    if forced:
        return Candidate(name, None, f"{', '.join(forced)}: placement managed_server")
    gpus = {m.key: m.gpus or tuple(range(m.tp)) for m in models}
    budgets = _budgets(models, gpus, rules)
    if budgets is None:
        return Candidate(name, None, "they do not fit together on the first GPUs")
    placed = tuple(_placed(m, "in_process", gpus[m.key], budgets[m.key]) for m in models)
    shared_gpus = len({g for v in gpus.values() for g in v}) < sum(len(v) for v in gpus.values())
    return Candidate(name, placed, "every model in this process" + (", sharing GPUs" if shared_gpus else ""))


def own_layout(models: Sequence[ModelNeed], n_gpus: int, rules: Rules) -> Candidate:
    """Each model on GPUs of its own: explicit GPUs first, then a model that must run in this process
    on the first GPUs, then the others on the lowest GPUs left, the widest tensor-parallel group
    first. The model on the first GPUs runs in this process unless its placement says
    managed_server; the others get servers."""
    name = "own GPUs"
    first = next((m for m in models if m.placement == "in_process" and m.gpus is None), None)
    taken = {g for m in models for g in m.gpus or ()}
    free = [g for g in range(n_gpus) if g not in taken]
    own: dict[str, tuple[int, ...]] = {m.key: m.gpus for m in models if m.gpus}
    for m in sorted((m for m in models if not m.gpus), key=lambda m: (m is not first, -m.tp)):
        own[m.key], free = tuple(free[: m.tp]), free[m.tp :]
    if any(len(own[m.key]) < m.tp for m in models):
        need = sum(m.tp for m in models)
        return Candidate(name, None, f"they need {need} GPUs, the job has {n_gpus}")
    if len({g for v in own.values() for g in v}) < sum(len(v) for v in own.values()):
        return Candidate(name, None, "explicit GPUs overlap")
    leading = {m.key for m in models if own[m.key] == tuple(range(m.tp)) and m.placement != "managed_server"}
    misplaced = [m.key for m in models if m.placement == "in_process" and m.key not in leading]
    if misplaced:
        return Candidate(name, None, f"{', '.join(misplaced)}: placement in_process, but not on the first GPUs")
    budgets = [_budgets([m], own, rules) for m in models]
    if any(b is None for b in budgets):
        return Candidate(name, None, "a model does not fit its own GPUs")
    placed = tuple(
        _placed(m, "in_process" if m.key in leading else "managed_server", own[m.key], b[m.key])
        for m, b in zip(models, budgets)
    )
    return Candidate(name, placed, "each model on GPUs of its own")


def layouts(models: Sequence[ModelNeed], n_gpus: int, rules: Rules) -> list[Candidate]:
    """Both layouts, the chosen one first: own GPUs when it fits, else shared."""
    for m in models:
        if m.gpus is not None and len(m.gpus) != m.tp:
            raise PersonalensError(f"model {m.key}: gpus {list(m.gpus)} must list tensor_parallel_size={m.tp} GPUs")
        if m.gpus is not None and any(not 0 <= g < n_gpus for g in m.gpus):
            raise PersonalensError(f"model {m.key}: gpus {list(m.gpus)} not among the {n_gpus} visible GPUs")
    own, shared = own_layout(models, n_gpus, rules), shared_layout(models, n_gpus, rules)
    if len(models) == 1 and shared.placements:
        return [shared, own]  # one model: the same GPUs either way, in this process
    return [own, shared] if own.placements or not shared.placements else [shared, own]


def plan_placement(models: Sequence[ModelNeed], n_gpus: int, rules: Rules) -> list[Placement]:
    """The chosen layout's placements; raises PersonalensError, with the sizes, when none fits."""
    chosen = layouts(models, n_gpus, rules)[0]
    if chosen.placements is None:
        raise PersonalensError(refusal(models, n_gpus, rules))
    return list(chosen.placements)


def _kv_need(m: ModelNeed) -> str:
    if m.kv_cache_bytes is not None:
        return f"KV {m.kv_cache_bytes / GIB:.1f} GiB per GPU as configured"
    if m.max_model_len:
        return f"KV for one max_model_len of {m.max_model_len} tokens {_floor(m) / GIB:.1f} GiB per GPU"
    return "KV (any)"


def refusal(models: Sequence[ModelNeed], n_gpus: int, rules: Rules) -> str:
    usable = rules.gpu_bytes * rules.utilization / GIB
    sizes = "; ".join(
        f"{m.key} ({'/'.join(m.roles)}): weights {m.weights / GIB:.1f} GiB, tp {m.tp} -> "
        f"{_fixed_per_gpu(m, rules) / GIB:.1f} GiB per GPU with overhead and activations "
        f"({m.activation / GIB:.1f} GiB for {m.batched_tokens} batched tokens), {_kv_need(m)}"
        for m in models
    )
    forced = [m.key for m in models if m.placement == "in_process"]
    ways = f"placement auto for {', '.join(forced)}, " if forced else ""
    return (
        f"these models do not fit on {n_gpus} GPU(s) of {usable:.1f} GiB usable each "
        f"(gpu memory x {rules.utilization}): {sizes}. Ways out: {ways}more GPUs, a larger tensor_parallel_size, "
        "a smaller max_model_len or max_num_batched_tokens, a smaller user agent or judge model, or an external "
        "`engine: server` endpoint on another node (docs/cluster.md)"
    )


# the roles every turn of a dialogue waits on, in lockstep: their engines set the pace of `generate`
DIALOGUE_ROLES = ("user_agent", "assistant")


@dataclass(frozen=True)
class Replicas:
    """Copies of models on the GPUs a layout leaves free: per model key its copies' placements (each
    a managed server on GPUs of its own), and why they were given."""

    copies: tuple[tuple[str, tuple[Placement, ...]], ...] = ()
    why: str = ""

    def of(self, key: str) -> tuple[Placement, ...]:
        return dict(self.copies).get(key, ())


def _alone(m: ModelNeed, rules: Rules) -> Placement:
    """The model alone on tensor_parallel_size GPUs of its own (GPUs 0.. here): it fits, as the
    layout placed it with as much room or less."""
    return shared_layout([dataclasses.replace(m, gpus=None, placement="auto")], m.tp, rules).placements[0]


def _copies(m: ModelNeed, alone: Placement, gpus: Sequence[int]) -> tuple[Placement, ...]:
    """Copies of `m` on `gpus`, tensor_parallel_size GPUs each, with the placement it has alone."""
    return tuple(
        dataclasses.replace(alone, mode="managed_server", gpus=tuple(gpus[i : i + m.tp]))
        for i in range(0, len(gpus) - m.tp + 1, m.tp)
    )


def auto_pick(candidates: Sequence[ModelNeed]) -> ModelNeed:
    """Which model of those set to `replicas: auto` (each fitting the free GPUs at least once) gets
    the free GPUs: the one that serves the most roles of the dialogue loop (under lockstep every turn
    waits for its role's engine, so a copy of a dialogue model shortens every step), then the most
    roles in all, then the fewest GPUs per copy (more copies of it fit), then the first configured."""
    return min(candidates, key=lambda m: (-sum(r in DIALOGUE_ROLES for r in m.roles), -len(m.roles), m.tp))


def replicas(models: Sequence[ModelNeed], chosen: Sequence[Placement], n_gpus: int, rules: Rules) -> Replicas:
    """Copies on the GPUs the `chosen` placements leave free: first the models that ask for N engines
    (`replicas: N`, N - 1 copies each, in their order; refused when the free GPUs cannot hold them),
    then all the GPUs still free to one model set to `replicas: auto`, by `auto_pick`."""
    used = {g for p in chosen for g in p.gpus}
    free = [g for g in range(n_gpus) if g not in used]
    given: list[tuple[str, tuple[Placement, ...]]] = []
    whys = []
    for m in models:
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
        given.append((m.key, _copies(m, _alone(m, rules), free[: more * m.tp])))
        free = free[more * m.tp :]
        whys.append(f"replicas {m.replicas} for {m.key}")
    fitting = [m for m in models if m.replicas is None and m.tp <= len(free)]
    if fitting:
        m = auto_pick(fitting)
        given.append((m.key, _copies(m, _alone(m, rules), free)))
        whys.append(
            f"replicas auto gives the free GPUs to {m.key}"
            + (
                " (of the models set to auto, the one serving the most dialogue roles, then the most roles, then "
                "the fewest GPUs per copy)"
                if len(fitting) > 1
                else ""
            )
        )
    return Replicas(tuple(given), "; ".join(whys))
