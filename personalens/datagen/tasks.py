"""Task definitions shared by all users: single-domain tasks per domain (Figure 9) and multi-domain
tasks over several domains (Figure 10), numbered as task.jsonl numbers them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from personalens.data.schema import Domain
from personalens.datagen.batch import Job, Runner
from personalens.datagen.grammars import Limits, md_tasks_grammar, parse_md_tasks, parse_sd_tasks, sd_tasks_grammar
from personalens.datagen.prompts import BuildTemplates
from personalens.errors import PersonalensError

SHARED = -1  # the user_index of jobs that belong to no user


@dataclass(frozen=True)
class BuiltTask:
    task_id: str  # "SD-Movies-task-2", "MD-task-1"
    number: int
    fields: dict  # Task Description, User Intent, Task Goal, [Relevant Domains,] Relevant Affinity Types

    @property
    def domains(self) -> list[str]:
        return self.fields["Relevant Domains"]


def sd_tasks(
    runner: Runner,
    templates: BuildTemplates,
    domains: Sequence[Domain],
    per_domain: int,
    limits: Limits,
    *,
    active: bool,
) -> list[BuiltTask]:
    jobs = [
        Job(
            (d.name,),
            SHARED,
            templates.messages("tasks_sd", domain=d, count=per_domain),
            sd_tasks_grammar(d, per_domain, limits),
            lambda text, d=d: parse_sd_tasks(text, d, per_domain),
        )
        for d in domains
    ]
    found = runner.run("sd_tasks", jobs, active=active)
    return [
        BuiltTask(f"SD-{d.name}-task-{n}", n, {**fields, "Relevant Domains": [d.name]})
        for d in domains
        for n, fields in enumerate(found[(d.name,)], start=1)
    ]


def md_tasks(
    runner: Runner,
    templates: BuildTemplates,
    domains: Sequence[Domain],
    total: int,
    per_request: int,
    span: tuple[int, int],
    limits: Limits,
    *,
    active: bool,
) -> list[BuiltTask]:
    if total <= 0:
        return []
    lo, hi = min(span[0], len(domains)), min(span[1], len(domains))
    if lo < 2 or lo > hi:
        raise PersonalensError(
            f"datagen.tasks.md_domains={list(span)}: a multi-domain task needs at least 2 of "
            f"the {len(domains)} domains built; set datagen.tasks.md_count=0 or build more domains"
        )
    sizes = [min(per_request, total - start) for start in range(0, total, per_request)]
    jobs = [
        Job(
            (k,),
            SHARED,
            templates.messages("tasks_md", domains=domains, count=n, span=(lo, hi)),
            md_tasks_grammar(domains, n, (lo, hi), limits),
            lambda text, n=n: parse_md_tasks(text, domains, n),
        )
        for k, n in enumerate(sizes)
    ]
    found = runner.run("md_tasks", jobs, active=active)
    fields = [task for k in range(len(sizes)) for task in found[(k,)]]
    return [BuiltTask(f"MD-task-{n}", n, f) for n, f in enumerate(fields, start=1)]


def assigned(tasks: Sequence[BuiltTask], interests: dict[str, int]) -> list[BuiltTask]:
    """The tasks a user gets: those whose every domain the user's mask keeps."""
    return [t for t in tasks if all(interests.get(d) == 1 for d in t.domains)]
