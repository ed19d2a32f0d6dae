"""`personalens agreement`: export of annotation sheets and Table 5 from filled sheets whose kappas
are known by construction or worked out here from the kappa formulas."""

from __future__ import annotations

import csv
import json
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from agreement_helpers import JUDGED, SECRET, write_sample_run
from cli_helpers import run_cli
from markupsafe import escape

from personalens.agreement import METRICS, AgreementError, export, score_sheets
from personalens.agreement.export import SHEET_COLUMNS
from personalens.data import load_scenarios
from personalens.tables.stats import Bootstrap, bootstrap_statistic, interval, replicates

BOOT = Bootstrap(200, 0)
RANGES = {"task_completion": [0, 1], "personalization": [1, 2, 3, 4]}


def judge_score(i: int, dimension: str, speaker: str) -> float:
    """A judge whose scores vary over dialogues, so that every kappa is defined."""
    values = RANGES.get(dimension, [1, 2, 3, 4, 5])
    return float(values[(i + len(speaker)) % len(values)])


@pytest.fixture
def run(tmp_path, sample_root):
    dialogues = write_sample_run(tmp_path / "run", sample_root, judge_score)
    return tmp_path / "run", dialogues


@pytest.fixture
def scenarios(sample_root):
    """The export's loader: the scenarios of the given users of the sample data."""
    return lambda users: load_scenarios(sample_root, users, "both")


def read_sheet(path: Path) -> list[dict]:
    with open(path, newline="", encoding="utf-8-sig") as f:
        return list(csv.DictReader(f))


def write_sheet(path: Path, rows: list[dict]) -> Path:
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=SHEET_COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    return path


def judge_of(dialogues: list[dict]) -> dict[tuple[str, str], dict[str, int]]:
    """The judge's score per (user, task) and sheet column, as the helper wrote them."""
    columns = {(m.dimension, m.speaker): m.column for m in METRICS}
    return {
        (d["user_id"], d["task_id"]): {columns[(dim, spk)]: int(judge_score(i, dim, spk)) for dim, spk in JUDGED}
        for i, d in enumerate(dialogues)
    }


def filled(sheet: list[dict], scores) -> list[dict]:
    """The blank sheet with `scores(row)` (column -> score) filled into every row."""
    return [{**row, **{c: str(v) for c, v in scores(row).items()}} for row in sheet]


# ---- export -------------------------------------------------------------------------------------


def test_export_is_a_seeded_stratified_sample_without_judge_scores(run, scenarios, tmp_path):
    run_dir, dialogues = run
    done = export(run_dir, scenarios, tmp_path / "a", dialogues=10, seed=3)
    rows = read_sheet(tmp_path / "a" / "sheet.csv")
    assert [int(r["item"]) for r in rows] == list(range(1, 11))
    assert {r["export_id"] for r in rows} == {done.export_id}
    # SD and MD in proportion to the run: 22 SD and 12 MD dialogues -> 10 * 22/34 = 6.5 -> 6 or 7 SD
    kinds = Counter(r["kind"] for r in rows)
    run_kinds = Counter(d["kind"] for d in dialogues)
    assert sum(kinds.values()) == 10 and abs(kinds["SD"] - 10 * run_kinds["SD"] / len(dialogues)) <= 1
    assert len({(r["user_id"], r["task_id"]) for r in rows}) == 10  # without replacement
    assert all(r[m.column] == "" for r in rows for m in METRICS)  # nothing pre-filled
    # the same seed draws the same sample (and id); another seed another one
    again = export(run_dir, scenarios, tmp_path / "b", dialogues=10, seed=3)
    assert again.export_id == done.export_id and read_sheet(tmp_path / "b" / "sheet.csv") == rows
    other = export(run_dir, scenarios, tmp_path / "c", dialogues=10, seed=4)
    assert other.export_id != done.export_id
    # the guide holds every metric's guideline, each dialogue's turns and context, and no judge output
    guide = (tmp_path / "a" / "guide.html").read_text()
    goals = {s.key: s.task.goal for s in scenarios(list(range(6)))}
    assert "Score of 4: EXCEPTIONAL" in guide and "Fully coherent" in guide and "VERDICT" in guide
    for r in rows:
        assert f"assistant turn 3 of {r['user_id']}/{r['task_id']}" in guide
        goal = goals[(r["user_id"], r["task_id"])]
        assert str(escape(goal)) in guide
    assert SECRET not in guide and SECRET not in (tmp_path / "a" / "sheet.csv").read_text()
    assert "<script" not in guide and "http" not in guide  # self-contained
    manifest = json.loads((tmp_path / "a" / "export.json").read_text())
    assert manifest["export_id"] == done.export_id and len(manifest["items"]) == 10


