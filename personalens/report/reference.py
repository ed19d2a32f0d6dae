"""The judge panel's agreement beside the paper's (data/paper_table5.csv): per metric, the kappa the
paper's judge reached against its human annotators, the bar a lab's own judges are held against."""

from __future__ import annotations

from dataclasses import replace

from personalens.data.paper import paper_table5
from personalens.report.panel import METRICS, metric_name
from personalens.tables.model import Column, Table

PAPER = Column("paper_cohen", "", "Paper: judge vs humans (Cohen)", 3, holds="value")


def with_paper(agreement: Table) -> Table:
    """The judges' agreement table (a row per pair of judges and metric, the metric's name third) with
    the paper's judge-human kappa of that metric."""
    published = paper_table5()
    by_name = {metric_name(m): published.get((m.dimension, m.speaker)) for m in METRICS}
    rows = tuple(
        (labels, (*cells, None if (p := by_name.get(labels[2])) is None else p.cohen))
        for labels, cells in agreement.rows
    )
    return replace(
        agreement,
        columns=(*agreement.columns, PAPER),
        rows=rows,
        notes=(
            *agreement.notes,
            "Paper: Table 5's mean Cohen's kappa (unweighted) between the paper's judge and each of its 3 "
            "annotators on 100 dialogues (data/paper_table5.csv). A bar, not a like-for-like figure: here two "
            "judges agree, with quadratic weights for the ordinal scores; `personalens agreement score` sets a "
            "judge against a lab's own annotators as the paper did (docs/agreement.md).",
        ),
    )
