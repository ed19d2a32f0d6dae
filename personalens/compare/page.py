"""compare.html: the comparison's heading, its forest plot (inline PNG), one table per comparison
with the significant differences marked and the power tables, on the toolkit's self-contained page frame (tables/page.py)."""

from __future__ import annotations

from pathlib import Path

from personalens.compare.result import ComparisonReport
from personalens.tables.page import figure_view, render_page, table_view

TEMPLATES = Path(__file__).parent / "templates"


def write_page(result: ComparisonReport, figure: Path, path: Path) -> Path:
    """Write compare.html for `result` with the forest plot `figure`."""
    tables = []
    for comparison, table in zip(result.comparisons, result.tables):
        view = table_view(table)
        view["significant"] = [row.significant(result.alpha) for row in comparison.rows]
        tables.append(view)
    return render_page(
        TEMPLATES,
        "compare.html",
        path,
        run_dirs=[str(d) for d in result.run_dirs],
        accepted=[(a.label.capitalize(), a.line()) for a in result.accepted],
        heading=result.heading_lines(),
        figure=figure_view(figure),
        tables=tables,
        power=[table_view(t) for t in result.power_tables],
    )