def test_export_refuses_to_overwrite_another_export_and_too_many_dialogues(run, scenarios, tmp_path):
    run_dir, dialogues = run
    export(run_dir, scenarios, tmp_path / "a", dialogues=4, seed=0)
    with pytest.raises(AgreementError, match="belongs to export"):
        export(run_dir, scenarios, tmp_path / "a", dialogues=4, seed=1)
    with pytest.raises(AgreementError, match=f"only {len(dialogues)} dialogues"):
        export(run_dir, scenarios, tmp_path / "b", dialogues=len(dialogues) + 1, seed=0)


def test_small_exports_still_hold_both_kinds(run, scenarios, tmp_path):
    done = export(run[0], scenarios, tmp_path / "a", dialogues=2, seed=0)
    assert sorted(item["kind"] for item in done.items) == ["MD", "SD"]


# ---- score: kappas ------------------------------------------------------------------------------


def test_bootstrap_statistic_of_the_mean_is_the_plain_percentile_interval_over_items():
    values = np.random.default_rng(1).normal(size=40)
    rep = replicates(values, 300, 5)
    assert bootstrap_statistic(lambda idx: values[idx].mean(), 40, 300, 5) == pytest.approx(
        (rep.mean, *interval(rep, expanded=False))
    )
    # an undefined statistic (nan) leaves no interval rather than a wrong one
    value, lo, hi = bootstrap_statistic(lambda idx: float("nan"), 5, 10, 0)
    assert math.isnan(value) and math.isnan(lo) and math.isnan(hi)


def test_annotators_who_agree_with_the_judge_get_kappa_one(run, scenarios, tmp_path):
    run_dir, dialogues = run
    export(run_dir, scenarios, tmp_path / "x", dialogues=12, seed=0)
    sheet = read_sheet(tmp_path / "x" / "sheet.csv")
    judge = judge_of(dialogues)
    paths = [
        write_sheet(tmp_path / f"{name}.csv", filled(sheet, lambda r: judge[(r["user_id"], r["task_id"])]))
        for name in ("ann1", "ann2", "ann3")
    ]
    table = score_sheets(tmp_path / "x", paths, run_dir, BOOT)
    for m in METRICS:
        for column in ("cohen", "fleiss"):
            cell = table.cell((m.label,), column)
            assert cell.mean == pytest.approx(1.0) and cell.lo == pytest.approx(1.0) and cell.n == 12
    assert "ann1, ann2, ann3" in " ".join(table.notes)


def fleiss_by_formula(ratings: list[list[int]], categories: list[int]) -> float:
    n_raters = len(ratings[0])
    counts = [[row.count(c) for c in categories] for row in ratings]
    p_items = [(sum(x * x for x in row) - n_raters) / (n_raters * (n_raters - 1)) for row in counts]
    p_cats = [sum(row[j] for row in counts) / (len(ratings) * n_raters) for j in range(len(categories))]
    p_bar, p_e = sum(p_items) / len(p_items), sum(p * p for p in p_cats)
    return (p_bar - p_e) / (1 - p_e)


def cohen_by_formula(a: list[int], b: list[int], categories: list[int]) -> float:
    n = len(a)
    p_o = sum(x == y for x, y in zip(a, b)) / n
    p_e = sum((a.count(c) / n) * (b.count(c) / n) for c in categories)
    return (p_o - p_e) / (1 - p_e)


def test_constructed_sheets_match_the_kappa_formulas(run, scenarios, tmp_path):
    run_dir, dialogues = run
    export(run_dir, scenarios, tmp_path / "x", dialogues=12, seed=5)
    sheet = read_sheet(tmp_path / "x" / "sheet.csv")
    judge = judge_of(dialogues)

    def annotator(shift: int):
        """Agrees with the judge except on items whose number is divisible by 3 + shift."""

        def scores(row):
            item, own = int(row["item"]), dict(judge[(row["user_id"], row["task_id"])])
            if item % (3 + shift) == 0:
                for m in METRICS:
                    own[m.column] = m.scores[(m.scores.index(own[m.column]) + 1) % len(m.scores)]
            return own

        return scores

    shifts = (0, 1, 2)
    paths = [write_sheet(tmp_path / f"a{s}.csv", filled(sheet, annotator(s))) for s in shifts]
    table = score_sheets(tmp_path / "x", paths, run_dir, BOOT)
    for m in METRICS:
        per_item = [[int(annotator(s)(row)[m.column]) for s in shifts] for row in sheet]
        judged = [judge[(row["user_id"], row["task_id"])][m.column] for row in sheet]
        fleiss = fleiss_by_formula(per_item, list(m.scores))
        cohen = sum(cohen_by_formula([r[k] for r in per_item], judged, list(m.scores)) for k in range(3)) / 3
        cell_f, cell_c = table.cell((m.label,), "fleiss"), table.cell((m.label,), "cohen")
        assert cell_f.mean == pytest.approx(fleiss) and cell_c.mean == pytest.approx(cohen)
        assert 0 < cohen < 1 and 0 < fleiss < 1  # a real disagreement, not a degenerate case
        assert cell_f.lo <= cell_f.hi and cell_c.lo <= cell_c.hi and cell_f.n == 12


