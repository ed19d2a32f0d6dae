"""report.html in a real headless Chromium (Debian's `chromium`, driven by Playwright): the page loads
from file:// without fetching anything, its tables match the report's, filters show the expected
rows, and a dialogue opens with its turns and the judge's scores and explanations."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from run_rows import judgment_row
from test_report import judge_all, make_dialogue, write_run

from personalens.report import ReportError, build_report
from personalens.tables import render

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
NASTY = "</script><b>bold?</b> & <!-- not a comment"

# (model, setting, kind, domains, TC, P) per dialogue
SPEC = [
    ("m1", "base", "SD", ["Movies"], 1.0, 3.0),
    ("m1", "base", "SD", ["Alarm"], 0.0, 2.0),
    ("m1", "base", "MD", ["Movies", "Hotels"], 1.0, 3.0),
    ("m1", "base+D", "SD", ["Movies"], 1.0, 4.0),
    ("m1", "base+D", "MD", ["Books", "Hotels"], 0.0, None),
    ("m2", "base", "SD", ["Books"], 1.0, 3.0),
    ("m2", "base", "MD", ["Movies", "Books"], 0.0, 1.0),
    ("m2", "base", "MD", ["Alarm", "Music"], 1.0, 3.0),
]


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (Debian: apt-get install chromium); .ci/run installs it")
    sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
    with sync_api.sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")),
            executable_path=CHROMIUM,
            headless=True,
            args=FLAGS,
            viewport={"width": 1280, "height": 1300},
        )
        yield context
        context.close()


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("html")
    dialogues, judgments = [], []
    for i, (model, setting, kind, domains, tc, p) in enumerate(SPEC):
        d = make_dialogue(i, kind, domains, model=model, setting=setting)
        d["turns"][1]["text"] = f"reply of dialogue {i}: {NASTY}"
        dialogues.append(d)
        judgments += judge_all(d, tc, p) + [judgment_row(d, "personalization", 2.0, turn=1)]
    for j in judgments:
        j["judge_text"] = f"explanation of {j['dimension']}/{j['speaker']} for {j['user_id']}"
    run = write_run(tmp / "run", dialogues, judgments)
    return build_report([run], tmp / "out", bootstrap=50), dialogues


def open_page(browser, path: Path):
    page = browser.new_page()
    errors, requests = [], []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("request", lambda r: requests.append(r.url))
    page.goto(path.as_uri())
    return page, errors, requests


def shown_tasks(page) -> set[str]:
    return set(page.eval_on_selector_all("#dialogue-list tbody tr", "rows => rows.map(r => r.cells[6].textContent)"))


def test_report_html_is_one_self_contained_file(report):
    result, dialogues = report
    html = (result.out_dir / "report.html").read_text()
    assert result.out_dir / "report.html" in result.files
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", html)  # nothing from a server or CDN
    assert html.count('src="data:image/png;base64,') == 2  # Figures 4 and 5, inline
    assert NASTY not in html  # dialogue text is escaped inside the inline JSON


def test_filters_rows_and_dialogue_view_in_headless_chromium(report, browser, tmp_path):
    result, dialogues = report
    page, errors, requests = open_page(browser, result.out_dir / "report.html")
    assert [u for u in requests if not u.startswith(("file:", "data:"))] == []
    assert page.text_content("#dialogue-count") == f"{len(SPEC)} of {len(SPEC)}"
    # the page's Table 3 holds the report's cells
    table3 = result.table3
    first_row = page.eval_on_selector_all(
        'table[data-name="table3"] tbody tr:first-child td',
        "cells => cells.map(c => c.innerText.replace(/\\s+/g, ' ').trim())",
    )
    labels, cells = table3.rows[0]
    assert first_row == [*labels, *(render.cell_text(c, col) for c, col in zip(cells, table3.columns))]
    assert min(page.eval_on_selector_all("#figures img", "imgs => imgs.map(i => i.naturalWidth)")) > 100

    # filter: MD dialogues of domain Movies
    page.select_option("#f-kind", "MD")
    page.select_option("#f-domain", "Movies")
    expected = {d["task_id"] for d, s in zip(dialogues, SPEC) if s[2] == "MD" and "Movies" in s[3]}
    assert shown_tasks(page) == expected and len(expected) == 2
    # filter: prompt setting base+D, any kind or domain, and a score
    page.select_option("#f-kind", "")
    page.select_option("#f-domain", "")
    page.select_option("#f-setting", "base+D")
    assert shown_tasks(page) == {d["task_id"] for d, s in zip(dialogues, SPEC) if s[1] == "base+D"}
    page.select_option("#f-setting", "")
    page.select_option("#f-metric", "P")
    page.select_option("#f-score", "3")
    assert shown_tasks(page) == {d["task_id"] for d, s in zip(dialogues, SPEC) if s[5] == 3.0}
    page.select_option("#f-score", "unparsed")
    assert shown_tasks(page) == {d["task_id"] for d, s in zip(dialogues, SPEC) if s[5] is None}
    page.select_option("#f-metric", "TC")
    page.select_option("#f-score", "0")
    page.select_option("#f-model", "m2")
    expected = [d for d, s in zip(dialogues, SPEC) if s[0] == "m2" and s[4] == 0.0]
    assert shown_tasks(page) == {d["task_id"] for d in expected}

    # open a dialogue: its turns (escaped text, shown verbatim), scores and explanations
    page.click("#dialogue-list tbody tr >> nth=0")
    view = page.inner_text("#dialogue-view")
    d = expected[0]
    assert page.is_visible("#dialogue-view")
    assert all(t["text"] in view for t in d["turns"]) and NASTY in view
    assert f"explanation of personalization/ for {d['user_id']}" in view
    assert "P after this turn: 2" in view
    judged = page.eval_on_selector_all(
        "#dialogue-view table.judgments tr",
        "rows => rows.slice(1).map(r => [r.cells[0].textContent, r.cells[1].textContent])",
    )
    assert judged[:2] == [["task_completion", "0"], ["personalization", "1"]]
    assert errors == []
    page.eval_on_selector("#dialogues", "el => el.scrollIntoView()")
    shot = page.screenshot(path=str(tmp_path / "report-html.png"))
    assert shot[:8] == b"\x89PNG\r\n\x1a\n"
    page.close()


def test_the_browser_holds_a_seeded_sample_of_large_runs(report, tmp_path):
    result, dialogues = report
    pages = []
    for name in ("a", "b"):
        build_report(result.run_dirs, tmp_path / name, bootstrap=10, html_dialogues=3)
        pages.append((tmp_path / name / "report.html").read_text())
    data = [json.loads(re.search(r'id="dialogue-data">(.*?)</script>', p, re.S).group(1)) for p in pages]
    assert len(data[0]) == 3 and data[0] == data[1]  # the same seed, the same sample
    assert {d["task"] for d in data[0]} < {d["task_id"] for d in dialogues}
    assert f"A seeded sample of 3 of the runs' {len(dialogues)} dialogues" in pages[0]
    with pytest.raises(ReportError, match="html_dialogues"):
        build_report(result.run_dirs, tmp_path / "c", html_dialogues=-1)
