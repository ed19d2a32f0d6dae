"""The paper's published agreement (Table 5: its judge against 3 human annotators, and the annotators
among themselves), read from paper_table5.csv: the bar a lab's own agreement is held against."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

PAPER_TABLE5 = Path(__file__).with_name("paper_table5.csv")


@dataclass(frozen=True)
class PublishedAgreement:
    label: str  # Table 5's row
    cohen: float  # mean over the annotators of Cohen's kappa (unweighted) with the judge
    fleiss: float  # Fleiss' kappa among the annotators
    source: str


def paper_table5(path: Path = PAPER_TABLE5) -> dict[tuple[str, str], PublishedAgreement]:
    """(dimension, speaker) -> Table 5's published row; speaker "" for task completion and personalization."""
    with path.open(newline="") as f:
        return {
            (row["dimension"], row["speaker"]): PublishedAgreement(
                row["label"], float(row["cohen"]), float(row["fleiss"]), row["source"]
            )
            for row in csv.DictReader(f)
        }
