"""Engines for the roles a command needs (user_agent, assistant, judge), built from model configs.

Roles with equal configs share one engine. Distinct in-process vLLM engines live side by side in
this process, so each gets an equal share of its configured gpu_memory_utilization.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from personalens.engines.base import Engine
from personalens.engines.config import ModelConfig, ModelConfigError

ROLES = ("user_agent", "assistant", "judge")


def model_configs(models: Mapping[str, Mapping[str, Any]]) -> dict[str, ModelConfig]:
    """Checked configs for a subset of the roles (a command passes only the roles it runs)."""
    unknown = sorted(set(models) - set(ROLES))
    if unknown:
        raise ModelConfigError(f"unknown role(s) {unknown}; roles are {list(ROLES)}")
    return {role: ModelConfig.from_mapping(raw, where=f"model@{role}") for role, raw in models.items()}


def plan_engines(configs: Mapping[str, ModelConfig]) -> dict[str, ModelConfig]:
    """The config each role's engine is built from: equal configs map to one (equal) config, and
    in-process vLLM configs are scaled to share memory."""
    distinct = list(dict.fromkeys(configs.values()))
    in_process = sum(1 for c in distinct if c.engine == "vllm")
    scaled = {c: c.with_memory_share(1 / in_process) if c.engine == "vllm" else c for c in distinct}
    return {role: scaled[config] for role, config in configs.items()}


def build_engine(config: ModelConfig) -> Engine:
    if config.engine == "server":
        from personalens.engines.server import ServerEngine

        return ServerEngine(config)
    from personalens.engines.vllm_local import VllmEngine

    return VllmEngine(config)


def build_engines(models: Mapping[str, Mapping[str, Any]]) -> dict[str, Engine]:
    """One engine per role in `models`; roles with equal model configs get the same engine object."""
    plan = plan_engines(model_configs(models))
    engines: dict[ModelConfig, Engine] = {}
    for config in plan.values():
        if config not in engines:
            engines[config] = build_engine(config)
    return {role: engines[config] for role, config in plan.items()}
