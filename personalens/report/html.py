"""Self-contained HTML report pages: every table, the figures (inline PNG) and a browser of the model
outputs (inline JSON and script), rendered from templates/ on the shared frame base.html. Nothing is
fetched when a page opens, so a run directory copied off a cluster can be read anywhere with a browser.

report.html (PersonaLens) is written here; PersonalBench's page (report/personalbench.py) reuses
`render_page`, `table_view`, `figure_view` and `script_json`."""

from __future__ import annotations

import base64
import itertools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import jinja2

from personalens.report import render
from personalens.report.browse import browsable
from personalens.report.tables import Table

if TYPE_CHECKING:
    from personalens.report.build import Report

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
        *report.table4,
        report.table12,
        report.table13,
        report.by_domain,
        *([report.by_turn] if report.by_turn is not None else []),
        report.parse_failures,
    ]
    browse = browsable(report.run_dirs, dialogues, report.bootstrap.seed)
    return render_page(
        "report.html",
        path,
        run_dirs=[str(d) for d in report.run_dirs],
        bootstrap=report.bootstrap,
        unparsed=report.unparsed,
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


def render_page(template: str, path: Path, **context: object) -> Path:
    """Render templates/`template` with `context` into `path`."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    path.write_text(env.get_template(template).render(**context), encoding="utf-8")
    return path


def figure_view(path: Path) -> dict:
    """A PNG figure as its name and an inline data URL."""
    return {"name": path.stem, "src": "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode()}


def table_view(table: Table) -> dict:
    """A table as header spans, labels and cell texts (the Markdown report's, split after the mean)."""
    spans = [(group, len(list(cols))) for group, cols in itertools.groupby(table.columns, key=lambda c: c.group)]
    return {
        "name": table.name,
        "title": table.title,
        "notes": table.notes,
        "spans": spans if any(g for g, _ in spans) else [],
        "row_header": table.row_header,
        "labels": [c.label for c in table.columns],
        "rows": [
            (labels, [_split(render.cell_text(c, col)) for c, col in zip(cells, table.columns)])
            for labels, cells in table.rows
        ],
    }


def _split(text: str) -> tuple[str, str]:
    """The mean, and its interval and counts for a second, smaller line: wide tables stay on screen."""
    mean, _, rest = text.partition(" ")
    return mean, rest


def script_json(value: object) -> str:
    # inside <script>, "</script>" or "<!--" in a dialogue would end the element: escape every "<"
    return json.dumps(value, ensure_ascii=False).replace("<", "\\u003c")
