"""bench/cohorts.py at its tiny size: the real `generate` (config, templates, Parquet) on engines
timed by the planner's GPU model, with 1 cohort and with `auto`, per layout."""

from __future__ import annotations

import importlib.util
import sys

from cli_helpers import REPO, read_rows
from omegaconf import OmegaConf


def bench():
    spec = importlib.util.spec_from_file_location("bench_cohorts", REPO / "bench" / "cohorts.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_the_tiny_bench_runs_every_layout_and_cohorts_change_no_dialogue(tmp_path, capsys):
    results = bench().main(["--tiny", "--keep", str(tmp_path), "--layouts", "equal;70B + 8B;shared"])
    assert [(m.layout, m.cohorts) for m in results] == [
        ("equal", "1"),
        ("equal", "auto"),
        ("70B + 8B", "1"),
        ("70B + 8B", "auto"),
        ("shared", "1"),
        ("shared", "auto"),
        ("shared", "2"),
    ]
    assert {m.dialogues for m in results} == {68}  # the sample's 34 scenarios x 2 trials
    printed = capsys.readouterr().out
    assert printed.count("turns/s") == 7 and printed.count("x  prefilled") == 4
    for layout in ("equal", "70B+8B", "shared"):
        runs = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(layout + "-"))
        texts = [
            sorted(
                (r["user_id"], r["task_id"], r["trial"], [t["text"] for t in r["turns"]])
                for r in read_rows(tmp_path / run / "dialogues")
            )
            for run in runs
        ]
        assert all(t == texts[0] for t in texts)  # replies drawn from each request's seed
        for run in runs:
            saved = OmegaConf.load(tmp_path / run / "generate.yaml")
            _, count, in_flight = run.split("-")
            assert str(saved.config.lockstep.cohorts) == count and in_flight == "all"
            cohorts = {r["cohort"] for r in read_rows(tmp_path / run / "trace")}
            forced_two = count == "2" or (count == "auto" and layout != "shared")
            assert cohorts == ({0, 1} if forced_two else {0})
    two = {m.layout: m for m in results if m.cohorts == "auto"}
    assert sorted(two["equal"].busy) == ["engine 0 (user-agent)", "engine 1 (assistant)"]
    assert sorted(two["shared"].busy) == ["engine 0 (user-agent)"]
    # the shared engine keeps one cohort under auto: the very same calls as with cohorts=1; two
    # engines get other calls (half the dialogues each), so other modelled seconds
    by = {(m.layout, m.cohorts): m.engine_seconds for m in results}
    assert by[("shared", "auto")] == by[("shared", "1")] != by[("shared", "2")]
    assert by[("equal", "auto")] != by[("equal", "1")]


def test_the_tiny_bench_keeps_the_dialogues_in_flight_its_engines_caches_hold(tmp_path):
    """lockstep.in_flight=auto through the real `generate`, sized from the timed engines' caches: before
    any dialogue ends, as many as hold a whole max_model_len (400,000 // 65,536 = 6 on the user agent's
    engine, 3 a cohort), then as many as the dialogues' learned lengths allow (all that are left here);
    the assistant's two copies split its requests. The dialogues are the same as with all in flight."""
    results = bench().main(
        ["--tiny", "--keep", str(tmp_path), "--layouts", "equal, assistant x2", "--in-flight", "all,auto"]
    )
    assert [(m.cohorts, m.in_flight) for m in results] == [
        ("1", "all"),
        ("auto", "all"),
        ("1", "auto"),
        ("auto", "auto"),
    ]
    texts = []
    for run in sorted(tmp_path.iterdir()):
        rows = read_rows(run / "dialogues")
        texts.append(sorted((r["user_id"], r["task_id"], r["trial"], [t["text"] for t in r["turns"]]) for r in rows))
        first = [r["requests"] for r in read_rows(run / "trace") if r["step"] == 1]
        held = run.name.endswith("-auto")
        assert first == ([6 if run.name.split("-")[1] == "1" else 3] if held else [68 if "-1-" in run.name else 34])
    assert all(t == texts[0] for t in texts) and len(texts) == 4
    assert all(0 < m.prefilled < 1 for m in results)
