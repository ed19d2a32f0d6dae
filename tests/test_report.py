"""The report layer on hand-built run outputs whose answers are worked out here by plain arithmetic."""

from __future__ import annotations

import csv
import math
from pathlib import Path
from statistics import mean

import matplotlib.image
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from run_rows import dialogue_row, judgment_row

from personalens.errors import PersonalensError
from personalens.report import ReportError, build_report
from personalens.store import DIALOGUE_SCHEMA, JUDGMENT_SCHEMA
from personalens.tables.stats import Estimate

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def make_dialogue(
    i: int,
    kind: str,
    domains: list[str],
    *,
    model: str = "m1",
    setting: str = "base",
    tokens: list[int] = (10, 20, 30, 40),
    run_id: str = "run",
) -> dict:
    turns = [
        {"role": "user" if k % 2 == 0 else "assistant", "text": f"t{k}", "prompt_tokens": 5, "completion_tokens": t}
        for k, t in enumerate(tokens)
    ]
    task = f"SD-{domains[0]}-task-{i}" if kind == "SD" else f"MD-task-{i}"
    return dialogue_row(
        f"user{i}", task, kind, domains, setting=setting, seed=i, turns=turns, model=model, run_id=run_id
    )


def judge_all(
    d: dict,
    tc: float | None,
    p: float | None,
    nat: float = 4.0,
    coh: float = 5.0,
    user_nat: float = 3.0,
    user_coh: float = 4.0,
    turn_p: list[float] = (),
) -> list[dict]:
    return [
        judgment_row(d, "task_completion", tc),
        judgment_row(d, "personalization", p),
        judgment_row(d, "naturalness", nat, speaker="assistant"),
        judgment_row(d, "coherence", coh, speaker="assistant"),
        judgment_row(d, "naturalness", user_nat, speaker="user"),
        judgment_row(d, "coherence", user_coh, speaker="user"),
        *(judgment_row(d, "personalization", s, turn=k + 1) for k, s in enumerate(turn_p)),
    ]


def write_run(run_dir: Path, dialogues: list[dict], judgments: list[dict], shards: int = 2) -> Path:
    """Spread rows over `shards` shard folders with two part files each, like a sharded run."""
    for folder, rows, schema in (("dialogues", dialogues, DIALOGUE_SCHEMA), ("judgments", judgments, JUDGMENT_SCHEMA)):
        for k in range(shards):
            shard_rows = rows[k::shards]
            for part, part_rows in enumerate((shard_rows[::2], shard_rows[1::2])):
                path = run_dir / folder / f"shard-{k:03d}-of-{shards:03d}" / f"part-{part:05d}.parquet"
                path.parent.mkdir(parents=True, exist_ok=True)
                pq.write_table(pa.Table.from_pylist(part_rows, schema=schema), path)
    return run_dir


def ci_contains(cell: Estimate, expected: float) -> bool:
    return math.isclose(cell.mean, expected) and cell.lo <= cell.mean <= cell.hi


# ---- a two-model run with known answers ---------------------------------------------------------

# (kind, domains, TC, P) per dialogue of each model; None is an unparsed judgment.
M1 = [
    ("SD", ["Movies"], 1.0, 3.0),
    ("SD", ["Movies"], 0.0, 2.0),
    ("SD", ["Books"], 1.0, 4.0),
    ("SD", ["Books"], 1.0, None),
    ("MD", ["Movies", "Hotels"], 0.0, 1.0),
    ("MD", ["Books", "Hotels"], 1.0, 2.0),
    ("MD", ["Movies", "Books"], None, 3.0),
]
M2 = [("SD", ["Alarm"], 1.0, 2.0), ("SD", ["Alarm"], 1.0, 2.0), ("MD", ["Alarm", "Music"], 0.0, 4.0)]


