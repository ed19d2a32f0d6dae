"""Where each distinct model of a command runs, decided before anything loads; a layout that cannot
fit is refused then, with the sizes and the ways out.

On GPUs (read by gpus.py, or described to `personalens plan`) the planner (placement.py) sizes every
model from its files. When everything fits on shared GPUs, every model runs in this process with an
explicit per-GPU KV cache and a memory share that covers what it holds: vLLM's own profiling would
count an engine loaded earlier as its own use. Otherwise each model gets a vLLM server on its own GPUs
(managed.py). Without GPUs (vLLM's CPU build) nothing is planned: in-process engines split their
configured memory share as they always did, and only a model whose config says
`placement: managed_server` gets a server (which is how servers are tested on CPUs).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from personalens.engines.config import ModelConfig
from personalens.engines.embedded import model_path
from personalens.engines.gpus import GpuSpec
from personalens.engines.placement import (
    DTYPE_BYTES,
    GIB,
    Architecture,
    ModelNeed,
    Placement,
    Rules,
    plan_placement,
    weights_bytes,
)
from personalens.errors import PersonalensError

MODES = ("in_process", "managed_server", "server")  # server: an endpoint personalens does not start


@dataclass(frozen=True)
class Decision:
    """One distinct model: where it runs and what its engine or server is started with."""

    config: ModelConfig  # as configured (roles with equal configs share it)
    roles: tuple[str, ...]
    mode: str
    run_config: ModelConfig  # the plan's KV cache and memory share applied
    device_ids: tuple[str, ...] = ()  # a managed server's CUDA_VISIBLE_DEVICES
    placement: Placement | None = None  # the planner's numbers; None where nothing was planned

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
        if self.placement is not None:
            p = self.placement
            out |= {
                "gpus": list(p.gpus),
                "weights_per_gpu": p.weights_per_gpu,
                "kv_per_token_per_gpu": p.kv_per_token_per_gpu,
                "seqs_that_fit": p.seqs_that_fit,
            }
        return out

    def line(self, rules: Rules | None) -> str:
        found = f" from {self.config.source()}" if self.config.snapshots else ""
        head = f"  {self.config.name} ({', '.join(self.roles)}){found}: "
        if self.mode == "server":
            return head + f"server at {self.config.server.base_url}"
        where = "in process" if self.mode == "in_process" else "managed vLLM server"
        kv = self.run_config.kv_cache_memory_bytes
        if self.placement is None or rules is None:
            return head + where + (f", KV cache {kv / GIB:.2f} GiB" if kv else "")
        p = self.placement
        gpus = ",".join(map(str, p.gpus))
        return head + (
            f"{where} on GPU {gpus}: weights {p.weights_per_gpu / GIB:.1f} GiB + KV {kv / GIB:.1f} GiB per GPU "
            f"({p.seqs_that_fit} sequences of {rules.seq_tokens} tokens), memory share "
            f"{self.run_config.gpu_memory_utilization:.3f}"
        )


@dataclass(frozen=True)
class Layout:
    decisions: tuple[Decision, ...]
    gpus: GpuSpec | None  # None: not planned (no GPU)
    rules: Rules | None

    def decision(self, config: ModelConfig) -> Decision:
        return next(d for d in self.decisions if d.config == config)

    def describe(self) -> str:
        if self.gpus is None:
            return (
                "placement not planned (no GPU: vLLM's CPU build, or no GPU visible): in-process engines share "
                "their configured memory, a server only where placement: managed_server"
            )
        r = self.rules
        return (
            f"placement on {self.gpus.describe()}: {r.utilization:.0%} usable, {r.overhead_bytes / GIB:.1f} GiB "
            f"overhead per engine and GPU, KV for at least {r.min_seqs} sequences of {r.seq_tokens} tokens"
        )

    def lines(self) -> list[str]:
        return [self.describe(), *(d.line(self.rules) for d in self.decisions)]

    def as_dict(self) -> dict:
        return {
            "planned": self.gpus is not None,
            "basis": self.describe(),
            "models": [d.as_dict() for d in self.decisions],
        }


def plan_layout(configs: Mapping[str, ModelConfig], gpus: GpuSpec | None) -> Layout:
    """The layout of the roles' models (role -> checked config) on `gpus`; raises PersonalensError,
    with the sizes and the ways out, when they cannot fit."""
    roles: dict[ModelConfig, list[str]] = {}
    for role, config in configs.items():
        roles.setdefault(config, []).append(role)
    local = [c for c in roles if c.engine == "vllm"]
    if gpus is None:
        decided = _unplanned(local, roles)
        rules = None
    else:
        rules = Rules(
            gpu_bytes=gpus.memory_bytes, utilization=min((c.gpu_memory_utilization for c in local), default=0.9)
        )
        decided = _planned(local, roles, gpus, rules)
    external = {c: Decision(c, tuple(roles[c]), "server", c) for c in roles if c.engine == "server"}
    return Layout(tuple((decided | external)[c] for c in roles), gpus, rules)


def _unplanned(local: Sequence[ModelConfig], roles: Mapping[ModelConfig, list[str]]) -> dict:
    """No GPU: in-process engines split their configured memory share equally (on a CPU vLLM takes that
    share of RAM unless kv_cache_memory_bytes is set); forced servers keep their configs."""
    in_process = [c for c in local if c.placement != "managed_server"]
    decided = {}
    for c in local:
        if c in in_process:
            decided[c] = Decision(c, tuple(roles[c]), "in_process", c.with_memory_share(1 / len(in_process)))
        else:
            decided[c] = Decision(c, tuple(roles[c]), "managed_server", c)
    return decided


def _planned(local: Sequence[ModelConfig], roles: Mapping[ModelConfig, list[str]], gpus: GpuSpec, rules: Rules) -> dict:
    keys = _keys(local)
    needs = [model_need(c, tuple(roles[c]), k) for c, k in zip(local, keys)]
    decided = {}
    for c, placed in zip(local, plan_placement(needs, gpus.count, rules)):
        run = dataclasses.replace(c, kv_cache_memory_bytes=placed.kv_cache_memory_bytes)
        if placed.mode == "in_process":
            # vLLM checks at start-up that this share of the GPU is free: each engine's own part, so
            # the second engine on a GPU finds it free beside the first
            held = placed.weights_per_gpu + rules.overhead_bytes + placed.kv_cache_memory_bytes
            run = dataclasses.replace(run, gpu_memory_utilization=held / gpus.memory_bytes)
            decided[c] = Decision(c, tuple(roles[c]), "in_process", run, placement=placed)
        else:
            decided[c] = Decision(
                c, tuple(roles[c]), "managed_server", run, gpus.device_ids(placed.gpus), placement=placed
            )
    return decided


def _keys(configs: Sequence[ModelConfig]) -> list[str]:
    """A distinct name per distinct config (two configs may name the same model, e.g. other seeds)."""
    keys = []
    for c in configs:
        n = sum(c.name == earlier.name for earlier in configs[: len(keys)])
        keys.append(c.name if n == 0 else f"{c.name}#{n + 1}")
    return keys


def model_need(config: ModelConfig, roles: tuple[str, ...], key: str) -> ModelNeed:
    """What the planner needs of one model, read from its local directory (config.json, weights)."""
    directory = Path(model_path(config))
    config_json = directory / "config.json"
    if not config_json.is_file():
        raise PersonalensError(
            f"model {config.name}: no {config_json}; placement sizes each model from its files: set "
            "path to a local Hugging Face directory, or to a hub id in the local Hugging Face cache"
        )
    raw = json.loads(config_json.read_text())
    arch = Architecture.from_config(raw, where=str(config_json))
    dtype_bytes = _dtype_bytes(config)
    leading = tuple(range(config.tensor_parallel_size))
    placement = config.placement
    if config.gpus is not None and config.gpus != leading:
        # an engine in this process uses the first tensor_parallel_size visible GPUs
        if placement == "in_process":
            raise PersonalensError(
                f"model {config.name}: gpus {list(config.gpus)} with placement in_process; an in-process engine "
                f"uses GPUs {list(leading)}: drop gpus, or use placement managed_server"
            )
        placement = "managed_server"
    return ModelNeed(
        key=key,
        roles=roles,
        arch=arch,
        weights=weights_bytes(directory, arch, dtype_bytes)[0],
        dtype_bytes=dtype_bytes,
        tp=config.tensor_parallel_size,
        placement=placement,
        gpus=config.gpus,
        kv_cache_bytes=config.kv_cache_memory_bytes,
        # vLLM's own default when max_model_len is unset: the model's context length
        max_model_len=config.max_model_len or raw.get("max_position_embeddings"),
    )


def _dtype_bytes(config: ModelConfig) -> int:
    if config.dtype == "auto":
        return 2  # on GPUs vLLM runs 16-bit checkpoints as they are and 32-bit ones in 16 bits
    if config.dtype not in DTYPE_BYTES:
        raise PersonalensError(f"model {config.name}: dtype {config.dtype!r} is not one of {sorted(DTYPE_BYTES)}")
    return DTYPE_BYTES[config.dtype]
