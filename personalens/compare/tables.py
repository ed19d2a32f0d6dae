"""Comparisons as `Table`s: one per comparison, all with the same columns, so that compare.csv holds
them all (the comparison's kind and arms as leading columns); and one power table per comparison,
all in power.csv."""

from __future__ import annotations

import math

from personalens.compare.paired import Comparison
from personalens.compare.power import PowerPlan
from personalens.tables.model import Cell, Column, Table
from personalens.tables.power import detectable, power, users_needed

NAME = "compare"
COLUMNS = (
    Column("a", "", "A", 2, holds="estimate"),
    Column("b", "", "B", 2, holds="estimate"),
    Column("difference", "", "B - A", 2, holds="estimate"),
    Column("length_controlled", "", "B - A at equal length (control)", 2, holds="estimate"),
    Column("p", "", "p", 3, holds="value"),
    Column("p_holm", "", "p (Holm)", 3, holds="value"),
    Column("left_out", "", "Left out", holds="count"),
)
POWER = "power"


def _context(c: Comparison) -> tuple[tuple[str, str], ...]:
    return (("comparison", c.kind), ("run_a", c.a.label), ("run_b", c.b.label))


def comparison_table(c: Comparison, alpha: float, differences: tuple[str, ...] = ()) -> Table:
    """Per task kind and metric: A's and B's means over the paired scenarios, B - A with its interval,
    p before and after Holm, the scenarios left out; a row marked significant ("yes") where Holm's p
    is below `alpha`; `differences` (how the two assistants were set up) among its notes."""
    rows = tuple(
        (
            (r.kind, r.name, "yes" if r.significant(alpha) else ""),
            (r.a, r.b, r.difference, r.length_controlled, r.p, r.p_holm, r.left_out),
        )
        for r in c.rows
    )
    return Table(
        NAME,
        c.title,
        ("Kind", "Metric", "Significant"),
        COLUMNS,
        rows,
        context=_context(c),
        notes=(
            f"A = {c.a.label}; B = {c.b.label}. Each row is over the scenarios both scored (n), "
            f"from {c.users} users; a scenario's trials are averaged first.",
            f"Left out: scenarios only one side has a score for; {c.only_a} scenarios were judged in A only "
            f"and {c.only_b} in B only. Significant: Holm p < {alpha:g}, over a family of {c.family} "
            "tests. TCR is in percent (its difference in percentage points).",
            "B - A at equal length: a control, not the result: the difference with the assistants' reply-length "
            "difference (words) regressed out, read at equal length (as AlpacaEval's length-controlled win rate, "
            "arXiv 2404.04475; docs/compare.md#length-controlled-difference); – where the lengths never differ.",
            *differences,
        ),
    )


def level(c: Comparison, alpha: float) -> float:
    """The level a power figure is for: Holm's threshold for the smallest p of the family."""
    return alpha / max(1, c.family)


def power_table(c: Comparison, alpha: float, plan: PowerPlan) -> Table:
    """Per task kind and metric: the users and how their differences vary (the SD one user adds,
    the intra-user correlation), the smallest difference found with `plan.target` power at this
    number of users, and for the metrics `plan` names a difference for: that difference's power
    here and the users it needs."""
    at = level(c, alpha)
    columns = [
        Column("users", "", "Users", holds="count"),
        Column("per_user_sd", "", "Per-user SD", 3, holds="value"),
        Column("icc", "", "Intra-user corr.", 2, holds="value"),
        Column("detectable", "", f"Detectable ({plan.target:.0%} power)", 3, holds="value"),
    ]
    if plan.differences:
        columns += [
            Column("planned", "", "Planned difference", 3, holds="value"),
            Column("power_now", "", "Its power here", 2, holds="value"),
            Column("users_needed", "", "Users needed", holds="count"),
        ]
    rows = []
    for r in c.rows:
        variance = r.per_user_variance
        known = r.users >= 2 and not math.isnan(variance)  # nan: no paired scenarios, or one unit
        cells: list[Cell] = [
            r.users,
            variance**0.5 if known else None,
            r.icc,
            detectable(r.users, variance, at, plan.target) if known else None,
        ]
        if plan.differences:
            d = plan.difference(r.metric.key)
            planned = known and d is not None
            cells += [
                d,
                power(d, r.users, variance, at) if planned else None,
                users_needed(d, variance, at, plan.target) if planned else None,
            ]
        rows.append(((r.kind, r.name), tuple(cells)))
    return Table(
        POWER,
        f"Power: {c.title}",
        ("Kind", "Metric"),
        tuple(columns),
        tuple(rows),
        context=_context(c),
        notes=(
            f"The t-test over users at level {alpha:g} / {c.family} = {at:.2g} (Holm's threshold for the smallest "
            f"p of the family of {c.family} tests: Holm's power when the other metrics do not differ, conservative "
            "when some do), with the standard error sqrt(V / users), V = Per-user SD squared as measured here: for "
            "users like these (the same selection, about as many scenarios each) whose differences vary as "
            "these do. Intra-user corr.: the share of a scenario difference's variance that lies between users.",
            "Users needed N: plan such a run with `personalens plan data.users=0-<N-1>` (docs/compare.md).",
        ),
    )
