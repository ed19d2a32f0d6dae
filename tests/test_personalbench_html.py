"""PersonalBench's report.html in a real headless Chromium (as tests/test_report_html.py does): the
page loads from file:// without fetching anything or logging an error, its tables hold the cells
the metrics computed, filters show the expected pairs, and a pair opens with its attributes,
relevance decisions, both responses and the judge's and annotators' ratings.

The run is hand-made Parquet in the pipeline's own tables, so no model is needed."""

from __future__ import annotations

import pytest
from test_report_html import NASTY, browser, open_page  # noqa: F401  (browser is a fixture)

from personalens.personalbench import report as pb_report
from personalens.personalbench.page import write_html
from personalens.personalbench.sheets import Annotations
from personalens.personalbench.stage import Shard
from personalens.tables import render
from personalens.tables.stats import Bootstrap

BOOT = Bootstrap(resamples=50, seed=0)
METHODS = ("llm", "bm25", "embedding")
# user -> attributes: (id, statement, category, evidence_ok, sensitive, kept)
ATTRIBUTES = {
    "u1": [
        ("a1", "Keeps a vegetarian diet.", "preferences", True, False, True),
        ("a2", "Is grieving a parent.", "states_and_experiences", False, True, True),
        ("a3", "Likes tea.", "preferences", True, False, False),
    ],
    "u2": [
        ("b1", "Lives in Oslo.", "background", True, False, True),
        ("b2", "Plans a marathon.", "plans", True, False, True),
    ],
}
# (user, prompt id, sensitive prompt, personalized shown first, judge score as shown)
PAIRS = [
    ("u1", "p1", False, True, 2),
    ("u1", "p2", True, False, 4),
    ("u2", "p1", False, False, 3),
    ("u2", "p3", False, True, 1),
]


def selected(method: str, user: str, prompt: str, attribute: str) -> bool:
    return (sum(map(ord, method + user + prompt + attribute)) % 3) != 0  # a fixed, mixed pattern


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("pb") / "personalbench"
    shard = Shard(out)
    shard.writer("extractions").write(
        [
            {
                "user_id": u,
                "model": "tiny",
                "text": "{}",
                "parsed": True,
                "completion_tokens": 9,
                "attributes": [
                    {
                        "attribute_id": a,
                        "statement": s,
                        "category": c,
                        "confidence": 0.8,
                        "turn_identifier": 7,
                        "evidence": f"quote of {a}",
                        "turn_text": f"turn with quote of {a}",
                        "evidence_ok": ok,
                        "sensitive": sens,
                        "kept": kept,
                        "drop_reason": None if kept else "low confidence",
                    }
                    for a, s, c, ok, sens, kept in attrs
                ],
            }
            for u, attrs in ATTRIBUTES.items()
        ]
    )
    shard.writer("pairs").write(
        [
            {
                "user_id": u,
                "prompt_id": p,
                "prompt": f"prompt {p} of {u}",
                "sensitive": sens,
                "conversations": 2,
                "user_turns": 3,
            }
            for u, p, sens, _, _ in PAIRS
        ]
    )
    relevance, responses, preferences = [], [], []
    for u, p, sens, first, score in PAIRS:
        for a, _, _, _, a_sens, kept in ATTRIBUTES[u]:
            if kept:
                relevance += [
                    {
                        "user_id": u,
                        "prompt_id": p,
                        "attribute_id": a,
                        "method": m,
                        "model": m,
                        "selected": selected(m, u, p, a),
                        "score": None if m == "llm" else 0.25,
                        "parsed": True,
                        "text": f"Relevant: reason {a}" if m == "llm" else "",
                        "sensitive": sens or a_sens,
                    }
                    for m in METHODS
                ]
        used = [a for a, *_, kept in ATTRIBUTES[u] if kept and selected("llm", u, p, a)]
        responses += [
            {
                "user_id": u,
                "prompt_id": p,
                "variant": v,
                "attribute_ids": used if v == "personalized" else [],
                "model": "tiny",
                "text": f"{v} reply to {p} of {u}: {NASTY}",
                "completion_tokens": 5,
            }
            for v in ("generic", "personalized")
        ]
        preferences.append(
            {
                "user_id": u,
                "prompt_id": p,
                "personalized_first": first,
                "score": score,
                "rating": 6 - score if first else score,
                "explicit_mention": first,
                "parsed": True,
                "text": f"judge output for {p} of {u}",
                "judge_model": "tiny",
                "sensitive": sens,
            }
        )
    shard.writer("relevance").write(relevance)
    shard.writer("responses").write(responses)
    shard.writer("preferences").write(preferences)

    notes = Annotations()
    notes.labels["attributes"] = {
        "ann1": {"a1": "accept", "a2": "reject", "b1": "accept"},
        "ann2": {"a1": "accept", "a2": "reject", "b2": "uncertain"},
    }
    notes.reasons = [("a2", "missing evidence"), ("a2", "overgeneralization")]
    human = {f"{u}|{p}|{a}": selected("human", u, p, a) for u, p, *_ in PAIRS for a, *_, kept in ATTRIBUTES[u] if kept}
    # the annotators disagree on one item only: it has no majority
    notes.labels["relevance"] = {"ann1": human, "ann2": {**human, "u1|p1|a1": not human["u1|p1|a1"]}}
    notes.labels["preference"] = {"ann1": {"u1|p1": 1, "u1|p2": 4, "u2|p1": 3}, "ann2": {"u1|p1": 2, "u2|p3": 2}}
    items = pb_report.run_items(out)
    tables = pb_report.score(items, notes, BOOT).tables
    files = pb_report.write(tables, out / "report")
    page = write_html(
        out, tables, [f for f in files if f.suffix == ".png"], notes, out / "report" / "report.html", bootstrap=BOOT
    )
    return page, tables


