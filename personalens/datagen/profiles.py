"""The per-user profile stages: interest mask (Section 2.1), preferences (Figure 6) checked for
consistency (Figure 21) and regenerated where flagged, and past-interaction summaries (Figure 7)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from personalens.data.schema import Domain
from personalens.datagen.batch import Job, Runner
from personalens.datagen.consistency import Profile, check_job, flagged_domains
from personalens.datagen.grammars import (
    Limits,
    interests_grammar,
    parse_interests,
    parse_preferences,
    parse_summary,
    preferences_grammar,
    summary_grammar,
)
from personalens.datagen.prompts import BuildTemplates

People = Mapping[int, Mapping[str, str]]  # user index -> demographics (without user_id)


def user_id(index: int) -> str:
    return f"user{index}"


def interests(
    runner: Runner, templates: BuildTemplates, people: People, domains: Sequence[Domain], minimum: int, *, active: bool
) -> dict[int, dict[str, int]]:
    names = [d.name for d in domains]
    grammar = interests_grammar(names, minimum)
    jobs = [
        Job(
            (user_id(i),),
            i,
            templates.messages("interests", demo, domains=domains),
            grammar,
            lambda text: parse_interests(text, names),
        )
        for i, demo in people.items()
    ]
    found = runner.run("interests", jobs, active=active)
    return {i: found[(user_id(i),)] for i in people}


@dataclass(frozen=True)
class CheckedPreferences:
    preferences: dict[tuple[int, str], dict]  # (user index, domain) -> the final preferences
    verdicts: dict[int, dict]  # user index -> the last consistency verdict
    first_flagged: int  # profiles flagged by the first check
    regenerated: int  # (user, domain) preferences generated again after a flag
    rounds: int  # consistency rounds that regenerated something


def checked_preferences(
    runner: Runner,
    templates: BuildTemplates,
    people: People,
    domains: Sequence[Domain],
    limits: Limits,
    *,
    max_regenerations: int,
    check: bool,
    active: Mapping[str, bool],
) -> CheckedPreferences:
    """Preferences for every user and domain; with `check`, each profile is checked and the flagged
    domains' preferences regenerated (round r+1, new seeds) until clean or max_regenerations rounds.
    Round 0 belongs to the preferences stage, checks and later rounds to the consistency stage."""
    by_name = {d.name: d for d in domains}
    grammars = {d.name: preferences_grammar(d, limits) for d in domains}
    final: dict[tuple[int, str], dict] = {}
    verdicts: dict[int, dict] = {}
    pending = [(i, d.name) for i in people for d in domains]
    regenerated = rounds = first_flagged = 0
    for round_ in range(max_regenerations + 1):
        jobs = [
            Job(
                (user_id(i), name, round_),
                i,
                templates.messages("preferences", people[i], domain=by_name[name]),
                grammars[name],
                lambda text, d=by_name[name]: parse_preferences(text, d),
            )
            for i, name in pending
        ]
        found = runner.run("preferences", jobs, active=active["preferences" if round_ == 0 else "consistency"])
        final.update({(i, name): found[(user_id(i), name, round_)] for i, name in pending})
        if round_:
            regenerated += len(pending)
            rounds += 1
        if not check:
            break
        users = sorted({i for i, _ in pending})
        profiles = [Profile(user_id(i), i, people[i], {d.name: final[(i, d.name)] for d in domains}) for i in users]
        checked = runner.run(
            "consistency",
            [check_job(templates, p, limits, (p.user_id, round_)) for p in profiles],
            active=active["consistency"],
        )
        verdicts.update({i: checked[(user_id(i), round_)] for i in users})
        pending = [(i, name) for i in users for name in flagged_domains(verdicts[i])]
        if round_ == 0:
            first_flagged = len({i for i, _ in pending})
        if not pending or round_ == max_regenerations:
            break
    return CheckedPreferences(final, verdicts, first_flagged, regenerated, rounds)


def interactions(
    runner: Runner,
    templates: BuildTemplates,
    people: People,
    domains: Sequence[Domain],
    preferences: Mapping[tuple[int, str], dict],
    limits: Limits,
    *,
    active: bool,
) -> dict[tuple[int, str], str]:
    grammar = summary_grammar(limits)
    jobs = [
        Job(
            (user_id(i), d.name),
            i,
            templates.messages("interactions", people[i], domain=d.name, preferences=preferences[(i, d.name)]),
            grammar,
            parse_summary,
        )
        for i in people
        for d in domains
    ]
    found = runner.run("interactions", jobs, active=active)
    return {(i, d.name): found[(user_id(i), d.name)] for i in people for d in domains}
