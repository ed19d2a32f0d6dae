"""The build from start to end: which stages run, in what order, on whose data, and the summary."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from personalens.data.records import with_domains
from personalens.data.schema import Domain
from personalens.datagen import profiles
from personalens.datagen import situations as situation_stage
from personalens.datagen import tasks as task_stage
from personalens.datagen.assemble import profile, write_tasks, write_user
from personalens.datagen.batch import Runner
from personalens.datagen.consistency import flagged_domains
from personalens.datagen.grammars import Limits
from personalens.datagen.prompts import BuildTemplates
from personalens.errors import PersonalensError

STAGES = ("interests", "preferences", "consistency", "interactions", "tasks", "situations", "assemble")
PER_USER = ("interests", "preferences", "consistency", "interactions", "situations")  # the runner's stages of a user
STAGE_TABLES = "build"  # the stage tables' folder inside the output root


@dataclass(frozen=True)
class BuildPlan:
    out_dir: Path
    people: Mapping[int, Mapping[str, str]]  # this shard's users: index -> demographics
    domains: tuple[Domain, ...]
    stages: frozenset[str]
    sharded: bool
    min_interests: int
    sd_per_domain: int
    md_count: int
    md_per_request: int
    md_span: tuple[int, int]
    check: bool
    max_regenerations: int
    limits: Limits


@dataclass(frozen=True)
class BuildResult:
    users: int
    sd_tasks: int
    md_tasks: int
    sd_scenarios: int  # assigned (user, task) pairs
    md_scenarios: int
    first_flagged: int
    regenerated: int
    rounds: int
    still_flagged: tuple[str, ...]  # user ids whose last check still flags a conflict
    verdicts: tuple[Mapping, ...]  # the last verdict of every checked user
    assembled: bool
    seconds: float

    def line(self, runner: Runner) -> str:
        consistency = (
            f"consistency: {self.first_flagged} profiles flagged, {self.regenerated} domain preferences "
            f"regenerated in {self.rounds} rounds, {len(self.still_flagged)} still flagged"
            + (
                f" ({', '.join(self.still_flagged[:10])}{' ...' if len(self.still_flagged) > 10 else ''})"
                if self.still_flagged
                else ""
            )
        )
        written = "official layout written" if self.assembled else "layout not written (assemble not run)"
        # a rate of users only where users' outputs were generated (not in the tasks or assemble phase)
        built_users = any(runner.counts[s].requests for s in PER_USER if s in runner.counts)
        rate = f" ({self.users / max(self.seconds, 1e-9) * 60:.1f} users/min)" if built_users else ""
        return (
            f"build: {self.users} users, {self.sd_tasks} single-domain and {self.md_tasks} multi-domain tasks, "
            f"{self.sd_scenarios} + {self.md_scenarios} user-task scenarios; {consistency}; "
            f"{runner.summary()}; {self.seconds:.1f} s in all{rate}; {written}"
        )


def stage_names(stages: Sequence[str]) -> frozenset[str]:
    unknown = [s for s in stages if s not in STAGES]
    if unknown:
        raise PersonalensError(f"datagen.stages: unknown stage(s) {unknown}; stages are {list(STAGES)}")
    return frozenset(stages)


def build(plan: BuildPlan, runner: Runner, templates: BuildTemplates) -> BuildResult:
    """Runs the selected stages over this shard's users, reading the results of the others."""
    started = time.monotonic()
    S = plan.stages
    if "assemble" in S and plan.sharded:
        raise PersonalensError(
            "datagen.stages: assemble reads every user, so it runs without sharding "
            "(shard.count=1) after all shards are done; leave it out of sharded runs"
        )
    people, domains, limits = plan.people, plan.domains, plan.limits
    needs = lambda *stages: bool(S & set(stages))  # noqa: E731 - a stage's output is needed by these

    mask = (
        profiles.interests(runner, templates, people, domains, plan.min_interests, active="interests" in S)
        if needs("interests", "situations", "assemble")
        else {}
    )
    checked = None
    if needs("preferences", "consistency", "interactions", "situations", "assemble"):
        check = plan.check and needs("consistency", "interactions", "situations", "assemble")
        checked = profiles.checked_preferences(
            runner,
            templates,
            people,
            domains,
            limits,
            max_regenerations=plan.max_regenerations,
            check=check,
            active={"preferences": "preferences" in S, "consistency": "consistency" in S},
        )
    summaries = (
        profiles.interactions(
            runner, templates, people, domains, checked.preferences, limits, active="interactions" in S
        )
        if needs("interactions", "assemble")
        else {}
    )
    tasks: list[task_stage.BuiltTask] = []
    if needs("tasks", "situations", "assemble"):
        active = "tasks" in S and not plan.sharded  # shared by all shards: made once, before them
        tasks = task_stage.sd_tasks(
            runner, templates, domains, plan.sd_per_domain, limits, active=active
        ) + task_stage.md_tasks(
            runner, templates, domains, plan.md_count, plan.md_per_request, plan.md_span, limits, active=active
        )
    assignments = {i: task_stage.assigned(tasks, mask[i]) for i in mask} if tasks and mask else {}
    contexts = (
        situation_stage.situations(
            runner, templates, people, assignments, checked.preferences, limits, active="situations" in S
        )
        if needs("situations", "assemble")
        else {}
    )
    if "assemble" in S:
        write_tasks(plan.out_dir, tasks, [d.name for d in domains])
        root_domains = with_domains(d.name for d in domains)
        for i, demographics in people.items():
            write_user(
                plan.out_dir,
                i,
                profile(
                    i,
                    demographics,
                    root_domains,
                    mask[i],
                    {d.name: checked.preferences[(i, d.name)] for d in domains},
                    {d.name: summaries[(i, d.name)] for d in domains},
                ),
                assignments[i],
                {t.task_id: contexts[(i, t.task_id)] for t in assignments[i]},
            )
    verdicts = checked.verdicts if checked else {}
    return BuildResult(
        users=len(people),
        sd_tasks=sum(t.task_id.startswith("SD-") for t in tasks),
        md_tasks=sum(t.task_id.startswith("MD-") for t in tasks),
        sd_scenarios=sum(t.task_id.startswith("SD-") for ts in assignments.values() for t in ts),
        md_scenarios=sum(t.task_id.startswith("MD-") for ts in assignments.values() for t in ts),
        first_flagged=checked.first_flagged if checked else 0,
        regenerated=checked.regenerated if checked else 0,
        rounds=checked.rounds if checked else 0,
        still_flagged=tuple(profiles.user_id(i) for i, v in sorted(verdicts.items()) if flagged_domains(v)),
        verdicts=tuple(verdicts[i] for i in sorted(verdicts)),
        assembled="assemble" in S,
        seconds=time.monotonic() - started,
    )