def test_unparsed_judgments_are_left_out_of_cohen(tmp_path, sample_root, scenarios):
    dialogues = write_sample_run(
        tmp_path / "run",
        sample_root,
        lambda i, dim, spk: None if dim == "personalization" and i % 2 else judge_score(i, dim, spk),
    )
    export(tmp_path / "run", scenarios, tmp_path / "x", dialogues=12, seed=0)
    sheet = read_sheet(tmp_path / "x" / "sheet.csv")
    judge = judge_of(dialogues)
    index = {(d["user_id"], d["task_id"]): i for i, d in enumerate(dialogues)}
    paths = [
        write_sheet(tmp_path / f"{n}.csv", filled(sheet, lambda r: judge[(r["user_id"], r["task_id"])]))
        for n in ("a", "b")
    ]
    table = score_sheets(tmp_path / "x", paths, tmp_path / "run", BOOT)
    parsed = sum(1 for r in sheet if index[(r["user_id"], r["task_id"])] % 2 == 0)
    assert table.cell(("Personalization",), "cohen").n == parsed < 12
    assert table.cell(("Personalization",), "fleiss").n == 12
    assert any(f"{12 - parsed} (dialogue, metric) pairs" in note for note in table.notes)


# ---- score: bad sheets --------------------------------------------------------------------------


def _drop_row(rows):
    return rows[:2] + rows[3:]


def _duplicate_row(rows):
    return rows + [rows[1]]


def _out_of_range(rows):
    return [*rows[:1], {**rows[1], "personalization": "5"}, *rows[2:]]


def _empty_score(rows):
    return [*rows[:1], {**rows[1], "coherence_user": ""}, *rows[2:]]


def _other_export(rows):
    return [*rows[:1], {**rows[1], "export_id": "0123456789abcdef"}, *rows[2:]]


def _edited_dialogue(rows):
    return [*rows[:1], {**rows[1], "task_id": "SD-Alarm-task-99"}, *rows[2:]]


@pytest.mark.parametrize(
    "mutate, message",
    [
        (_drop_row, r"b\.csv: missing dialogue\(s\): item\(s\) 3 "),
        (_duplicate_row, r"b\.csv: row 6, field item: duplicate row for item 2 \(first at row 3\)"),
        (_out_of_range, r"b\.csv: row 3, field personalization: '5' is out of range; .* 1-4"),
        (_empty_score, r"b\.csv: row 3, field coherence_user: empty is out of range; .* 1-5"),
        (_other_export, r"b\.csv: row 3, field export_id: '0123456789abcdef' is not this export .* another export"),
        (_edited_dialogue, r"b\.csv: row 3, field task_id: 'SD-Alarm-task-99' but item 2"),
    ],
)
def test_bad_sheets_are_named_by_file_row_and_field(run, scenarios, tmp_path, mutate, message):
    run_dir, dialogues = run
    export(run_dir, scenarios, tmp_path / "x", dialogues=4, seed=0)
    judge = judge_of(dialogues)
    good = filled(read_sheet(tmp_path / "x" / "sheet.csv"), lambda r: judge[(r["user_id"], r["task_id"])])
    paths = [write_sheet(tmp_path / "a.csv", good), write_sheet(tmp_path / "b.csv", mutate(good))]
    with pytest.raises(AgreementError, match=message):
        score_sheets(tmp_path / "x", paths, run_dir, BOOT)


def test_one_sheet_is_not_enough(run, scenarios, tmp_path):
    export(run[0], scenarios, tmp_path / "x", dialogues=4, seed=0)
    with pytest.raises(AgreementError, match="two or more annotators, got 1"):
        score_sheets(tmp_path / "x", [tmp_path / "x" / "sheet.csv"], run[0], BOOT)


