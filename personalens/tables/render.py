"""Tables as Markdown, CSV and LaTeX text (pure string functions).

Markdown and LaTeX show a cell as `mean [lo, hi] (n=N)`; the CSV keeps mean, lo, hi, n and the
unparsed count as separate numeric columns so that it loads straight into a data frame.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence
from pathlib import Path

from personalens.tables.model import Cell, Column, Table
from personalens.tables.stats import Estimate

EMPTY = "–"
# CSV columns per table column, by what the column holds.
_CSV_FIELDS = {
    "judged": ("mean", "lo", "hi", "n", "unparsed"),
    "estimate": ("mean", "lo", "hi", "n"),
    "count": (),
    "value": (),
}


def cell_text(cell: Cell, column: Column) -> str:
    if cell is None:
        return EMPTY
    if isinstance(cell, int):
        return str(cell)
    if isinstance(cell, float):
        return EMPTY if math.isnan(cell) else f"{cell:.{column.digits}f}"
    counts = f"n={cell.n}" + (f"; {cell.unparsed} unparsed" if cell.unparsed else "")
    if math.isnan(cell.mean):
        return f"{EMPTY} ({counts})"
    d = column.digits
    return f"{cell.mean:.{d}f} [{cell.lo:.{d}f}, {cell.hi:.{d}f}] ({counts})"


def _header_label(column: Column) -> str:
    return f"{column.group} {column.label}" if column.group else column.label


def _caption(table: Table) -> str:
    return table.title + "".join(f" ({value})" for _, value in table.context if value not in table.title)


def markdown(tables: Sequence[Table]) -> str:
    """Each table under its title, followed by its notes."""
    return "\n\n".join(_markdown_one(t) for t in tables)


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|")


def _markdown_one(table: Table) -> str:
    header = [*table.row_header, *map(_header_label, table.columns)]
    lines = [
        f"### {_caption(table)}",
        "",
        "| " + " | ".join(map(_md_escape, header)) + " |",
        "|" + "|".join(["---"] * len(table.row_header) + ["---:"] * len(table.columns)) + "|",
    ]
    for labels, cells in table.rows:
        texts = [*labels, *(cell_text(c, col) for c, col in zip(cells, table.columns))]
        lines.append("| " + " | ".join(map(_md_escape, texts)) + " |")
    if not table.rows:
        lines.append("| " + " | ".join([EMPTY] * len(header)) + " |")
    lines += [""] + [f"_{note}_" for note in table.notes]
    return "\n".join(lines).rstrip() + "\n"


def csv_text(tables: Sequence[Table]) -> str:
    """One CSV for tables with the same columns; each table's context becomes leading columns."""
    if not tables:
        return ""
    first = tables[0]
    header = [key for key, _ in first.context] + [h.lower().replace(" ", "_") for h in first.row_header]
    for column in first.columns:
        fields = _CSV_FIELDS[column.holds]
        header += [f"{column.key}_{f}" for f in fields] if fields else [column.key]
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(header)
    for table in tables:
        if [c.key for c in table.columns] != [c.key for c in first.columns]:
            raise ValueError(f"cannot write {table.title!r} into one CSV with {first.title!r}: columns differ")
        for labels, cells in table.rows:
            row: list[object] = [value for _, value in table.context] + list(labels)
            for cell, column in zip(cells, table.columns):
                row += _csv_cell(cell, column)
            writer.writerow(row)
    return out.getvalue()


def _csv_cell(cell: Cell, column: Column) -> list[object]:
    if column.holds in ("count", "value"):
        return ["" if cell is None or (isinstance(cell, float) and math.isnan(cell)) else cell]
    if isinstance(cell, float):  # a published number: no interval, no count behind it here
        values: list[object] = [repr(cell), "", "", "", ""]
    elif not isinstance(cell, Estimate):  # an empty cell: no mean, nothing behind it
        values = ["", "", "", 0, 0]
    else:
        bounds = ["" if math.isnan(x) else repr(x) for x in (cell.mean, cell.lo, cell.hi)]
        values = [*bounds, cell.n, cell.unparsed]
    return values[: len(_CSV_FIELDS[column.holds])]


_LATEX_SPECIAL = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "|": r"\textbar{}",
    EMPTY: "--",
}


def latex_escape(text: str) -> str:
    return "".join(_LATEX_SPECIAL.get(ch, ch) for ch in text)


def latex(tables: Sequence[Table]) -> str:
    """booktabs tables (needs \\usepackage{booktabs}), one table environment per table."""
    return "\n".join(_latex_one(t) for t in tables)


def _latex_one(table: Table) -> str:
    k = len(table.row_header)
    lines = [
        r"\begin{table}[t]",
        r"\centering",
        rf"\caption{{{latex_escape(_caption(table))}}}",
        rf"\begin{{tabular}}{{{'l' * k}{'r' * len(table.columns)}}}",
        r"\toprule",
    ]
    spans = _group_spans(table.columns)
    if any(group for group, _, _ in spans):
        heads = [""] * k
        for group, _, n in spans:
            heads += [rf"\multicolumn{{{n}}}{{c}}{{{latex_escape(group)}}}"] if group else [""] * n
        lines.append(" & ".join(heads) + r" \\")
        lines.append(" ".join(rf"\cmidrule(lr){{{k + start + 1}-{k + start + n}}}" for g, start, n in spans if g))
    header = [*table.row_header, *(c.label for c in table.columns)]
    lines += [" & ".join(map(latex_escape, header)) + r" \\", r"\midrule"]
    for labels, cells in table.rows:
        texts = [*labels, *(cell_text(c, col) for c, col in zip(cells, table.columns))]
        lines.append(" & ".join(map(latex_escape, texts)) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}", ""]
    return "\n".join(lines)


def _group_spans(columns: Sequence[Column]) -> list[tuple[str, int, int]]:
    """(group, first column index, width) for each run of adjacent columns with the same group."""
    spans: list[tuple[str, int, int]] = []
    for i, column in enumerate(columns):
        if spans and spans[-1][0] == column.group:
            group, start, n = spans[-1]
            spans[-1] = (group, start, n + 1)
        else:
            spans.append((column.group, i, 1))
    return spans


FORMATS = {"md": markdown, "csv": csv_text, "tex": latex}


def write_tables(tables: Sequence[Table], out_dir: Path, formats: Sequence[str] = ("md", "csv", "tex")) -> list[Path]:
    """`<name>.md`, `.csv` and `.tex` (or the `formats` named) of tables that share a name (one
    Table 4 per model); every pipeline writes its tables through here."""
    if not tables:
        return []
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for suffix in formats:
        path = out_dir / f"{tables[0].name}.{suffix}"
        path.write_text(FORMATS[suffix](tables), encoding="utf-8")
        paths.append(path)
    return paths
