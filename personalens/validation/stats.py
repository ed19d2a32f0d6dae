"""What the data holds: the paper's Table 1, Tables 6-7 (demographics) and Tables 8-9 (preferences).

Pure functions of loaded records (and of the release's affinity schema, `res/schema.json`); the
definitions that reproduce the paper's tables on the complete release are in docs/validation.md.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from scipy.stats import entropy

from personalens.data.records import DOMAINS, Scenario, Task, UserProfile, with_domains
from personalens.data.schema import Domain
from personalens.tables.model import Column, Table
from personalens.validation.regions import PREFER_NOT_TO_SAY, UNMAPPED, WITHHELD, region_of

REGION = "region"  # the derived variable (from birth_country)
# Tables 6 and 7: (release key, label) in the paper's order of variables.
TABLE6_VARIABLES = (
    ("age", "Age"),
    ("gender", "Gender"),
    ("ethnicity", "Self-Reported Ethnicity"),
    ("religion", "Self-Reported Religion"),
    ("employment_status", "Employment Status"),
)
TABLE7_VARIABLES = (
    ("education", "Education"),
    ("marital_status", "Marital Status"),
    ("english_proficiency", "English Proficiency"),
    (REGION, "Regions"),
)
FIGURE3_VARIABLES = (
    ("age", "Age"),
    ("gender", "Gender"),
    (REGION, "Region (country of birth)"),
    ("ethnicity", "Ethnicity"),
)
# Tables 8 and 9 split the release's domains where the paper does; domains a lab added go to Table 9.
TABLE8_DOMAINS, TABLE9_DOMAINS = DOMAINS[:10], DOMAINS[10:]
# answers the paper lists after all others, whatever their frequency
_LAST = (UNMAPPED, PREFER_NOT_TO_SAY)


# ---- Table 1 ------------------------------------------------------------------------------------


def table1(definitions: Mapping[str, Task], scenarios: Sequence[Scenario], domains: Sequence[str]) -> Table:
    """Tasks and dialogues per domain of the data root (`domains_of`); a multi-domain task or
    dialogue counts in each of its domains."""
    tasks = Counter(d for task in definitions.values() for d in task.domains)
    dialogues = Counter(d for s in scenarios for d in s.task.domains)
    rows = [((domain,), (tasks[domain], dialogues[domain])) for domain in domains]
    for kind in ("SD", "MD"):
        rows.append(
            (
                (f"Total {kind}",),
                (sum(t.kind == kind for t in definitions.values()), sum(s.task.kind == kind for s in scenarios)),
            )
        )
    columns = (Column("tasks", "", "#Tasks", holds="count"), Column("dialogues", "", "#Dial", holds="count"))
    return Table(
        "table1",
        "Table 1: tasks and dialogues per domain",
        ("Domain",),
        columns,
        tuple(rows),
        notes=(
            "A multi-domain task definition and a multi-domain dialogue count towards each of "
            "their domains; the totals count each once. #Dial is over the selected users.",
        ),
    )


# ---- Tables 6 and 7 -------------------------------------------------------------------------------


def demographic_value(profile: UserProfile, key: str) -> str:
    """A user's answer for a Table 6-7 variable, withheld answers as "Prefer not to say"."""
    if key == REGION:
        return region_of(profile.demographics["birth_country"])
    value = profile.demographics[key]
    return PREFER_NOT_TO_SAY if value in WITHHELD else value


def demographic_counts(profiles: Sequence[UserProfile], key: str) -> list[tuple[str, int]]:
    """(value, count) by descending count (ties by name), "Other" and "Prefer not to say" last."""
    counts = Counter(demographic_value(p, key) for p in profiles)
    return sorted(counts.items(), key=lambda vc: (_LAST.index(vc[0]) if vc[0] in _LAST else -1, -vc[1], vc[0]))


