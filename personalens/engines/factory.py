"""Engines for the roles a command needs (user_agent, assistant, judge), built from model configs.

Roles with equal configs share one engine. Where each distinct model runs is decided first, when the
loader is made (placement/layout.py): the decision is logged, and a layout that cannot fit is refused there,
before anything is saved or loaded. When the engines are needed, the GPUs' free memory is checked
against the layout (placement/free.py), the managed vLLM servers (the models' copies among them)
start together (managed.py), then the in-process engines load; a model with copies is one engine
over them all (replicated.py). Closing the loader stops them all, servers included, so that the
next model of a judge panel starts on free GPUs.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from personalens.engines.base import Engine
from personalens.engines.dtype import read_cpu_flags, vllm_is_cpu_build
from personalens.engines.models.config import ModelConfig, ModelConfigError
from personalens.engines.models.speculative import reproducible_refusal
from personalens.engines.placement.free import wait_until_free
from personalens.engines.placement.gpus import GpuSpec, visible_gpu_spec
from personalens.engines.placement.inflight import Cache, caches
from personalens.engines.placement.layout import plan_layout
from personalens.engines.placement.placed import Placement
from personalens.engines.replicated import ReplicatedEngine
from personalens.engines.serving.managed import start_servers
from personalens.engines.serving.processes import Servers
from personalens.engines.stop import Stop
from personalens.engines.vllm import invariance
from personalens.engines.vllm.kv import kv_refusal
from personalens.engines.vllm.quantization import fp8_note, quantization_refusal
from personalens.errors import PersonalensError

log = logging.getLogger(__name__)

ROLES = ("user_agent", "assistant", "judge")


def model_configs(models: Mapping[str, Mapping[str, Any]]) -> dict[str, ModelConfig]:
    """Checked configs for a subset of the roles (a command passes only the roles it runs)."""
    unknown = sorted(set(models) - set(ROLES))
    if unknown:
        raise ModelConfigError(f"unknown role(s) {unknown}; roles are {list(ROLES)}")
    return {role: ModelConfig.from_mapping(raw, where=f"model@{role}") for role, raw in models.items()}


def build_engine(config: ModelConfig, stop: Stop | None = None) -> Engine:
    """The engine of one model config, checking `stop` (the command's) while it waits for replies."""
    if config.engine == "server":
        from personalens.engines.serving.engine import ServerEngine

        return ServerEngine(config, stop)
    from personalens.engines.vllm.local import VllmEngine

    return VllmEngine(config, stop)


class EngineLoader:
    """The engines of some roles: their layout decided (or refused) and logged when the loader is made,
    the engines made on the first call and kept. `log_dir` takes the managed servers' logs, named
    with `shard`; the models of the roles in `in_process` must run in this process; `work` (per role
    the tokens it generates per dialogue) shares the GPUs the layout leaves free out among copies. `gpus`, `build`
    and `serve` are the GPU reader (read again for the free memory before anything starts), the engine
    maker and the server starter, which launches through the `Servers` it is given (tests replace them).
    `reproducible` runs every engine it starts in the platform's reproducible mode (invariance.py), or
    refuses the platform or layout that cannot, when the loader is made. `stop` is the command's: every engine checks it, the managed
    servers are stopped when it closes (or the loader does), and a stop requested while the engines
    load is raised once they have."""

    def __init__(
        self,
        models: Mapping[str, Mapping[str, Any]],
        log_dir: Path,
        *,
        shard: str = "",
        in_process: frozenset[str] = frozenset(),
        reproducible: bool = False,
        stop: Stop | None = None,
        gpus: Callable[[], GpuSpec | None] | None = None,
        build: Callable[[ModelConfig], Engine] | None = None,
        serve: Callable[[list[Placement], Path, str, Servers], list[ModelConfig]] | None = None,
        work: Mapping[str, float] | None = None,
    ):
        self.configs = model_configs(models)  # hub ids replaced by their snapshot folders
        self._gpus = gpus or visible_gpu_spec
        spec = self._gpus()
        self.mode = _reproducible_mode(self.configs, spec) if reproducible else None
        # engines' cores in this process (vLLM's CPU build): they take turns, so generate runs one cohort
        self.in_process_core = self.mode is not None and self.mode.in_process_core
        if self.mode is not None:
            # each prompt computed whole in its own call, on GPUs too (vLLM's batch invariance covers a
            # batch's size and order, not keys and values cached from other batches): a resumed run's
            # empty cache changes nothing
            self.configs = {
                role: dataclasses.replace(c, enable_prefix_caching=False) if c.engine == "vllm" else c
                for role, c in self.configs.items()
            }
        _check_options(self.configs, spec, reproducible)
        self.layout = plan_layout(self.configs, spec, in_process, work)
        log.info("\n".join(self.layout.lines()))
        self.batch_invariance = None  # what runs reproducibly, kept in the saved config
        if self.mode is not None:
            if self.in_process_core:
                servers = [p.config.name for p in self.layout.placements if p.mode == "managed_server" or p.copies]
                if servers:
                    raise PersonalensError(invariance.server_refusal(sorted(set(servers))))
            local = sorted({c.name for c in self.configs.values() if c.engine == "vllm"})
            self.batch_invariance = invariance.describe(self.mode, local, spec)
            log.info(f"reproducible: {self.batch_invariance}")
        self.stop = stop or Stop()
        self._log_dir, self._shard = Path(log_dir), shard
        self._build = build or (lambda config: build_engine(config, self.stop))
        self._serve = serve or (
            lambda decisions, logs, shard, servers: start_servers(decisions, logs, shard, self.stop, servers)
        )
        self._servers: Servers | None = None  # the managed servers this loader started
        self._engines: dict[str, Engine] | None = None

    @property
    def caches(self) -> tuple[Cache, ...]:
        """The KV caches of the layout's planned models, which size lockstep's dialogues in flight
        (simulate/window.py); none where nothing was planned."""
        return caches(self.layout.placements)

    def __call__(self) -> dict[str, Engine]:
        if self._engines is None:
            if self.mode is not None:
                # read by vLLM when an engine is made; inherited by its processes and the managed servers
                os.environ.update(self.mode.env)
            placed = self.layout.placements
            wait_until_free(self.layout, self._gpus, self.stop)
            managed = [p for p in placed if p.mode == "managed_server"] + [c for p in placed for c in p.copies]
            self._servers = Servers(self.stop) if managed else None
            served = (
                dict(zip(managed, self._serve(managed, self._log_dir, self._shard, self._servers))) if managed else {}
            )
            built = {}
            for p in placed:
                self.stop.check()
                engines = [self._build(served.get(e, e.run_config)) for e in (p, *p.copies)]
                if p.copies and hasattr(engines[0], "capped"):  # in process beside its server copies
                    engines[0].capped = True
                built[p.config] = engines[0] if len(engines) == 1 else ReplicatedEngine(engines, self.stop)
            self.stop.check()  # asked while the last one loaded
            self._engines = {role: built[config] for role, config in self.configs.items()}
        return self._engines

    def close(self) -> None:
        """Free the in-process engines it built and stop the managed servers it started, copies
        included, waiting until their processes have exited: the next model of a judge panel starts
        on the GPUs they held."""
        for engine in {id(e): e for e in (self._engines or {}).values()}.values():
            close = getattr(engine, "close", None)
            if close is not None:
                close()
        if self._servers is not None:
            self._servers.stop_all()
        self._servers, self._engines = None, None


def _reproducible_mode(configs: Mapping[str, ModelConfig], gpus: GpuSpec | None) -> invariance.Mode | None:
    """How `reproducible: true` runs (None: no engine is started here), or a PersonalensError in one
    line where the platform cannot."""
    local = sorted({c.name for c in configs.values() if c.engine == "vllm"})
    external = sorted({c.name for c in configs.values() if c.engine == "server"})
    if external:
        log.warning(
            f"reproducible: {', '.join(external)} answer(s) from an endpoint personalens does not start; its "
            "replies depend on batching unless it runs with VLLM_BATCH_INVARIANT=1"
        )
    if not local:
        return None
    cpu_build = vllm_is_cpu_build()
    why = invariance.refusal(gpus, cpu_build)
    if why is not None:
        raise PersonalensError(why)
    return invariance.mode(gpus, cpu_build)


def _check_options(configs: Mapping[str, ModelConfig], gpus: GpuSpec | None, reproducible: bool) -> None:
    """Refuses, before anything loads, a model's KV options and weight quantization that its platform cannot
    run (vllm/kv.py, vllm/quantization.py), and speculative decoding under `reproducible` (models/speculative.py)."""
    cpu_build = vllm_is_cpu_build()
    for config in dict.fromkeys(c for c in configs.values() if c.engine == "vllm"):
        if config.kv_cache_dtype != "auto" or config.kv_offload_gib is not None:
            flags = read_cpu_flags() if cpu_build else ()
            why = kv_refusal(config, gpus=gpus, cpu_build=cpu_build, cpu_flags=flags, reproducible=reproducible)
            if why:
                raise PersonalensError(why)
        if config.quantization is not None:
            why = quantization_refusal(config, gpus=gpus, cpu_build=cpu_build, reproducible=reproducible)
            if why:
                raise PersonalensError(why)
            if note := fp8_note(config, gpus):
                log.warning(note)
        if reproducible and (why := reproducible_refusal(config.name, config.speculative)):
            raise PersonalensError(why)


def build_engines(
    models: Mapping[str, Mapping[str, Any]], log_dir: Path = Path("logs"), stop: Stop | None = None
) -> dict[str, Engine]:
    """One engine per role in `models`; roles with equal model configs get the same engine object."""
    return EngineLoader(models, log_dir, stop=stop)()
