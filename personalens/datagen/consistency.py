"""Profile consistency (Figure 21): a 0/1 conflict label per domain and across domains, with an
explanation; shared by `personalens build` (which regenerates flagged preferences) and
`personalens consistency` (which checks the users of an existing data root)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from personalens.datagen.batch import Job
from personalens.datagen.grammars import CROSS_DOMAIN, EXPLANATION, Limits, consistency_grammar, parse_consistency
from personalens.datagen.prompts import BuildTemplates

ANY = "Any"  # the table row of profiles flagged anywhere


@dataclass(frozen=True)
class Profile:
    """What the check sees of one user: demographics and the preferences of the domains to check."""

    user_id: str
    index: int
    demographics: Mapping[str, str]
    affinities: Mapping[str, Mapping[str, object]]  # domain -> preference type -> value


def check_job(templates: BuildTemplates, profile: Profile, limits: Limits, key: tuple) -> Job:
    domains = list(profile.affinities)
    return Job(
        key=key,
        user_index=profile.index,
        messages=templates.messages("consistency", profile.demographics, affinities=profile.affinities),
        grammar=consistency_grammar(domains, limits),
        parse=lambda text: parse_consistency(text, domains),
    )


def flagged_domains(verdict: Mapping[str, object]) -> list[str]:
    """The domains whose preferences conflict; every domain when the conflict is across domains."""
    domains = [k for k in verdict if k not in (CROSS_DOMAIN, EXPLANATION)]
    if verdict[CROSS_DOMAIN] == 1:
        return domains
    return [d for d in domains if verdict[d] == 1]


def flag_counts(verdicts: Sequence[Mapping[str, object]]) -> dict[str, tuple[int, int]]:
    """label -> (profiles checked, profiles flagged), for each domain, across domains, and anywhere."""
    counts: dict[str, list[int]] = {}
    for verdict in verdicts:
        labels = {k: v for k, v in verdict.items() if k != EXPLANATION}
        for label, value in [*labels.items(), (ANY, int(any(v == 1 for v in labels.values())))]:
            checked_flagged = counts.setdefault(label, [0, 0])
            checked_flagged[0] += 1
            checked_flagged[1] += value == 1
    order = sorted(counts, key=lambda k: (k == ANY, k == CROSS_DOMAIN, k))
    return {k: (counts[k][0], counts[k][1]) for k in order}
