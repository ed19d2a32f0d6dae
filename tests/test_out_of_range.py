"""Out-of-range judge scores (docs/fidelity.md, row 15) through the `judge` and `report` commands,
with an engine that ignores the grammar and returns given raw texts, as an endpoint without
structured output does: `official` keeps them in the means as the released code does and counts
them apart, `paper` leaves them out as unparsed."""

from __future__ import annotations

import csv
import re
from pathlib import Path
from statistics import mean

import pytest
from cli_helpers import read_rows
from test_fidelity import PromptRecorder, config

from personalens.engines.base import Generation
from personalens.judge import command as judge_command
from personalens.judge.formats import formats_named
from personalens.report import command as report_command
from personalens.simulate import command as simulate_command

# Raw judge outputs per dimension (keyed by a label its grammar holds under both options), used in
# turn; each holds the same number for the release's regex and for the paper option's parser.
RAW = {
    "Personalization Score": [
        "<response>\nPersonalization Score: 5\nKey Observations:\n- a\n</response>",
        "<response>\nPersonalization Score: 3\nJustification: fine\n</response>",
        "<response>\nPersonalization Score: 0\nJustification: none\n</response>",
    ],
    "Naturalness Score": [
        "<response>\nNaturalness Score: 0\n</response>",
        "Naturalness Score: 4",
        "**Naturalness Score: 6**",
    ],
    "Coherence Score": [
        "<response>\nCoherence Score: 7\nJustification: j\n</response>",
        "<response>\nCoherence Score: 4\nJustification: j\n</response>",
        "Coherence Score: 10",
    ],
    "EXPLANATION": ["VERDICT: True\nEXPLANATION: done", "VERDICT: False\nEXPLANATION: not done"],
}
SCALE = {"personalization": (1, 4), "naturalness": (1, 5), "coherence": (1, 5)}


class RawTexts:
    """Answers each judge request with the next raw text of its dimension, whatever the grammar."""

    name = "raw"

    def __init__(self):
        self.served = {key: 0 for key in RAW}

    def generate(self, requests, on_finished=None):
        out = []
        for r in requests:
            key = next(k for k in RAW if k in r.grammar)
            texts = RAW[key]
            out.append(Generation(texts[self.served[key] % len(texts)], prompt_tokens=10, completion_tokens=5))
            self.served[key] += 1
        return out


def raw_value(text: str) -> float:
    if text.startswith("VERDICT"):
        return float("True" in text.split("\n")[0])
    return float(re.search(r"Score: (\d+)", text)[1])


def csv_rows(path: Path) -> list[dict]:
    with open(path) as f:
        return list(csv.DictReader(f))


def judge_and_report(tmp_path: Path, fidelity: str):
    out = tmp_path / fidelity
    cfg = config(f"run.out_dir={out}", f"fidelity={fidelity}")
    recorder = PromptRecorder()
    assert simulate_command.generate(cfg, lambda: {"user_agent": recorder, "assistant": recorder}) == 0
    assert judge_command.judge(cfg, lambda: {"judge": RawTexts()}) == 0
    assert report_command.report(cfg) == 0
    judgments = read_rows(out / "judgments")
    (table3,) = [r for r in csv_rows(out / "report" / "table3.csv") if not r["assistant_model"].endswith("(paper)")]
    failures = {r["dimension"]: r for r in csv_rows(out / "report" / "parse_failures.csv")}
    pages = (out / "report" / "report.md").read_text() + (out / "report" / "report.html").read_text()
    return judgments, table3, failures, pages


def whole(judgments, kind: str, dimension: str, speaker: str = "") -> list[dict]:
    return [
        j
        for j in judgments
        if j["kind"] == kind and j["dimension"] == dimension and j["speaker"] == speaker and j["turn"] == -1
    ]


