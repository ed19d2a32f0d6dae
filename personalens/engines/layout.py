"""Where each distinct model of a command runs, decided before anything loads; a layout that cannot
fit is refused then, with the sizes and the ways out.

On GPUs (read by gpus.py, or described to `personalens plan`) the planner (placement.py) sizes every
model from its files (architecture.py). When each model fits on GPUs of its own, the one on the
first GPUs runs in this process and the others in vLLM servers on theirs (managed.py); otherwise every
model runs in this process on the first GPUs, each with an explicit per-GPU KV cache and a memory
share that covers what it holds (vLLM's own profiling would count an engine loaded earlier as its own
use). Every engine gets an explicit KV cache either way. The GPUs the chosen layout leaves free hold
copies of a model (`replicas`, placement.py), each in a managed server; the model's engines then
share its requests (replicated.py). Without GPUs (vLLM's CPU build) nothing is planned: in-process
engines split their configured memory share as they always did, and only a model whose config says
`placement: managed_server` gets a server, or with `replicas: N` N servers (which is how servers are
tested on CPUs).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from personalens.engines.architecture import Architecture, dtype_bytes
from personalens.engines.gpus import GpuSpec
from personalens.engines.models.config import ModelConfig
from personalens.engines.models.embedded import model_path
from personalens.engines.placement import (
    GIB,
    Candidate,
    ModelNeed,
    Placement,
    Replicas,
    Rules,
    batched_tokens,
    layouts,
    refusal,
    replicas,
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
    copy: int = 0  # 0: the model's own engine; k: its k-th copy (replicas), a managed server
    copies: tuple[Decision, ...] = ()  # the model's copies, each a managed server of its own

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
        if self.placement is not None:
            p = self.placement
            out |= {
                "gpus": list(p.gpus),
                "weights_per_gpu": p.weights_per_gpu,
                "activation_per_gpu": p.activation_per_gpu,
                "kv_per_token_per_gpu": p.kv_per_token_per_gpu,
                "max_len_seqs": p.max_len_seqs,
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
        if self.placement is None:
            return where + (f", KV cache {kv / GIB:.2f} GiB" if kv else "")
        p = self.placement
        held = (
            f"{p.max_len_seqs} sequence(s) of max_model_len {self.run_config.max_model_len or 'unset'}"
            if p.max_len_seqs is not None
            else f"{kv // p.kv_per_token_per_gpu:,} tokens"
        )
        return (
            f"{where} on GPU {','.join(map(str, p.gpus))}: weights {p.weights_per_gpu / GIB:.1f} GiB + activations "
            f"{p.activation_per_gpu / GIB:.1f} GiB + KV {kv / GIB:.1f} GiB per GPU ({held}), memory share "
            f"{self.run_config.gpu_memory_utilization:.3f}"
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
        placed = [c.placement for c in self.copies if c.placement is not None]
        if not placed:
            return what
        groups = [",".join(map(str, p.gpus)) for p in placed]
        return what + " on GPU " + ("," if len(placed[0].gpus) == 1 else " and ").join(groups)


@dataclass(frozen=True)
class Layout:
    decisions: tuple[Decision, ...]
    gpus: GpuSpec | None  # None: not planned (no GPU)
    rules: Rules | None
    needs: tuple[ModelNeed, ...] = ()  # what the planner sized, per in-process or managed model
    candidates: tuple[Candidate, ...] = ()  # the layouts tried, the chosen one first
    replicas: Replicas = Replicas()  # copies on the GPUs the chosen layout leaves free, and why

    def decision(self, config: ModelConfig) -> Decision:
        return next(d for d in self.decisions if d.config == config)

    def why(self) -> str:
        """Which layout was chosen, and why."""
        if self.gpus is not None and not self.needs:
            return "no model runs on this job's GPUs"
        if len(self.candidates) < 2:
            return ""
        chosen, other = self.candidates
        if other.placements is None:
            return f"{chosen.why} ({other.name}: {other.why})"
        if chosen.name == "own GPUs":
            return f"{chosen.why}: chosen, as it fits (each model gets whole GPUs; {other.why} fits too)"
        return f"{chosen.why} (one model: the same GPUs either way)"

    def describe(self) -> str:
        if self.gpus is None:
            return (
                "placement not planned (no GPU: vLLM's CPU build, or no GPU visible): in-process engines share "
                "their configured memory, a server only where placement: managed_server"
            )
        r = self.rules
        return (
            f"placement on {self.gpus.describe()}: {r.utilization:.0%} usable, {r.overhead_bytes / GIB:.1f} GiB "
            "overhead per engine and GPU besides activations"
        )

    def lines(self) -> list[str]:
        why = self.why()
        copies = [f"  copies: {self.replicas.why}"] if self.replicas.why else []
        return [self.describe() + (f"; {why}" if why else ""), *(d.line() for d in self.decisions), *copies]

    def as_dict(self) -> dict:
        return {
            "planned": self.gpus is not None,
            "basis": self.describe(),
            "why": self.why(),
            "models": [d.as_dict() for d in self.decisions],
            **({"copies_why": self.replicas.why} if self.replicas.why else {}),
        }


def plan_layout(
    configs: Mapping[str, ModelConfig], gpus: GpuSpec | None, in_process: frozenset[str] = frozenset()
) -> Layout:
    """The layout of the roles' models (role -> checked config) on `gpus`; raises PersonalensError,
    with the sizes and the ways out, when they cannot fit. The models of the roles in `in_process`
    must run in this process (scheduling=continuous)."""
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
    external = {c: Decision(c, tuple(roles[c]), "server", c) for c in roles if c.engine == "server"}
    if gpus is None:
        return Layout(tuple((_unplanned(local, roles) | external)[c] for c in roles), None, None)
    rules = Rules(gpu_bytes=gpus.memory_bytes, utilization=min((c.gpu_memory_utilization for c in local), default=0.9))
    needs = []
    for c, key in zip(local, _keys(local)):
        need = model_need(c, tuple(roles[c]), key)
        if in_process & set(roles[c]):
            # its requests go in while the engine steps: one engine, in this process
            need = dataclasses.replace(need, placement="in_process", replicas=1)
        needs.append(need)
    candidates = layouts(needs, gpus.count, rules) if needs else [Candidate("none", (), "")]
    if candidates[0].placements is None:
        held = (
            f"scheduling=continuous keeps the {' and '.join(sorted(in_process))} in this process: "
            if in_process
            else ""
        )
        raise PersonalensError(held + refusal(needs, gpus.count, rules))
    copies = replicas(needs, candidates[0].placements, gpus.count, rules)
    decided = {
        c: _decided(c, tuple(roles[c]), p, gpus, rules, copies.of(p.key))
        for c, p in zip(local, candidates[0].placements)
    }
    return Layout(tuple((decided | external)[c] for c in roles), gpus, rules, tuple(needs), tuple(candidates), copies)


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
        if c in in_process:
            decided[c] = Decision(c, tuple(roles[c]), "in_process", c.with_memory_share(1 / len(in_process)))
        else:
            copies = tuple(
                Decision(c, tuple(roles[c]), "managed_server", c, copy=k) for k in range(1, c.explicit_replicas or 1)
            )
            decided[c] = Decision(c, tuple(roles[c]), "managed_server", c, copies=copies)
    return decided


def _decided(
    c: ModelConfig,
    roles: tuple[str, ...],
    placed: Placement,
    gpus: GpuSpec,
    rules: Rules,
    copies: Sequence[Placement] = (),
) -> Decision:
    run = dataclasses.replace(c, kv_cache_memory_bytes=placed.kv_cache_memory_bytes)
    made = tuple(dataclasses.replace(_decided(c, roles, p, gpus, rules), copy=k) for k, p in enumerate(copies, start=1))
    if placed.mode == "in_process":
        # vLLM checks at start-up that this share of the GPU is free: each engine's own part, so the
        # second engine on a GPU finds it free beside the first
        run = dataclasses.replace(run, gpu_memory_utilization=placed.held_per_gpu(rules) / gpus.memory_bytes)
        return Decision(c, roles, "in_process", run, placement=placed, copies=made)
    return Decision(c, roles, "managed_server", run, gpus.device_ids(placed.gpus), placement=placed, copies=made)


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
    arch = Architecture.from_config(json.loads(config_json.read_text()), where=str(config_json))
    size = run_dtype_bytes(config)
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
    # vLLM's own default when max_model_len is unset: the model's context length
    max_model_len = config.max_model_len or arch.context
    return ModelNeed(
        key=key,
        roles=roles,
        arch=arch,
        weights=weights_bytes(directory, arch, size)[0],
        dtype_bytes=size,
        tp=config.tensor_parallel_size,
        placement=placement,
        gpus=config.gpus,
        kv_cache_bytes=config.kv_cache_memory_bytes,
        max_model_len=max_model_len,
        batched_tokens=batched_tokens(config.max_num_batched_tokens, config.enable_chunked_prefill, max_model_len),
        max_num_seqs=config.max_num_seqs,
        replicas=config.explicit_replicas,
    )


def run_dtype_bytes(config: ModelConfig) -> int:
    """Bytes per weight and KV value on a GPU: `auto` is vLLM's rule there (a 16-bit checkpoint as it
    is, a 32-bit one in bfloat16), an explicit dtype as configured."""
    if config.dtype == "auto":
        return 2
    return dtype_bytes(config.dtype, f"model {config.name}")
