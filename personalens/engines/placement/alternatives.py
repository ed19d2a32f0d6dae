"""The layouts a job could take that put the node's GPUs where its work is: its bottleneck model (the
one whose engines read the most weights per dialogue) over more GPUs, as several engines, and with
the other models beside it by memory share. Each is a set of model options (`tensor_parallel_size`,
`replicas`, `placement`) for which layout.py's `plan_layout`, the decision `generate` takes, makes
that layout; `personalens plan` models them (plan/layouts.py) and says which is fastest and the
overrides that run it. Pure but for `plan_layout`'s reading of model directories.

For the bottleneck model, each tensor-parallel width its attention heads divide (`_splits`), up to
the job's GPUs, is tried these ways:
- **own GPUs**: as many engines of that width as the GPUs leave beside the other models' own
  (`replicas: N`), the other models on GPUs of their own and their copies on whatever is left;
- **beside its first engine**: engines of that width on every GPU, the other models in this process
  beside its first engine, sharing those GPUs' memory (`placement: in_process` for every model);
- **beside every engine**: the same engines, with a copy of each other model beside each of them
  (`placement: in_process` and `replicas: N` for every model: copies.py's groups), so that each
  engine's dialogues have the other models on their own GPUs.
With one model the ways are the same, tried once; with one engine, the last two. Several engines
split the dialogues between them, each dialogue's requests kept on the engine where it started
(engines/replicated.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from personalens.engines.models.config import REPLICAS_AUTO, ModelConfig
from personalens.engines.placement.copies import engine_time
from personalens.engines.placement.gpus import GpuSpec
from personalens.engines.placement.layout import plan_layout
from personalens.engines.placement.placed import Layout
from personalens.engines.placement.sizing import model_need
from personalens.errors import PersonalensError


@dataclass(frozen=True)
class Alternative:
    """One way of placing the bottleneck model: its engines' width and number, and where the others go."""

    model: str  # the bottleneck model's name
    tp: int  # GPUs per engine
    engines: int
    beside: bool  # the other models share its first engine's GPUs
    overrides: tuple[str, ...]  # the command-line overrides under which plan_layout makes `layout`
    layout: Layout | None  # None: it does not fit
    why: str = ""  # why it does not fit
    alone: bool = False  # the job's only local model
    paired: bool = False  # beside, with a copy of each other model beside every engine of it

    @property
    def name(self) -> str:
        many = f"{self.engines} engines" if self.engines > 1 else "one engine"
        where = (
            ""
            if self.alone
            else ", a copy of the others beside each by memory share"
            if self.paired
            else f", the others beside {'its first' if self.engines > 1 else 'it'} by memory share"
            if self.beside
            else ", the others on own GPUs"
        )
        return f"{self.model}: {many} of {self.tp} GPU(s){where}"


def places(layout: Layout) -> tuple:
    """Where a layout's engines run and the KV cache each gets: two layouts alike in this start the same
    engines, whatever options led to them."""
    return tuple(
        (c.config.name, c.mode, c.gpus, c.kv_cache_memory_bytes)
        for p in layout.placements or ()
        for c in (p, *p.copies)
    )


def bottleneck(configs: Mapping[str, ModelConfig], work: Mapping[str, float] | None = None) -> ModelConfig | None:
    """The local model whose engines read the most weights per dialogue (`engine_time` over all its
    GPUs: its roles' generated tokens times its weights); None without a local model."""
    roles: dict[ModelConfig, list[str]] = {}
    for role, config in configs.items():
        if config.engine == "vllm":
            roles.setdefault(config, []).append(role)
    if not roles:
        return None
    needs = {c: model_need(c, tuple(r), c.name) for c, r in roles.items()}
    return max(needs, key=lambda c: engine_time(needs[c], work or {}) * needs[c].tp)


def alternatives(
    configs: Mapping[str, ModelConfig],
    gpus: GpuSpec,
    in_process: frozenset[str] = frozenset(),
    work: Mapping[str, float] | None = None,
) -> list[Alternative]:
    """The layouts of the module's docstring for the roles' models (role -> checked config) on `gpus`,
    widest engines last; [] where no local model can be moved (none, or the bottleneck's GPUs are
    pinned by `gpus:`)."""
    chosen = bottleneck(configs, work)
    if chosen is None or chosen.gpus is not None:
        return []
    arch = model_need(chosen, (), chosen.name).arch
    others = {c for c in configs.values() if c.engine == "vllm" and c != chosen}
    own_gpus = sum(c.tensor_parallel_size for c in others)
    out = []
    for tp in (t for t in range(1, gpus.count + 1) if _splits(arch.heads, arch.kv_heads, t)):
        ways = [(False, False, (gpus.count - own_gpus) // tp)]
        if others:
            ways.append((True, False, gpus.count // tp))
            if gpus.count // tp > 1:
                ways.append((True, True, gpus.count // tp))
        for beside, paired, engines in ways:
            if engines >= 1:
                out.append(_tried(configs, chosen, tp, engines, beside, paired, gpus, in_process, work))
    return out


def _other(config: ModelConfig, beside: bool, paired: bool, engines: int) -> dict:
    """The options a way sets on another local model, where its config has them otherwise (so that a
    way is the same layout whatever the config began with, a plan's earlier choice among them):
    beside, in this process, as many engines as the bottleneck's (`paired`) or one (replicas auto: no
    GPU is left free); on own GPUs, placement and replicas auto (GPUs of its own, copies on those
    left free)."""
    wanted = {
        "placement": "in_process" if beside else "auto",
        "replicas": engines if paired else REPLICAS_AUTO,
    }
    return {k: v for k, v in wanted.items() if getattr(config, k) != v}


def _splits(heads: int, kv_heads: int, tp: int) -> bool:
    """Whether vLLM shards the attention over `tp` GPUs: the heads divide evenly, and the KV heads
    either divide evenly or are each copied to a whole number of GPUs."""
    return heads % tp == 0 and (kv_heads % tp == 0 or tp % kv_heads == 0)


def _tried(
    configs: Mapping[str, ModelConfig],
    chosen: ModelConfig,
    tp: int,
    engines: int,
    beside: bool,
    paired: bool,
    gpus: GpuSpec,
    in_process: frozenset[str],
    work: Mapping[str, float] | None,
) -> Alternative:
    changes = {"tensor_parallel_size": tp, "replicas": engines} | ({"placement": "in_process"} if beside else {})
    moved = {}
    overrides = []
    for role, config in configs.items():
        if config == chosen:
            moved[role] = dataclasses.replace(config, **changes)
            overrides += [f"{role}.{k}={v}" for k, v in changes.items()]
        elif config.engine == "vllm":
            wanted = _other(config, beside, paired, engines)
            moved[role] = dataclasses.replace(config, **wanted)
            overrides += [f"{role}.{k}={v}" for k, v in wanted.items()]
        else:
            moved[role] = config
    alone = not any(c.engine == "vllm" and c != chosen for c in configs.values())
    try:
        layout = plan_layout(moved, gpus, in_process, work)
    except PersonalensError as err:
        return Alternative(chosen.name, tp, engines, beside, tuple(overrides), None, str(err), alone, paired)
    return Alternative(chosen.name, tp, engines, beside, tuple(overrides), layout, alone=alone, paired=paired)
