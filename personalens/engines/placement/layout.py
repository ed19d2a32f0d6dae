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
per dialogue (generated tokens times weights read per GPU); where every model runs in this process
and each asks for the same N engines, the copies are N - 1 more groups of GPUs, each holding a copy
of every model as the first group holds them (copies.py). Without GPUs (vLLM's CPU build) nothing
is planned: in-process engines split their configured memory share, and only a model whose config
says `placement: managed_server` gets a server, or with `replicas: N` N servers (which is how servers
are tested on CPUs).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from personalens.engines.models.config import MAX_MODEL_LEN_AUTO, ModelConfig
from personalens.engines.placement.copies import with_copies
from personalens.engines.placement.fitting import capped, largest_max_model_len, layouts, refusal
from personalens.engines.placement.gpus import GpuSpec
from personalens.engines.placement.placed import Layout, Placement
from personalens.engines.placement.sizing import ModelNeed, Rules, model_need
from personalens.errors import PersonalensError


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
