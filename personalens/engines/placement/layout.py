"""Where each distinct model of a command runs, decided before anything loads: one `Layout` of
`Placement`s, read by the engine factory (engines/factory.py: which engines and servers start, with
what) and by `personalens plan` (what it prints and models). A layout that cannot fit is refused
then, with the sizes and the ways out.

On GPUs (read by gpus.py, or described to `personalens plan`) every model is sized from its files
(sizing.py, architecture.py) and two layouts are tried:
- **own GPUs**: each model on GPUs no other model uses, the one on the first GPUs in this process,
  the others in vLLM servers of their own (managed.py; an in-process engine always uses the first
  GPUs);
- **in process**: every model in this process on the first GPUs, each with an explicit per-GPU KV
  cache (sizing.py splits the GPUs' memory).
When both fit, own GPUs wins (for one model they are the same): every model gets whole GPUs (more KV
cache, no contention), and the job's GPUs do not sit idle. The GPUs the chosen layout leaves free
then hold copies of models (`replicas`), each a managed vLLM server with the KV cache the model has
alone on its GPUs, shared out by work: the next copy goes to the model whose engines take the longest
per dialogue (generated tokens times weights read per GPU). Without GPUs (vLLM's CPU build) nothing
is planned: in-process engines split their configured memory share, and only a model whose config
says `placement: managed_server` gets a server, or with `replicas: N` N servers (which is how servers
are tested on CPUs).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from personalens.engines.models.config import MAX_MODEL_LEN_AUTO, ModelConfig
from personalens.engines.placement.gpus import GIB, GpuSpec
from personalens.engines.placement.sizing import ModelNeed, Rules, budgets, model_need
from personalens.errors import PersonalensError

MODES = ("in_process", "managed_server", "server")  # server: an endpoint personalens does not start
OWN, SHARED = "own GPUs", "in process"
# max_model_len is searched in steps of this many tokens (vLLM's KV blocks are 16)
MAX_MODEL_LEN_STEP = 256


@dataclass(frozen=True)
class Placement:
    """One engine of one model: where it runs, what it holds per GPU, and what it is started with."""

    config: ModelConfig  # as configured (roles with equal configs share it)
    roles: tuple[str, ...]
    mode: str  # one of MODES
    run_config: ModelConfig  # the layout's KV cache and memory share applied
    key: str = ""  # the planner's name for the model (its config's name, made distinct)
    gpus: tuple[int, ...] = ()  # indices of the job's visible GPUs; () where nothing was planned
    device_ids: tuple[str, ...] = ()  # a managed server's CUDA_VISIBLE_DEVICES
    weights_per_gpu: int = 0
    activation_per_gpu: int = 0
    kv_per_token_per_gpu: int = 0  # full-attention layers' bytes; windowed layers stop growing at their window
    kv_cache_memory_bytes: int = 0  # per GPU, what vLLM is given
    max_len_seqs: int | None = None  # sequences of max_model_len the KV cache holds at once (vLLM needs one)
    copy: int = 0  # 0: the model's own engine; k: its k-th copy (replicas), a managed server
    copies: tuple[Placement, ...] = ()  # the model's copies, each a managed server of its own

    @property
    def planned(self) -> bool:
        return bool(self.gpus)

    @property
    def kv_tokens(self) -> int:
        """Tokens of every layer its KV cache holds."""
        return self.kv_cache_memory_bytes // self.kv_per_token_per_gpu if self.kv_per_token_per_gpu else 0

    def held_per_gpu(self, rules: Rules) -> int:
        return self.weights_per_gpu + rules.overhead_bytes + self.activation_per_gpu + self.kv_cache_memory_bytes

    @property
    def label(self) -> str:
        """The model, and which copy, in messages (a server's start and exit)."""
        return f"{self.config.name} (copy {self.copy})" if self.copy else self.config.name

    def as_dict(self) -> dict:
        out = {
            "model": self.config.name,
            "roles": list(self.roles),
            "mode": self.mode,
            "kv_cache_memory_bytes": self.run_config.kv_cache_memory_bytes,
            "gpu_memory_utilization": self.run_config.gpu_memory_utilization,
        }
        if self.device_ids:
            out["cuda_visible_devices"] = ",".join(self.device_ids)
        if self.planned:
            out |= {
                "gpus": list(self.gpus),
                "weights_per_gpu": self.weights_per_gpu,
                "activation_per_gpu": self.activation_per_gpu,
                "kv_per_token_per_gpu": self.kv_per_token_per_gpu,
                "max_len_seqs": self.max_len_seqs,
            }
        if self.copy:
            out["copy"] = self.copy
        if self.copies:
            out["copies"] = [c.as_dict() for c in self.copies]
        return out

    def line(self) -> str:
        found = f" from {self.config.source()}" if self.config.snapshots else ""
        head = f"  {self.config.name} ({', '.join(self.roles)}){found}: "
        if self.mode == "server":
            return head + f"server at {self.config.server.base_url}"
        return head + self._where() + self._copies()

    def _where(self) -> str:
        where = "in process" if self.mode == "in_process" else "managed vLLM server"
        kv = self.run_config.kv_cache_memory_bytes
        if not self.planned:
            return where + (f", KV cache {kv / GIB:.2f} GiB" if kv else "")
        held = (
            f"{self.max_len_seqs} sequence(s) of max_model_len {self.run_config.max_model_len or 'unset'}"
            if self.max_len_seqs is not None
            else f"{self.kv_tokens:,} tokens"
        )
        return (
            f"{where} on GPU {','.join(map(str, self.gpus))}: weights {self.weights_per_gpu / GIB:.1f} GiB + "
            f"activations {self.activation_per_gpu / GIB:.1f} GiB + KV {kv / GIB:.1f} GiB per GPU ({held}), memory "
            f"share {self.run_config.gpu_memory_utilization:.3f}"
        )

    def _copies(self) -> str:
        """` + 3 copies in managed vLLM servers on GPU 5,6,7` (each copy's GPUs, `and` between copies
        of several GPUs)."""
        n = len(self.copies)
        if not n:
            return ""
        what = (
            f" + {n} cop{'y' if n == 1 else 'ies'} in {'a managed vLLM server' if n == 1 else 'managed vLLM servers'}"
        )
        placed = [c for c in self.copies if c.planned]
        if not placed:
            return what
        groups = [",".join(map(str, p.gpus)) for p in placed]
        return what + " on GPU " + ("," if len(placed[0].gpus) == 1 else " and ").join(groups)


@dataclass(frozen=True)
class Layout:
    """One way of placing a command's models: the chosen one, with the others tried beside it."""

    name: str  # OWN | SHARED | "not planned"
    placements: tuple[Placement, ...] | None  # per distinct model, in the roles' order; None: does not fit
    why: str  # why it fits, or why not
    gpus: GpuSpec | None = None  # None: not planned (no GPU)
    rules: Rules | None = None
    needs: tuple[ModelNeed, ...] = ()  # what the planner sized, per in-process or managed model
    others: tuple[Layout, ...] = ()  # the layouts tried and not chosen
    copies_why: str = ""  # how the free GPUs were given to copies

    @property
    def fits(self) -> bool:
        return self.placements is not None

    def placement(self, config: ModelConfig) -> Placement:
        return next(p for p in self.placements or () if p.config == config)

    def without_copies(self) -> Layout:
        return dataclasses.replace(
            self, placements=tuple(dataclasses.replace(p, copies=()) for p in self.placements or ()), copies_why=""
        )

    def reason(self) -> str:
        """Which layout was chosen, and why."""
        if self.gpus is not None and not self.needs:
            return "no model runs on this job's GPUs"
        if not self.others:
            return ""
        other = self.others[0]
        if not other.fits:
            return f"{self.why} ({other.name}: {other.why})"
        if self.name == OWN:
            return f"{self.why}: chosen, as it fits (each model gets whole GPUs; {other.why} fits too)"
        return f"{self.why} (one model: the same GPUs either way)"

    def describe(self) -> str:
        if self.gpus is None:
            return (
                "placement not planned (no GPU: vLLM's CPU build, or no GPU visible): in-process engines share "
                "their configured memory, a server only where placement: managed_server"
            )
        return (
            f"placement on {self.gpus.describe()}: each model within its own memory share, "
            f"{self.rules.overhead_bytes / GIB:.1f} GiB overhead per engine and GPU besides activations"
        )

    def lines(self) -> list[str]:
        why = self.reason()
        copies = [f"  copies: {self.copies_why}"] if self.copies_why else []
        return [self.describe() + (f"; {why}" if why else ""), *(p.line() for p in self.placements or ()), *copies]

    def as_dict(self) -> dict:
        return {
            "planned": self.gpus is not None,
            "basis": self.describe(),
            "why": self.reason(),
            "models": [p.as_dict() for p in self.placements or ()],
            **({"copies_why": self.copies_why} if self.copies_why else {}),
        }


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


def plan_layout(
    configs: Mapping[str, ModelConfig],
    gpus: GpuSpec | None,
    in_process: frozenset[str] = frozenset(),
    work: Mapping[str, float] | None = None,
) -> Layout:
    """The layout of the roles' models (role -> checked config) on `gpus`; raises PersonalensError,
    with the sizes and the ways out, when they cannot fit. The models of the roles in `in_process`
    must run in this process (scheduling=continuous). `work` is per role the tokens it generates per
    dialogue, by which free GPUs are shared out (None: alike)."""
    roles: dict[ModelConfig, list[str]] = {}
    for role, config in configs.items():
        roles.setdefault(config, []).append(role)
    elsewhere = [f"{role}: {_served(c)}" for role, c in configs.items() if role in in_process and _served(c)]
    if elsewhere:
        raise PersonalensError(
            f"scheduling=continuous runs the {' and '.join(sorted(in_process))} in this process (in-process vLLM), "
            f"but {'; '.join(elsewhere)}: use scheduling=lockstep, or run them in this process"
        )
    local = [c for c in roles if c.engine == "vllm"]
    external = {c: Placement(c, tuple(roles[c]), "server", c) for c in roles if c.engine == "server"}
    if gpus is None:
        unplanned = _unplanned(local, roles) | external
        return Layout("not planned", tuple(unplanned[c] for c in roles), "no GPU")
    needs = _needs(local, roles, in_process)
    rules = Rules(gpu_bytes=gpus.memory_bytes)
    auto = frozenset(n.key for n in needs if n.config.max_model_len == MAX_MODEL_LEN_AUTO)
    fitting = largest_max_model_len(needs, gpus.count, rules, auto) if auto else None
    if fitting is not None:  # max_model_len: auto takes the largest that fits
        needs = capped(needs, fitting, auto)
    chosen = layouts(needs, gpus.count, rules) if needs else Layout("none", (), "", rules=rules)
    if not chosen.fits:
        held = (
            f"scheduling=continuous keeps the {' and '.join(sorted(in_process))} in this process: "
            if in_process
            else ""
        )
        raise PersonalensError(held + refusal(needs, gpus.count, rules))
    chosen = dataclasses.replace(with_copies(chosen, gpus.count, work), gpus=gpus)
    by_config = {p.config: _devices(p, gpus) for p in chosen.placements}
    return dataclasses.replace(chosen, placements=tuple((by_config | external)[c] for c in roles))


def fitting_max_model_len(
    configs: Mapping[str, ModelConfig], gpus: GpuSpec, in_process: frozenset[str] = frozenset()
) -> int | None:
    """The largest max_model_len at which the roles' models fit on `gpus`, when they do not at their
    own (None: they fit, or fit at no length)."""
    roles: dict[ModelConfig, list[str]] = {}
    for role, config in configs.items():
        roles.setdefault(config, []).append(role)
    needs = _needs([c for c in roles if c.engine == "vllm"], roles, in_process)
    return largest_max_model_len(needs, gpus.count, Rules(gpu_bytes=gpus.memory_bytes)) if needs else None


def _needs(
    local: Sequence[ModelConfig], roles: Mapping[ModelConfig, list[str]], in_process: frozenset[str]
) -> list[ModelNeed]:
    needs = []
    for c, key in zip(local, _keys(local)):
        need = model_need(c, tuple(roles[c]), key)
        if in_process & set(roles[c]):
            # its requests go in while the engine steps: one engine, in this process
            need = dataclasses.replace(need, placement="in_process", replicas=1)
        needs.append(need)
    return needs


def _devices(p: Placement, gpus: GpuSpec) -> Placement:
    """A managed server's and its copies' CUDA_VISIBLE_DEVICES."""
    ids = gpus.device_ids(p.gpus) if p.mode == "managed_server" else ()
    return dataclasses.replace(p, device_ids=ids, copies=tuple(_devices(c, gpus) for c in p.copies))


def _served(c: ModelConfig) -> str:
    """Why a model cannot run in this process, from its config alone ("" when it can)."""
    if c.engine == "server":
        return f"engine server at {c.server.base_url}"
    if c.placement == "managed_server":
        return "placement managed_server"
    if c.gpus is not None and c.gpus != tuple(range(c.tensor_parallel_size)):
        return f"gpus {list(c.gpus)} (an in-process engine uses the first GPUs)"
    if (c.explicit_replicas or 1) > 1:
        return f"replicas {c.replicas} (its copies are servers)"
    return ""


def _unplanned(local: Sequence[ModelConfig], roles: Mapping[ModelConfig, list[str]]) -> dict:
    """No GPU: in-process engines split their configured memory share equally (on a CPU vLLM takes that
    share of RAM unless kv_cache_memory_bytes is set); forced servers keep their configs, and
    `replicas: N` makes N of them (auto means 1: there are no free GPUs to fill)."""
    many = [c for c in local if (c.explicit_replicas or 1) > 1 and c.placement != "managed_server"]
    if many:
        raise PersonalensError(
            "; ".join(f"{c.name} ({', '.join(roles[c])}): replicas {c.replicas}" for c in many)
            + ": without GPUs (vLLM's CPU build, or none visible) several engines of a model are managed vLLM "
            "servers: set placement: managed_server, or replicas: 1"
        )
    in_process = [c for c in local if c.placement != "managed_server"]
    decided = {}
    for c in local:
        # max_model_len: auto is vLLM's own default here, the model's context
        run = dataclasses.replace(c, max_model_len=None) if c.max_model_len == MAX_MODEL_LEN_AUTO else c
        if c in in_process:
            decided[c] = Placement(c, tuple(roles[c]), "in_process", run.with_memory_share(1 / len(in_process)))
        else:
            copies = tuple(
                Placement(c, tuple(roles[c]), "managed_server", run, copy=k) for k in range(1, c.explicit_replicas or 1)
            )
            decided[c] = Placement(c, tuple(roles[c]), "managed_server", run, copies=copies)
    return decided


def _keys(configs: Sequence[ModelConfig]) -> list[str]:
    """A distinct name per distinct config (two configs may name the same model, e.g. other seeds)."""
    keys = []
    for c in configs:
        n = sum(c.name == earlier.name for earlier in configs[: len(keys)])
        keys.append(c.name if n == 0 else f"{c.name}#{n + 1}")
    return keys
