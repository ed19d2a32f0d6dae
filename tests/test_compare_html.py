"""compare.html in a real headless Chromium (Debian's `chromium`, driven by Playwright), as
tests/test_report_html.py tests report.html: the page loads from file:// without fetching anything,
its tables hold the comparison's cells, exactly the significant differences are marked, the forest
plot is drawn, and an accepted difference is stated in the heading."""

from __future__ import annotations

import re

import pytest
from test_compare import make_run, scenario
from test_report_html import browser, open_page  # noqa: F401 (the module's browser fixture)

from personalens.compare import build_comparison
from personalens.tables import render

USERS = 20


@pytest.fixture(scope="module")
def comparison(tmp_path_factory):
    """20 users with 3 tasks each: B's P is one point higher on one of the three tasks of half the
    users and on two of the others' (a clear difference, 0.5), its TC the same as A's; B was made
    under another protocol, accepted by name."""
    tmp = tmp_path_factory.mktemp("compare-html")
    rows_a, rows_b = [], []
    for u in range(USERS):
        for k in range(3):
            task = 3 * u + k
            tc, p = float((u + k) % 2), 2.0 + (u % 2)
            rows_a.append((scenario(f"u{u}", task), tc, p))
            rows_b.append((scenario(f"u{u}", task, model="m2"), tc, p + (k <= u % 2)))
    a = make_run(tmp / "a", rows_a)
    b = make_run(tmp / "b", rows_b, "protocol.max_rounds_sd=5")
    return build_comparison([a, b], tmp / "out", bootstrap=2000, allow=["protocol"])


def test_compare_html_is_one_self_contained_file(comparison):
    html = (comparison.out_dir / "compare.html").read_text()
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", html)
    assert html.count('src="data:image/png;base64,') == 1
    # the power section: one table per comparison, after the comparisons
    assert html.count('<table class="power-table">') == 1 and html.index('id="power"') > html.index('id="comparisons"')


def test_page_shows_the_comparison_and_marks_significant_differences(comparison, browser, tmp_path):  # noqa: F811
    (c,) = comparison.comparisons
    page, errors, requests = open_page(browser, comparison.out_dir / "compare.html")
    assert [u for u in requests if not u.startswith(("file:", "data:"))] == []
    # the accepted difference is in the heading, before the tables
    assert page.is_visible("#accepted")
    assert "Compared despite a difference" in page.inner_text(
        "#accepted"
    ) and "max_rounds_sd: 3 vs 5" in page.inner_text("#accepted")
    # the table holds the comparison's cells
    table = comparison.tables[0]
    shown = page.eval_on_selector_all(
        'table.compare-table[data-index="1"] tbody tr',
        "rows => rows.map(r => Array.from(r.cells).map(c => c.innerText.replace(/\\s+/g, ' ').trim()))",
    )
    expected = [
        [*labels, *(render.cell_text(x, col) for x, col in zip(cells, table.columns))] for labels, cells in table.rows
    ]
    assert shown == expected
    # exactly the rows with Holm p < 0.05 have their difference cell marked: P of SD, not TC
    marked = page.eval_on_selector_all(
        'table.compare-table[data-index="1"] td.significant',
        "cells => cells.map(c => c.parentElement.cells[1].textContent)",
    )
    significant = [r.name for r in c.rows if r.significant(comparison.alpha)]
    assert marked == significant and "P" in significant and "TCR (%)" not in significant
    p = next(r for r in c.rows if r.kind == "SD" and r.name == "P")
    assert p.difference.mean == pytest.approx(0.5) and p.p_holm < 0.05 and p.users == USERS
    assert page.eval_on_selector("#forest img", "img => img.naturalWidth") > 500
    assert errors == []
    shot = page.screenshot(path=str(tmp_path / "compare-html.png"), full_page=True)
    assert shot[:8] == b"\x89PNG\r\n\x1a\n"
    page.close()