# Table 3's columns and the parse-failure table's row for each dimension
COLUMNS = {
    "P": ("personalization", "", "personalization"),
    "Nat": ("naturalness", "assistant", "naturalness (assistant)"),
    "Coh": ("coherence", "assistant", "coherence (assistant)"),
}


@pytest.mark.parametrize("fidelity", ["official", "paper"])
def test_out_of_range_scores_in_table3_and_the_parse_failure_counts(tmp_path, fidelity):
    judgments, table3, failures, pages = judge_and_report(tmp_path, fidelity)
    kept = fidelity == "official"
    off_scale_total = 0
    for kind in ("SD", "MD"):
        for column, (dimension, speaker, row) in COLUMNS.items():
            js = whole(judgments, kind, dimension, speaker)
            raw = [raw_value(j["judge_text"]) for j in js]
            lo, hi = SCALE[dimension]
            off_scale = [v for v in raw if not lo <= v <= hi]
            assert js and off_scale, f"the test needs out-of-range {kind} {dimension} scores"
            off_scale_total += len(off_scale)
            # stored: the release's number, parsed, under official; unparsed under paper
            for j, v in zip(js, raw):
                in_range = lo <= v <= hi
                assert (j["parsed"], j["score"]) == ((True, v) if kept or in_range else (False, None))
            # Table 3: the mean over what is kept, the rest counted on the cell
            expected = raw if kept else [v for v in raw if lo <= v <= hi]
            cell = table3[f"{kind}_{column}_mean"]
            assert (float(cell) == pytest.approx(mean(expected))) if expected else cell == ""
            assert int(table3[f"{kind}_{column}_n"]) == len(expected)
            assert int(table3[f"{kind}_{column}_unparsed"]) == (0 if kept else len(off_scale))
            # the parse-failure table: unparsed under paper, "out of range, kept" under official
            counts = failures[row]
            assert int(counts[f"{kind}_unparsed"]) == (0 if kept else len(off_scale))
            assert int(counts[f"{kind}_out_of_range"]) == (len(off_scale) if kept else 0)
            assert int(counts[f"{kind}_judged"]) == len(js)
        # task completion has no scale to leave: the same rate under both options
        tc = [raw_value(j["judge_text"]) for j in whole(judgments, kind, "task_completion")]
        assert float(table3[f"{kind}_TCR_mean"]) == pytest.approx(100 * mean(tc))
        assert int(failures["task_completion"][f"{kind}_out_of_range"]) == 0
    if kept:
        total = off_scale_total + _user_speaker_off_scale(judgments)
        assert pages.count(f"Out-of-range scores: {total}**") == 1  # report.md
        assert pages.count(f"Out-of-range scores: {total}</strong>") == 1  # report.html
    else:
        assert "Out-of-range scores:" not in pages
        assert f"**Unparsed judgments: {off_scale_total + _user_speaker_off_scale(judgments)} of" in pages


def _user_speaker_off_scale(judgments) -> int:
    """Out-of-range scores of the judgments Table 3 does not show (the user agent's Nat. and Coh.)."""
    return sum(
        not SCALE[j["dimension"]][0] <= raw_value(j["judge_text"]) <= SCALE[j["dimension"]][1]
        for j in judgments
        if j["speaker"] == "user"
    )


@pytest.mark.parametrize(
    ("text", "official", "paper"),
    [
        ("Coherence Score: 7", 7.0, None),
        ("Coherence Score: 0", 0.0, None),
        ("Coherence Score: 5", 5.0, 5.0),
        ("Coherence Score: 3.5", 3.0, None),  # the release's (\d+) reads the 3
        ("coherence score: 4", None, 4.0),  # the release's regex is case-sensitive
    ],
)
def test_official_keeps_a_whole_number_off_the_scale_and_paper_does_not(text, official, paper):
    for name, expected in (("official", official), ("paper", paper)):
        verdict = formats_named(name, 800)["coherence"].parse(text)
        assert (verdict.parsed, verdict.score) == (expected is not None, expected)
