"""`personalens plan`'s options (conf/plan/default.yaml), checked once."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig

from personalens.errors import PersonalensError
from personalens.plan.gpu_model import GPUS

# the jobs whose models are placed together, and their roles
JOBS = {"generate": ("user_agent", "assistant"), "judge": ("judge",), "run": ("user_agent", "assistant", "judge")}


@dataclass(frozen=True)
class PlanOptions:
    jobs: tuple[str, ...]
    gpus: int | None
    gpu_memory_gib: float | None
    calibrate: Path | None
    tokens_per_s: float | None
    time_limit: str | None
    max_rendered: int
    gpu_type: str
    model_dialogues: int
    out: Path

    @classmethod
    def from_config(cls, cfg: DictConfig) -> PlanOptions:
        p = cfg.plan
        jobs = tuple(p.jobs)
        unknown = sorted(set(jobs) - set(JOBS))
        if unknown or not jobs:
            raise PersonalensError(f"plan.jobs: {list(jobs)}; expected some of {list(JOBS)}")
        if (p.gpus is None) != (p.gpu_memory_gib is None):
            raise PersonalensError(
                "plan.gpus and plan.gpu_memory_gib go together: e.g. plan.gpus=4 plan.gpu_memory_gib=80"
            )
        if p.gpus is not None and (int(p.gpus) < 1 or float(p.gpu_memory_gib) <= 0):
            raise PersonalensError(f"plan.gpus={p.gpus} plan.gpu_memory_gib={p.gpu_memory_gib}: both must be positive")
        if p.tokens_per_s is not None and float(p.tokens_per_s) <= 0:
            raise PersonalensError(f"plan.tokens_per_s: must be positive, got {p.tokens_per_s}")
        if int(p.max_rendered) < 1:
            raise PersonalensError(f"plan.max_rendered: must be at least 1, got {p.max_rendered}")
        if str(p.gpu_type) not in GPUS:
            raise PersonalensError(f"plan.gpu_type: expected one of {list(GPUS)}, got {p.gpu_type!r}")
        if int(p.model_dialogues) < 1:
            raise PersonalensError(f"plan.model_dialogues: must be at least 1, got {p.model_dialogues}")
        return cls(
            jobs,
            None if p.gpus is None else int(p.gpus),
            None if p.gpu_memory_gib is None else float(p.gpu_memory_gib),
            None if p.calibrate is None else Path(p.calibrate),
            None if p.tokens_per_s is None else float(p.tokens_per_s),
            None if p.time_limit is None else str(p.time_limit),
            int(p.max_rendered),
            str(p.gpu_type),
            int(p.model_dialogues),
            Path(p.out) if p.out else Path(cfg.run.out_dir) / "plan.json",
        )
