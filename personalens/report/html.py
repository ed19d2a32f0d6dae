"""report.html: every table of a run report, the figures (inline PNG) and a browser of the dialogues
(inline JSON and script), on the toolkit's self-contained page frame (tables/page.py)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from personalens.report.browse import browsable
from personalens.report.result import Report
from personalens.tables.page import figure_view, render_page, script_json, table_view

TEMPLATES = Path(__file__).parent / "templates"
# the browser's score columns: (key, label, dimension, speaker), in Table 3 then Table 12 order
SCORES = (
    ("TC", "TC", "task_completion", ""),
    ("P", "P", "personalization", ""),
    ("NatA", "Nat. (A)", "naturalness", "assistant"),
    ("CohA", "Coh. (A)", "coherence", "assistant"),
    ("NatU", "Nat. (U)", "naturalness", "user"),
    ("CohU", "Coh. (U)", "coherence", "user"),
)


def write_html(report: Report, figures: Sequence[Path], path: Path, *, dialogues: int) -> Path:
    """Write report.html for `report`, embedding `figures` and up to `dialogues` dialogues."""
    tables = [
        report.table3,
        report.endings,
        report.cut_replies,
        report.thinking,
        report.stopped,
        *report.table4,
        report.table12,
        report.table13,
        report.by_domain,
        *([report.by_turn] if report.by_turn is not None else []),
        report.parse_failures,
        *(t for tables in report.checks() for t in tables),
        *(report.panel.all if report.panel is not None else ()),
        *((report.noise,) if report.noise is not None else ()),
    ]
    browse = browsable(report.run_dirs, dialogues, report.bootstrap.seed)
    return render_page(
        TEMPLATES,
        "report.html",
        path,
        run_dirs=[str(d) for d in report.run_dirs],
        bootstrap=report.bootstrap,
        unparsed=report.unparsed,
        out_of_range=report.out_of_range,
        judged=report.judged,
        tables=[table_view(t) for t in tables],
        figures=[figure_view(f) for f in figures],
        shown=len(browse.dialogues),
        total=browse.total,
        dialogues_json=script_json(browse.dialogues),
        scores_json=script_json(
            [{"key": k, "label": label, "dimension": dim, "speaker": spk} for k, label, dim, spk in SCORES]
        ),
    )
