"""Comparisons as `Table`s: one per comparison, all with the same columns, so that compare.csv holds
them all (the comparison's kind and arms as leading columns)."""

from __future__ import annotations

from personalens.compare.paired import Comparison
from personalens.tables.model import Column, Table

NAME = "compare"
COLUMNS = (
    Column("a", "", "A", 2, holds="estimate"),
    Column("b", "", "B", 2, holds="estimate"),
    Column("difference", "", "B - A", 2, holds="estimate"),
    Column("p", "", "p", 3, holds="value"),
    Column("p_holm", "", "p (Holm)", 3, holds="value"),
    Column("left_out", "", "Left out", holds="count"),
)


def comparison_table(c: Comparison, alpha: float) -> Table:
    """Per task kind and metric: A's and B's means over the paired scenarios, B - A with its interval,
    p before and after Holm, the scenarios left out; a row marked significant ("yes") where Holm's p
    is below `alpha`."""
    rows = tuple(
        (
            (r.kind, r.name, "yes" if r.significant(alpha) else ""),
            (r.a, r.b, r.difference, r.p, r.p_holm, r.left_out),
        )
        for r in c.rows
    )
    return Table(
        NAME,
        c.title,
        ("Kind", "Metric", "Significant"),
        COLUMNS,
        rows,
        context=(("comparison", c.kind), ("run_a", c.a.label), ("run_b", c.b.label)),
        notes=(
            f"A = {c.a.label}; B = {c.b.label}. Each row is over the scenarios both scored (n), "
            f"from {c.users} users; a scenario's trials are averaged first.",
            f"Left out: scenarios only one side has a score for; {c.only_a} scenarios were judged in A only "
            f"and {c.only_b} in B only. Significant: Holm p < {alpha:g}. TCR is in percent (its difference "
            "in percentage points).",
        ),
    )