@pytest.fixture
def two_models(tmp_path: Path) -> tuple[Path, list[dict]]:
    dialogues, judgments = [], []
    for model, spec in (("m1", M1), ("m2", M2)):
        for i, (kind, domains, tc, p) in enumerate(spec):
            d = make_dialogue(i, kind, domains, model=model, tokens=[10 * (i + 1)] * (2 + 2 * (i % 3)))
            dialogues.append(d)
            judgments += judge_all(d, tc, p, nat=float(1 + i % 5), coh=5.0, user_nat=float(5 - i % 3))
    return write_run(tmp_path / "run", dialogues, judgments), dialogues


def parsed_scores(spec: list, kind: str, column: int) -> list[float]:
    return [row[column] for row in spec if row[0] == kind and row[column] is not None]


def test_table3_rates_and_means_per_model_and_kind(two_models, tmp_path):
    run, _ = two_models
    report = build_report([run], tmp_path / "out", bootstrap=200)
    for model, spec in (("m1", M1), ("m2", M2)):
        for kind in ("SD", "MD"):
            tc, p = parsed_scores(spec, kind, 2), parsed_scores(spec, kind, 3)
            tcr = report.table3.cell((model,), f"{kind}_TCR")
            assert ci_contains(tcr, 100 * sum(tc) / len(tc)) and tcr.n == len(tc)
            assert ci_contains(report.table3.cell((model,), f"{kind}_P"), sum(p) / len(p))
            nats = [float(1 + i % 5) for i, row in enumerate(spec) if row[0] == kind]
            assert ci_contains(report.table3.cell((model,), f"{kind}_Nat"), mean(nats))
            user_nats = [float(5 - i % 3) for i, row in enumerate(spec) if row[0] == kind]
            assert ci_contains(report.table12.cell((model,), f"{kind}_Nat"), mean(user_nats))
    assert report.table3.row_header == ("Assistant model",)  # one setting per model: no setting column
    assert report.table4 == ()


def test_parse_failures_are_counted_and_excluded_from_means(two_models, tmp_path):
    run, _ = two_models
    report = build_report([run], tmp_path / "out", bootstrap=200)
    sd_p = report.table3.cell(("m1",), "SD_P")
    assert sd_p.unparsed == 1 and sd_p.n == 3 and math.isclose(sd_p.mean, (3 + 2 + 4) / 3)
    md_tc = report.table3.cell(("m1",), "MD_TCR")
    assert md_tc.unparsed == 1 and md_tc.n == 2
    assert report.parse_failures.cell(("m1", "personalization"), "SD_unparsed") == 1
    assert report.parse_failures.cell(("m1", "task_completion"), "MD_unparsed") == 1
    assert report.parse_failures.cell(("m1", "task_completion"), "MD_judged") == 3
    assert report.unparsed == 2
    text = (tmp_path / "out" / "report.md").read_text()
    assert "Unparsed judgments: 2 of" in text and "n=3; 1 unparsed" in text


def test_multi_domain_dialogues_count_towards_each_domain(two_models, tmp_path):
    run, _ = two_models
    report = build_report([run], tmp_path / "out", bootstrap=200)
    for domain in ("Movies", "Books", "Hotels"):
        tc = [row[2] for row in M1 if domain in row[1] and row[2] is not None]
        p = [row[3] for row in M1 if domain in row[1] and row[3] is not None]
        assert ci_contains(report.by_domain.cell(("m1", domain), "TCR"), 100 * mean(tc))
        assert report.by_domain.cell(("m1", domain), "TCR").n == len(tc)
        assert ci_contains(report.by_domain.cell(("m1", domain), "P"), mean(p))
    assert [labels[1] for labels, _ in report.by_domain.rows if labels[0] == "m2"] == ["Alarm", "Music"]


def test_table13_dialogue_statistics(two_models, tmp_path):
    run, dialogues = two_models
    report = build_report([run], tmp_path / "out", bootstrap=200)
    for kind in ("SD", "MD"):
        ds = [d for d in dialogues if d["assistant_model"] == "m1" and d["kind"] == kind]
        tokens = [t["completion_tokens"] for d in ds for t in d["turns"]]
        assert report.table13.cell(("m1",), f"{kind}_dialogues") == len(ds)
        assert ci_contains(report.table13.cell(("m1",), f"{kind}_rounds"), mean(d["rounds"] for d in ds))
        assert ci_contains(report.table13.cell(("m1",), f"{kind}_tokens_per_turn"), sum(tokens) / len(tokens))