def test_semicolon_sheets_from_spreadsheets_are_read(run, scenarios, tmp_path):
    run_dir, dialogues = run
    export(run_dir, scenarios, tmp_path / "x", dialogues=4, seed=0)
    judge = judge_of(dialogues)
    rows = filled(read_sheet(tmp_path / "x" / "sheet.csv"), lambda r: judge[(r["user_id"], r["task_id"])])
    paths = []
    for name in ("a", "b"):
        with open(tmp_path / f"{name}.csv", "w", newline="", encoding="utf-8-sig") as f:
            writer = csv.DictWriter(f, fieldnames=SHEET_COLUMNS, delimiter=";")
            writer.writeheader()
            writer.writerows({**r, "personalization": f"{r['personalization']}.0"} for r in rows)
        paths.append(tmp_path / f"{name}.csv")
    table = score_sheets(tmp_path / "x", paths, run_dir, BOOT)
    assert math.isclose(table.cell(("Personalization",), "cohen").mean, 1.0)


# ---- the command line ---------------------------------------------------------------------------


def test_cli_exports_scores_and_writes_table5(run, tmp_path, sample_root):
    run_dir, dialogues = run
    out = tmp_path / "agreement"
    proc = run_cli(
        "agreement",
        "export",
        str(run_dir),
        f"data.root={sample_root}",
        f"agreement.out_dir={out}",
        "agreement.dialogues=6",
        "seed=1",
    )
    assert "6 dialogues" in proc.stdout and (out / "guide.html").is_file()
    judge = judge_of(dialogues)
    rows = filled(read_sheet(out / "sheet.csv"), lambda r: judge[(r["user_id"], r["task_id"])])
    paths = [write_sheet(tmp_path / f"{n}.csv", rows) for n in ("alice", "bob")]
    proc = run_cli(
        "agreement",
        "score",
        f"run.out_dir={run_dir}",
        f"agreement.out_dir={out}",
        f"agreement.sheets=[{paths[0]},{paths[1]}]",
        "report.bootstrap=50",
    )
    assert "Table 5" in proc.stdout and "| Task Completion | 1.000 [1.000, 1.000] (n=6)" in proc.stdout
    for ext in ("md", "csv", "tex"):
        assert (out / f"table5.{ext}").stat().st_size > 0
    # the paper's published values beside the lab's, from data/paper_table5.csv
    from personalens.data.paper import paper_table5

    published = paper_table5()
    with open(out / "table5.csv", newline="") as f:
        rows = {r["metric"]: r for r in csv.DictReader(f)}
    assert float(rows["Coherence (U)"]["paper_cohen"]) == published[("coherence", "user")].cohen
    assert float(rows["Task Completion"]["paper_fleiss"]) == published[("task_completion", "")].fleiss
    bad = run_cli(
        "agreement",
        "score",
        f"run.out_dir={run_dir}",
        f"agreement.out_dir={out}",
        f"agreement.sheets=[{paths[0]}]",
        check=False,
    )
    assert bad.returncode == 2 and "personalens agreement score: error: agreement.sheets needs" in bad.stderr
    assert run_cli("agreement", check=False).returncode == 2


def test_table5_intervals_resample_users_and_cover_a_known_kappa():
    """Table 5's cells over the simulation of tests/test_kappa.py (an annotator uniform on two values, the
    judge copying the annotator with a per-user probability of mean 0.6, else at random: true Cohen's and
    Fleiss' kappa 0.6; 20 users of 15 dialogues). Resampling users covers the truth at about the 95%
    nominal; the same cells resampling dialogues cover it far less often."""
    from test_kappa import scripted_judges

    from personalens.agreement.score import cohen_cell, fleiss_cell

    truth, sims = 0.6, 100
    covered = Counter()
    for seed in range(sims):
        a, b, user = scripted_judges(np.random.default_rng(seed), users=20, items=15, k=2, agreement=truth)
        boot, users = Bootstrap(200, seed), user.astype(str)
        cells = {
            "cohen": cohen_cell((a - 1)[:, None], b - 1, 2, boot, users),
            "fleiss": fleiss_cell(np.column_stack([a - 1, b - 1]), 2, boot, users),
            "cohen by dialogue": cohen_cell((a - 1)[:, None], b - 1, 2, boot) if seed < 50 else None,
        }
        covered.update(name for name, est in cells.items() if est is not None and est.lo <= truth <= est.hi)
    # 100 simulations give a binomial standard error of about 2.2 points around 95%
    assert 0.88 <= covered["cohen"] / sims <= 0.99 and 0.88 <= covered["fleiss"] / sims <= 0.99, covered
    assert covered["cohen by dialogue"] / 50 < 0.85, covered