def cells(page, table: str) -> list[list[str]]:
    return page.eval_on_selector_all(
        f'table[data-name="{table}"] tbody tr',
        """rows => rows.map(r =>
        [...r.cells].map(c => c.innerText.replace(/\\s+/g, ' ').trim()))""",
    )


def shown(page) -> list[tuple[str, str]]:
    return [
        tuple(r)
        for r in page.eval_on_selector_all(
            "#pair-list tbody tr", "rows => rows.map(r => [r.cells[1].textContent, r.cells[2].textContent])"
        )
    ]


def test_personalbench_page_in_headless_chromium(run, browser, tmp_path):  # noqa: F811
    path, tables = run
    html = path.read_text()
    assert html.count('src="data:image/png;base64,') == 1 and NASTY not in html
    page, errors, requests = open_page(browser, path)
    console = []
    page.on("console", lambda m: console.append(m.text) if m.type == "error" else None)
    page.reload()
    assert [u for u in requests if not u.startswith(("file:", "data:"))] == []

    # every table holds the metrics' cells, all / sensitive / rest with their intervals
    for table in tables:
        expected = [
            [*labels, *(render.cell_text(c, col) for c, col in zip(row, table.columns))] for labels, row in table.rows
        ]
        assert cells(page, table.name) == expected, table.name
    relevance = tables[1]
    assert {labels[0] for labels, _ in relevance.rows} >= set(METHODS)
    f1 = relevance.cell(("embedding", "F1"), "all")
    items = sum(kept for u, *_ in PAIRS for *_, kept in ATTRIBUTES[u])
    assert f1.n == items - 1 and 0 < relevance.cell(("humans", "human selection rate"), "all").mean < 1
    assert min(page.eval_on_selector_all("#figures img", "imgs => imgs.map(i => i.naturalWidth)")) > 100

    # the pairs list and its filters
    assert page.text_content("#pair-count") == "4 of 4"
    assert page.eval_on_selector_all("#pair-list thead th", "hs => hs.map(h => h.textContent)")[5:8] == [
        f"selected: {m}" for m in METHODS
    ]
    page.select_option("#f-user", "u2")
    assert shown(page) == [("u2", "p1"), ("u2", "p3")]
    page.select_option("#f-user", "")
    page.select_option("#f-context", "sensitive")
    assert shown(page) == [("u1", "p2")]
    page.select_option("#f-context", "")
    page.select_option("#f-rating", "5")  # u2/p3: score 1 with the personalized response shown first
    assert shown(page) == [("u2", "p3")]
    page.select_option("#f-rating", "")

    # one pair: attributes with evidence and labels, each method's decision, responses, ratings
    page.click("#pair-list tbody tr >> nth=0")  # u1 / p1
    view = page.inner_text("#pair-view")
    assert "prompt p1 of u1" in view and "Keeps a vegetarian diet." in view and "“quote of a1” (turn 7)" in view
    assert "not in turn" in view and "no: low confidence" in view  # a2's evidence check, a3 dropped
    assert "ann1: reject, ann2: reject (reasons: missing evidence, overgeneralization)" in view
    decisions = page.eval_on_selector_all(
        "#pair-view table.attributes tr",
        """rows => rows.slice(1).map(r =>
        [...r.cells].slice(7, 10).map(c => c.textContent.trim()))""",
    )
    for (a, *_, kept), row in zip(ATTRIBUTES["u1"], decisions):
        if kept:
            assert row == [
                ("yes" if selected(m, "u1", "p1", a) else "no") + ("" if m == "llm" else " 0.250") for m in METHODS
            ]
    assert f"generic reply to p1 of u1: {NASTY}" in view and f"personalized reply to p1 of u1: {NASTY}" in view
    ratings = page.eval_on_selector_all(
        "#pair-view table.ratings tr",
        """rows => rows.slice(1).map(r =>
        [r.cells[0].textContent, r.cells[1].textContent])""",
    )
    # shown first: the annotators' A/B scores 1 and 2 are ratings 5 and 4 of the personalized response
    assert ratings == [["judge", "4"], ["ann1", "5"], ["ann2", "4"]]
    assert "judge output for p1 of u1" in view and "personalized shown as A" in view
    assert errors == [] and console == []
    page.close()


def test_the_browser_holds_a_seeded_sample_of_large_runs(run, tmp_path):
    path, tables = run
    out = path.parent.parent
    pages = [
        write_html(out, tables, [], Annotations(), tmp_path / f"{k}.html", bootstrap=BOOT, items=2).read_text()
        for k in range(2)
    ]
    assert pages[0] == pages[1] and "A seeded sample of 2 of the run's 4 (user, prompt) pairs" in pages[0]