def test_outputs_written_in_three_formats_and_csv_is_numeric(two_models, tmp_path):
    run, _ = two_models
    out = tmp_path / "out"
    report = build_report([run], out, bootstrap=200)
    for stem in ("table3", "table12", "table13"):
        for suffix in (".md", ".csv", ".tex"):
            assert (out / f"{stem}{suffix}").stat().st_size > 0
    assert not (out / "table4.md").exists()
    with open(out / "table3.csv") as f:
        rows = {row["assistant_model"]: row for row in csv.DictReader(f)}
    sd_p = report.table3.cell(("m1",), "SD_P")
    assert float(rows["m1"]["SD_P_mean"]) == pytest.approx(sd_p.mean)
    assert float(rows["m1"]["SD_P_lo"]) == pytest.approx(sd_p.lo)
    assert int(rows["m1"]["SD_P_n"]) == 3 and int(rows["m1"]["SD_P_unparsed"]) == 1
    cell = f"{sd_p.mean:.2f} [{sd_p.lo:.2f}, {sd_p.hi:.2f}] (n=3; 1 unparsed)"
    assert cell in report.table3_markdown() and cell in (out / "table3.tex").read_text()
    assert report.table3_markdown() in (out / "report.md").read_text()


def assert_png(path: Path) -> None:
    assert path.read_bytes()[:8] == PNG_SIGNATURE
    image = matplotlib.image.imread(path)
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100


def test_figure4_always_and_figure5_skipped_without_turn_level_rows(two_models, tmp_path):
    run, _ = two_models
    report = build_report([run], tmp_path / "out", bootstrap=200, figure5_domains=["Movies"])
    assert_png(tmp_path / "out" / "figure4.png")
    assert report.by_turn is None and not (tmp_path / "out" / "figure5.png").exists()
    assert "no turn-level personalization judgments" in (tmp_path / "out" / "report.md").read_text()


def test_figure5_averages_turn_level_personalization_of_sd_tasks(tmp_path):
    spec = [
        ("SD", ["Movies"], [1.0, 2.0, 4.0]),
        ("SD", ["Movies"], [2.0, 3.0]),
        ("SD", ["Music"], [3.0, None]),
        ("MD", ["Movies", "Music"], [4.0, 4.0]),
    ]
    dialogues, judgments = [], []
    for i, (kind, domains, turn_p) in enumerate(spec):
        d = make_dialogue(i, kind, domains)
        dialogues.append(d)
        judgments += judge_all(d, 1.0, 2.0, turn_p=turn_p)
    out = tmp_path / "out"
    report = build_report(
        [write_run(tmp_path / "run", dialogues, judgments)], out, bootstrap=200, figure5_domains=["Movies", "Alarm"]
    )
    assert_png(out / "figure5.png")
    movies = {1: [1.0, 2.0], 2: [2.0, 3.0], 3: [4.0]}  # SD Movies only: the MD dialogue is not an SD task
    for turn, scores in movies.items():
        assert ci_contains(report.by_turn.cell(("m1", "Movies", str(turn)), "P"), mean(scores))
    assert ci_contains(report.by_turn.cell(("m1", "All SD", "2"), "P"), mean([2.0, 3.0]))
    assert report.by_turn.cell(("m1", "All SD", "2"), "P").unparsed == 1
    assert "No turn-level SD judgments for: Alarm" in (out / "report.md").read_text()
    # Turn-level rows are not the dialogue-level P of Table 3.
    assert report.table3.cell(("m1",), "SD_P").n == 3
    # A later report into the same folder without turn-level rows leaves no stale Figure 5 behind.
    d = make_dialogue(0, "SD", ["Books"])
    build_report([write_run(tmp_path / "plain", [d], judge_all(d, 1.0, 2.0), shards=1)], out, bootstrap=10)
    assert not (out / "figure5.png").exists() and not (out / "figure5.csv").exists()


