"""Situational context per user and assigned task (Figure 11)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from personalens.datagen.batch import Job, Runner
from personalens.datagen.grammars import JUSTIFICATION, Limits, parse_situation, situation_grammar
from personalens.datagen.profiles import People, user_id
from personalens.datagen.prompts import BuildTemplates
from personalens.datagen.tasks import BuiltTask


def situations(
    runner: Runner,
    templates: BuildTemplates,
    people: People,
    assignments: Mapping[int, Sequence[BuiltTask]],
    preferences: Mapping[tuple[int, str], dict],
    limits: Limits,
    *,
    active: bool,
) -> dict[tuple[int, str], dict]:
    """(user index, task id) -> the situation as tasks.json spells it (without the justification)."""
    grammar = situation_grammar(limits)
    jobs = [
        Job(
            (user_id(i), t.task_id),
            i,
            templates.messages(
                "situations",
                people[i],
                task_description=t.fields["Task Description"],
                affinities={d: preferences[(i, d)] for d in t.domains},
            ),
            grammar,
            parse_situation,
        )
        for i, tasks in assignments.items()
        for t in tasks
    ]
    found = runner.run("situations", jobs, active=active)
    return {
        (i, t.task_id): {k: v for k, v in found[(user_id(i), t.task_id)].items() if k != JUSTIFICATION}
        for i, tasks in assignments.items()
        for t in tasks
    }
