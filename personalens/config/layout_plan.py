"""`layout=PLAN_JSON` on `generate` and `judge`: the job runs the layout `personalens plan` chose for it
(plan/layouts.py: the fastest that fits among the bottleneck model over more GPUs, as several engines,
or with the others beside it). The plan's chosen overrides (`user_agent.tensor_parallel_size=4`,
`user_agent.replicas=2`, ...) take the place of the `layout=` argument before Hydra composes the config,
so `--cfg job` shows them; once composed, the job's models must be the ones the plan placed."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig

from personalens.errors import PersonalensError

JOBS = {"generate": ("user_agent", "assistant"), "judge": ("judge",)}  # the roles each job places


@dataclass(frozen=True)
class ChosenLayout:
    path: Path
    job: str
    name: str  # the plan's name of the layout ("as configured" where the plan kept the configured one)
    overrides: tuple[str, ...]
    models: dict[str, str]  # role -> the model name the plan placed

    def line(self) -> str:
        given = f" ({' '.join(self.overrides)})" if self.overrides else ""
        return f"{self.job}: the layout {self.path} chose: {self.name}{given}"


def read(path: Path, job: str) -> ChosenLayout:
    """The layout a plan.json chose for `job`; a PersonalensError naming the file and the field where it
    is no plan.json or the plan refused the job. A job the plan did not model keeps the configured layout."""
    where = f"layout={path}"
    try:
        plan = json.loads(Path(path).read_text(encoding="utf-8"))
        jobs = plan["placement"]["jobs"]
        roles = plan["roles"]["roles"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise PersonalensError(f"{where}: not a plan.json of `personalens plan` ({type(err).__name__}: {err})") from err
    models = {r: str(v["model"]) for r, v in roles.items() if r in JOBS[job] and isinstance(v, dict) and "model" in v}
    planned = jobs.get(job)
    if planned is None:
        return ChosenLayout(Path(path), job, f"as configured (the plan did not place {job})", (), models)
    if "refused" in planned:
        raise PersonalensError(f"{where}: the plan refused {job}'s layout: {planned['refused']}")
    rows = (planned.get("throughput") or {}).get("alternatives") or []
    chosen = next((row for row in rows if row.get("chosen")), None)
    if chosen is None:
        return ChosenLayout(Path(path), job, "as configured (the plan compared no layouts)", (), models)
    overrides = chosen.get("overrides")
    if not isinstance(overrides, list) or not all(isinstance(o, str) and "=" in o for o in overrides):
        raise PersonalensError(f"{where}: jobs.{job}'s chosen layout has no list of key=value overrides")
    return ChosenLayout(Path(path), job, str(chosen.get("name", "")), tuple(overrides), models)


def expand(job: str, overrides: list[str]) -> tuple[list[str], ChosenLayout | None]:
    """`overrides` with a `layout=PATH` replaced by the layout's overrides, and the layout (None without
    one). A key the command line sets to another value than the layout is refused: which one wins is
    the user's to say."""
    given = [o for o in overrides if o.split("=", 1)[0] == "layout"]
    if not given:
        return overrides, None
    if job not in JOBS:
        raise PersonalensError(f"{given[0]}: only generate and judge run a planned layout")
    if len(given) > 1:
        raise PersonalensError(f"layout= given {len(given)} times; give one plan.json")
    chosen = read(Path(given[0].split("=", 1)[1]), job)
    values = {o.split("=", 1)[0].lstrip("+~"): o.split("=", 1)[-1] for o in overrides}
    for o in chosen.overrides:
        key, value = o.split("=", 1)
        if values.get(key, value) != value:
            raise PersonalensError(
                f"{key} is set both on the command line ({key}={values[key]}) and by the layout {chosen.path} "
                f"chose ({o}); leave it out of one"
            )
    at = overrides.index(given[0])
    added = [o for o in chosen.overrides if o.split("=", 1)[0] not in values]  # the same value given: once
    return [*overrides[:at], *added, *overrides[at + 1 :]], chosen


def check(chosen: ChosenLayout, cfg: DictConfig) -> None:
    """The composed job's models are the ones the plan placed: a layout planned for other models may not
    fit or be the fastest for these."""
    for role, planned in chosen.models.items():
        name = str(cfg[role].name) if role in cfg else None
        if name != planned:
            raise PersonalensError(
                f"layout={chosen.path}: planned {role} {planned}, this {chosen.job} has {name}; run "
                f"`personalens plan` with this {chosen.job}'s overrides again"
            )