def test_table4_orders_settings_and_names_the_full_ablation(tmp_path):
    settings = ["base+X", "base+D+I+S", "base", "vanilla", "base+I"]  # scrambled, with an unknown label
    runs = []
    for k, setting in enumerate(settings):
        d = make_dialogue(0, "SD", ["Books"], setting=setting, run_id=f"run-{k}")
        d_md = make_dialogue(1, "MD", ["Books", "Music"], setting=setting, run_id=f"run-{k}")
        runs.append(
            write_run(tmp_path / setting, [d, d_md], judge_all(d, 1.0, 1.0 + k) + judge_all(d_md, 0.0, 2.0), shards=1)
        )
    report = build_report(runs, tmp_path / "out", bootstrap=200)
    (table,) = report.table4
    assert [labels for labels, _ in table.rows] == [("vanilla",), ("base",), ("base+I",), ("base+all",), ("base+X",)]
    assert ci_contains(table.cell(("base+all",), "SD_P"), 1.0 + settings.index("base+D+I+S"))
    assert table.context == (("assistant_model", "m1"),)
    assert report.table3.row_header == ("Assistant model", "Setting")
    assert report.table3.rows[0][0] == ("m1", "vanilla")
    assert "base+all" in (tmp_path / "out" / "table4.md").read_text()


def test_missing_or_empty_inputs_are_named(two_models, tmp_path):
    run, _ = two_models
    assert issubclass(ReportError, PersonalensError)  # the CLI shows these as a message, not a traceback
    with pytest.raises(PersonalensError, match="run directory .*nowhere does not exist"):
        build_report([tmp_path / "nowhere"], tmp_path / "out")
    (tmp_path / "bare" / "dialogues").mkdir(parents=True)
    with pytest.raises(PersonalensError, match=r"bare/dialogues holds no Parquet"):
        build_report([tmp_path / "bare"], tmp_path / "out")
    (tmp_path / "half" / "dialogues").mkdir(parents=True)
    pq.write_table(
        pa.Table.from_pylist([make_dialogue(0, "SD", ["Books"])], schema=DIALOGUE_SCHEMA),
        tmp_path / "half" / "dialogues" / "part-00000.parquet",
    )
    with pytest.raises(PersonalensError, match=r"half/judgments does not exist"):
        build_report([tmp_path / "half"], tmp_path / "out")
    with pytest.raises(PersonalensError, match="more than once"):
        build_report([run, run], tmp_path / "out")
    with pytest.raises(ReportError, match="unknown domain"):
        build_report([run], tmp_path / "out", figure5_domains=["movies"])


def test_missing_column_is_named(tmp_path):
    d = make_dialogue(0, "SD", ["Books"])
    run = write_run(tmp_path / "run", [d], judge_all(d, 1.0, 2.0), shards=1)
    part = next((run / "judgments").rglob("part-*.parquet"))
    pq.write_table(pq.read_table(part).drop_columns(["parsed"]), part)
    with pytest.raises(PersonalensError, match=r"part-\d+\.parquet: missing column\(s\) parsed"):
        build_report([run], tmp_path / "out")


def test_a_cell_whose_judgments_all_failed_shows_the_count(tmp_path):
    d = make_dialogue(0, "MD", ["Books", "Music"])
    run = write_run(tmp_path / "run", [d], judge_all(d, None, 3.0), shards=1)
    report = build_report([run], tmp_path / "out", bootstrap=10)
    cell = report.table3.cell(("m1",), "MD_TCR")
    assert cell.n == 0 and cell.unparsed == 1 and math.isnan(cell.mean)
    assert "| – (n=0; 1 unparsed) |" in report.table3_markdown()
    with open(tmp_path / "out" / "table3.csv") as f:
        row = next(csv.DictReader(f))
    assert (row["MD_TCR_mean"], row["MD_TCR_n"], row["MD_TCR_unparsed"]) == ("", "0", "1")
    assert row["SD_TCR_mean"] == "" and row["SD_TCR_n"] == "0"  # no SD dialogues at all