def demographics_table(
    name: str, title: str, profiles: Sequence[UserProfile], variables: Sequence[tuple[str, str]]
) -> Table:
    n = len(profiles)
    rows = [(("Total Participants", ""), (n, 100.0 if n else None))]
    for key, label in variables:
        rows += [((label, value), (count, 100.0 * count / n)) for value, count in demographic_counts(profiles, key)]
    notes = ['"Prefer not to say" is the release\'s N/A.']
    if any(key == REGION for key, _ in variables):
        notes.append("Regions are derived from the country of birth.")
        unmapped = sorted(
            {p.demographics["birth_country"] for p in profiles if demographic_value(p, REGION) == UNMAPPED}
        )
        if unmapped:
            notes.append(f'"{UNMAPPED}" holds countries of birth with no region: {", ".join(unmapped)}.')
    columns = (Column("count", "", "Count", holds="count"), Column("percent", "", "%", 1, holds="value"))
    return Table(name, title, ("Variable", "Value"), columns, tuple(rows), notes=tuple(notes))


def table6(profiles: Sequence[UserProfile]) -> Table:
    return demographics_table("table6", "Table 6: demographics, part 1", profiles, TABLE6_VARIABLES)


def table7(profiles: Sequence[UserProfile]) -> Table:
    return demographics_table("table7", "Table 7: demographics, part 2", profiles, TABLE7_VARIABLES)


# ---- Tables 8 and 9 -------------------------------------------------------------------------------


def occurrences(profiles: Iterable[UserProfile], domain: str, name: str) -> Counter[str]:
    """How often each value occurs over all users (interested or not); a list counts each element."""
    counts: Counter[str] = Counter()
    for p in profiles:
        value = p.affinities.get(domain, {}).get(name)
        if value is not None:
            counts.update((value,) if isinstance(value, str) else value)
    return counts


def evenness(counts: Mapping[str, int]) -> float:
    """Shannon evenness H / ln(k) over the k distinct values present; NaN when k < 2."""
    k = len(counts)
    return float(entropy(list(counts.values())) / math.log(k)) if k >= 2 else math.nan


def preferences_table(
    name: str, title: str, profiles: Sequence[UserProfile], schema: Sequence[Domain], domains: Sequence[str]
) -> Table:
    """Per domain and preference type: categorical, # possible, # generated, # distinct, evenness."""
    rows = []
    by_name = {d.name: d for d in schema}
    for domain in (by_name[d] for d in domains if d in by_name):
        for t in domain.affinities:
            counts = occurrences(profiles, domain.name, t.name)
            possible = len(t.possible_values) if t.is_categorical else None
            shown = min(len(counts), possible) if possible is not None else len(counts)
            outside = sum(v not in t.possible_values for v in counts) if t.is_categorical else None
            rows.append(
                (
                    (domain.name, t.name, "✓" if t.is_categorical else "✗"),
                    (possible, shown, len(counts), outside, evenness(counts)),
                )
            )
    columns = (
        Column("possible", "", "# Poss.", holds="count"),
        Column("generated", "", "# Gen.", holds="count"),
        Column("distinct", "", "# Distinct", holds="count"),
        Column("outside_schema", "", "# Outside schema", holds="count"),
        Column("evenness", "", "Evenness", 2, holds="value"),
    )
    return Table(
        name,
        title,
        ("Domain", "Preference Type", "Is Categorical"),
        columns,
        tuple(rows),
        notes=(
            "Over all selected users, also those not interested in the domain; each element of a list value "
            "counts once. # Poss. is the length of possible_values in res/schema.json (categorical types only). "
            "# Gen. is min(# Distinct, # Poss.) for categorical types, as the paper prints it, else # Distinct. "
            "# Outside schema counts distinct values missing from possible_values. Evenness is H / ln(k) "
            "with k = # Distinct (– when k < 2).",
        ),
    )


def table8(profiles: Sequence[UserProfile], schema: Sequence[Domain]) -> Table:
    return preferences_table("table8", "Table 8: user preferences, Alarm to Media", profiles, schema, TABLE8_DOMAINS)


def table9(profiles: Sequence[UserProfile], schema: Sequence[Domain]) -> Table:
    added = with_domains(d.name for d in schema)[len(DOMAINS) :]
    return preferences_table(
        "table9",
        f"Table 9: user preferences, Messaging to {(TABLE9_DOMAINS + added)[-1]}",
        profiles,
        schema,
        TABLE9_DOMAINS + added,
    )
