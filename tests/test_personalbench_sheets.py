"""PersonalBench without a model: reading filled annotation sheets, the score tables' breakdown into
sensitive contexts and the rest, and the refusal to resume a run under a changed configuration."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from personalbench_helpers import config

from personalens.errors import PersonalensError
from personalens.personalbench import command
from personalens.personalbench.metrics import preference
from personalens.personalbench.report import RunItems, score
from personalens.personalbench.sheets import Annotations, load_annotations
from personalens.tables.stats import Bootstrap

BOOT = Bootstrap(resamples=50, seed=0)


def _sheet(path: Path, header: list[str], rows: list[list[str]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows([header, *rows])


def test_filled_sheets_are_read_per_annotator(tmp_path):
    _sheet(
        tmp_path / "ann1" / "attributes.csv",
        ["item_id", "statement", "label", "reason"],
        [["a0", "x", "accept", ""], ["a1", "y", "Reject", "overgeneralization"], ["a2", "z", "", ""]],
    )
    _sheet(tmp_path / "ann1" / "relevance.csv", ["item_id", "label"], [["r0", "relevant"], ["r1", "not relevant"]])
    _sheet(tmp_path / "ann2" / "preference.csv", ["item_id", "rating"], [["p0", "4"], ["p1", " 2 "]])
    notes = load_annotations(tmp_path)
    assert notes.annotators() == ["ann1", "ann2"]
    assert notes.labels["attributes"] == {"ann1": {"a0": "accept", "a1": "reject"}}
    assert notes.reasons == [("a1", "overgeneralization")] and notes.blank == 1
    assert notes.labels["relevance"] == {"ann1": {"r0": True, "r1": False}}
    assert notes.labels["preference"] == {"ann2": {"p0": 4, "p1": 2}}


@pytest.mark.parametrize(
    "stage, header, row, message",
    [
        ("relevance", ["item_id", "label"], ["r0", "maybe"], "line 2: label 'maybe'"),
        ("preference", ["item_id", "rating"], ["p0", "6"], "line 2: rating '6'"),
        ("attributes", ["item_id", "label", "reason"], ["a0", "reject", "lazy"], "line 2: reason 'lazy'"),
        ("relevance", ["item_id", "answer"], ["r0", "relevant"], "missing column"),
    ],
)
def test_bad_sheets_are_clear_errors(tmp_path, stage, header, row, message):
    _sheet(tmp_path / "ann1" / f"{stage}.csv", header, [row])
    with pytest.raises(PersonalensError, match=message) as err:
        load_annotations(tmp_path)
    assert f"{stage}.csv" in str(err.value)


def _run() -> RunItems:
    return RunItems(
        model="m",
        attributes={"a0": True, "a1": False, "a2": False},
        evidence_ok={"a0": True, "a1": False, "a2": True},
        selections={"llm": {"r0": True, "r1": True, "r2": False}, "bm25": {"r0": False, "r1": True, "r2": True}},
        relevance_sensitive={"r0": True, "r1": False, "r2": False},
        judge={"p0": 5, "p1": 4, "p2": 2},
        mentions={"p0": True, "p1": False, "p2": False},
        personalized_first={"p0": True, "p1": False, "p2": True},
        preference_sensitive={"p0": True, "p1": False, "p2": False},
        unparsed={},
    )


def test_score_breaks_every_metric_down_into_sensitive_and_rest_and_counts_unmatched():
    notes = Annotations()
    notes.labels["attributes"] = {
        "h1": {"a0": "accept", "a1": "reject", "zz": "accept"},
        "h2": {"a0": "accept", "a1": "accept", "a2": "reject"},
    }
    notes.labels["relevance"] = {
        "h1": {"r0": True, "r1": False, "r2": True},
        "h2": {"r0": True, "r1": False, "r2": True},
    }
    # as shown: 1 = A much better; p0 and p2 show the personalized response as A
    notes.labels["preference"] = {"h1": {"p0": 1, "p1": 4, "p2": 3}, "h2": {"p0": 2, "p1": 5, "p2": 4, "nope": 3}}
    scores = score(_run(), notes, BOOT)
    assert scores.unmatched == {"attributes": 1, "relevance": 0, "preference": 1}
    extraction, relevance, pref = scores.tables
    # a0 (sensitive): accepted by both; a1 ties; a2 has one reject only -> majority reject
    assert extraction.cell(("acceptance rate",), "sensitive").mean == 1.0
    assert extraction.cell(("acceptance rate",), "rest").mean == 0.0
    assert extraction.cell(("acceptance rate",), "all").mean == pytest.approx(1 / 2)
    assert extraction.cell(("evidence check failed",), "rest").mean == pytest.approx(1 / 2)
    assert relevance.cell(("llm", "precision"), "rest").mean == 0.0  # r1 selected, humans say no
    assert relevance.cell(("bm25", "recall"), "all").mean == pytest.approx(1 / 2)
    # personalized-side ratings: p0 5 and 4 (shown first: 6 - score); p1 4 and 5; p2 3 and 2
    expected = preference(
        {"h1": {"p0": 5, "p1": 4, "p2": 3}, "h2": {"p0": 4, "p1": 5, "p2": 2}}, _run().judge, _run().mentions, BOOT
    )
    assert (
        pref.cell(("human preference (1-5)",), "all").mean
        == expected["human preference (1-5)"].mean
        == pytest.approx(23 / 6)
    )
    assert pref.cell(("human preference (1-5)",), "sensitive").mean == pytest.approx(4.5)
    assert pref.cell(("judge inflation",), "rest").mean == pytest.approx(((4 - 4.5) + (2 - 2.5)) / 2)


def test_changed_configuration_is_refused_and_unfingerprinted_settings_are_not(tmp_path):
    # no user passes these filters, so the run needs no model
    base = [f"run.out_dir={tmp_path}", "personalbench.filters.min_conversations=100"]

    def no_model():
        raise AssertionError("no model call expected")

    assert command.run(config(*base), no_model) == 0
    assert command.run(config(*base, "personalbench.bootstrap=10", "personalbench.batch_size=7"), no_model) == 0
    with pytest.raises(PersonalensError, match="different configuration"):
        command.run(config(*base, "personalbench.relevance.bm25_top_k=1"), no_model)
    with pytest.raises(PersonalensError, match="different configuration"):
        command.run(config(*base, "seed=1"), no_model)


def test_generation_settings_may_change_before_anything_was_generated(tmp_path):
    base = [f"run.out_dir={tmp_path}", "personalbench.filters.min_conversations=100"]

    def no_model():
        raise AssertionError("no model call expected")

    assert command.run(config(*base, "personalbench.until=relevance"), no_model) == 0
    assert not (tmp_path / "personalbench" / "personalbench-responses.yaml").exists()
    assert command.run(config(*base, "personalbench.generation.sampling.max_tokens=9"), no_model) == 0
    with pytest.raises(PersonalensError, match="different configuration"):
        command.run(config(*base, "personalbench.generation.sampling.max_tokens=10"), no_model)
    with pytest.raises(PersonalensError, match="personalbench.annotations"):
        command.run(
            config(*base, "personalbench.generation.attributes=human", "personalbench.annotations=null"), no_model
        )
    with pytest.raises(PersonalensError, match="until"):
        command.run(config(*base, "personalbench.until=everything"), no_model)


def test_human_selection_is_the_human_majority_of_relevance(tmp_path):
    for annotator, labels in (
        ("h1", ["relevant", "relevant", "not relevant"]),
        ("h2", ["relevant", "not relevant", "not relevant"]),
        ("h3", ["not relevant", "relevant", "relevant"]),
    ):
        _sheet(
            tmp_path / annotator / "relevance.csv",
            ["item_id", "label"],
            [[f"u1|p1|u1-a{k}", label] for k, label in enumerate(labels)],
        )
    pb = config(f"personalbench.annotations={tmp_path}", "personalbench.generation.attributes=human").personalbench
    assert command.human_selection(pb) == {("u1", "p1", "u1-a0"), ("u1", "p1", "u1-a1")}
    assert command.settings(
        config(f"personalbench.annotations={tmp_path}", "personalbench.generation.attributes=human")
    ).human_selection == command.human_selection(pb)


def test_report_files_are_written_through_the_renderers(tmp_path):
    from personalens.personalbench.report import write

    notes = Annotations()
    notes.labels["relevance"] = {
        "h1": {"r0": True, "r1": False, "r2": False},
        "h2": {"r0": True, "r1": False, "r2": False},
    }
    tables = score(_run(), notes, BOOT).tables
    files = write(tables, tmp_path)
    assert {f.name for f in files} == {
        "selection.png",
        "report.md",
        *(f"{t.name}.{ext}" for t in tables for ext in ("csv", "tex")),
    }
    assert (tmp_path / "selection.png").read_bytes()[:4] == b"\x89PNG"
    with open(tmp_path / "relevance.csv", newline="") as f:
        rows = {(r["method"], r["metric"]): r for r in csv.DictReader(f)}
    assert float(rows[("llm", "selection rate")]["all_mean"]) == pytest.approx(2 / 3)
    assert "\\begin{tabular}" in (tmp_path / "relevance.tex").read_text()
