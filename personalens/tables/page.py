"""Self-contained HTML pages: tables, inline PNG figures and inline JSON for a page's own browser,
rendered from a pipeline's template on the shared frame in templates/ (base.html, macros.html,
common.js). Nothing is fetched when a page opens, so an output folder copied off a cluster can be
read anywhere with a browser."""

from __future__ import annotations

import base64
import itertools
import json
from pathlib import Path

import jinja2

from personalens.tables import render
from personalens.tables.model import Table

FRAME = Path(__file__).parent / "templates"


def render_page(templates: Path, template: str, path: Path, **context: object) -> Path:
    """Render `templates`/`template` (which may extend the shared frame) with `context` into `path`."""
    loader = jinja2.ChoiceLoader([jinja2.FileSystemLoader(templates), jinja2.FileSystemLoader(FRAME)])
    env = jinja2.Environment(
        loader=loader, autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True
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
