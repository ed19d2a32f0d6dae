"""Table 5 with the paper's published values beside the lab's (data/paper_table5.csv): the bar a judge
is held against, since the paper's judge agreed with its annotators that well."""

from __future__ import annotations

from dataclasses import replace

from personalens.agreement.metrics import METRICS
from personalens.data.paper import paper_table5
from personalens.tables.model import Column, Table

PAPER_COLUMNS = (
    Column("paper_cohen", "Paper", "Cohen's Kappa", 3, holds="value"),
    Column("paper_fleiss", "Paper", "IAA (Fleiss' Kappa)", 3, holds="value"),
)


def with_paper(table: Table) -> Table:
    """`table` (Table 5, a row per metric by its label) with the paper's two published columns."""
    published = paper_table5()
    by_label = {m.label: published.get((m.dimension, m.speaker)) for m in METRICS}
    rows = tuple(
        (labels, (*cells, *((None, None) if (p := by_label.get(labels[0])) is None else (p.cohen, p.fleiss))))
        for labels, cells in table.rows
    )
    source = next(iter(published.values())).source
    return replace(
        table,
        columns=(*table.columns, *PAPER_COLUMNS),
        rows=rows,
        notes=(
            *table.notes,
            f"Paper: the values published for the paper's judge and annotators ({source}); the bar to meet, not a "
            "test: they were measured on other dialogues, by other annotators, with the paper's judge.",
        ),
    )
