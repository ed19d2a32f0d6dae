"""report.html: one self-contained page with every table, the figures (inline PNG) and a dialogue
browser (inline JSON and script), rendered from templates/report.html. Nothing is fetched when the
page opens, so a run directory copied off a cluster can be read anywhere with a browser."""

from __future__ import annotations

import base64
import itertools
import json
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import jinja2

from personalens.report import render
from personalens.report.browse import browsable
from personalens.report.tables import Table

if TYPE_CHECKING:
    from personalens.report.build import Report

TEMPLATES = Path(__file__).parent / "templates"
# the browser's score columns: (key, label, dimension, speaker), in Table 3 then Table 12 order
SCORES = (("TC", "TC", "task_completion", ""), ("P", "P", "personalization", ""),
          ("NatA", "Nat. (A)", "naturalness", "assistant"), ("CohA", "Coh. (A)", "coherence", "assistant"),
          ("NatU", "Nat. (U)", "naturalness", "user"), ("CohU", "Coh. (U)", "coherence", "user"))


def write_html(report: Report, figures: Sequence[Path], path: Path, *, dialogues: int) -> Path:
    """Write report.html for `report`, embedding `figures` and up to `dialogues` dialogues."""
    tables = [report.table3, *report.table4, report.table12, report.table13, report.by_domain,
              *([report.by_turn] if report.by_turn is not None else []), report.parse_failures]
    browse = browsable(report.run_dirs, dialogues, report.bootstrap.seed)
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    page = env.get_template("report.html").render(
        run_dirs=[str(d) for d in report.run_dirs], bootstrap=report.bootstrap,
        unparsed=report.unparsed, judged=report.judged, tables=[table_view(t) for t in tables],
        figures=[{"name": f.stem, "src": "data:image/png;base64," + base64.b64encode(f.read_bytes()).decode()}
                 for f in figures],
        shown=len(browse.dialogues), total=browse.total, dialogues_json=_script_json(browse.dialogues),
        scores_json=_script_json([{"key": k, "label": label, "dimension": dim, "speaker": spk}
                                  for k, label, dim, spk in SCORES]))
    path.write_text(page, encoding="utf-8")
    return path


def table_view(table: Table) -> dict:
    """A table as header spans, labels and cell texts (the Markdown report's, split after the mean)."""
    spans = [(group, len(list(cols))) for group, cols in itertools.groupby(table.columns, key=lambda c: c.group)]
    return {"name": table.name, "title": table.title, "notes": table.notes,
            "spans": spans if any(g for g, _ in spans) else [], "row_header": table.row_header,
            "labels": [c.label for c in table.columns],
            "rows": [(labels, [_split(render.cell_text(c, col)) for c, col in zip(cells, table.columns)])
                     for labels, cells in table.rows]}


def _split(text: str) -> tuple[str, str]:
    """The mean, and its interval and counts for a second, smaller line: wide tables stay on screen."""
    mean, _, rest = text.partition(" ")
    return mean, rest


def _script_json(value: object) -> str:
    # inside <script>, "</script>" or "<!--" in a dialogue would end the element: escape every "<"
    return json.dumps(value, ensure_ascii=False).replace("<", "\\u003c")
