"""The table every pipeline produces: labelled rows of cells under typed columns. Renderers
(render.py), figures and pages read it; nothing here knows which paper table it is."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from personalens.tables.stats import Estimate

Cell = Estimate | int | float | None  # float: a published number, shown as printed


@dataclass(frozen=True)
class Column:
    key: str  # CSV column stem, e.g. "SD_TCR"
    group: str  # header over several columns ("SD", "MD") or ""
    label: str  # "TCR (%)"
    digits: int = 2  # decimals shown for a mean
    # "judged": estimates of judge scores (unparsed ones counted); "estimate": other means; "count": integers;
    # "value": plain numbers shown with `digits` decimals
    holds: Literal["judged", "estimate", "count", "value"] = "judged"


@dataclass(frozen=True)
class Table:
    name: str  # file stem: "table3"
    title: str
    row_header: tuple[str, ...]
    columns: tuple[Column, ...]
    rows: tuple[tuple[tuple[str, ...], tuple[Cell, ...]], ...]  # (row labels, one cell per column)
    # Constant fields of the whole table, e.g. (("assistant_model", "m"),) for one Table 4 per model.
    context: tuple[tuple[str, str], ...] = ()
    notes: tuple[str, ...] = ()

    def cell(self, labels: tuple[str, ...], key: str) -> Cell:
        """The cell in the row with `labels` and the column with `key` (KeyError when absent)."""
        keys = [c.key for c in self.columns]
        if key not in keys:
            raise KeyError(f"{self.name} has no column {key!r}")
        col = keys.index(key)
        for row_labels, cells in self.rows:
            if row_labels == labels:
                return cells[col]
        raise KeyError(f"{self.name} has no row {labels}")
