"""bench/cohorts.py at its tiny size: the real `generate` (config, templates, Parquet) on engines
timed by the planner's GPU model, with 1 cohort and with `auto`, per layout."""

from __future__ import annotations

import importlib.util
import sys
import threading

import pytest
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
    assert [(m.layout, m.cohorts, m.joins) for m in results] == [
        ("equal", "1", False),
        ("equal", "auto", False),
        ("equal", "auto", True),
        ("70B + 8B", "1", False),
        ("70B + 8B", "auto", False),
        ("70B + 8B", "auto", True),
        ("shared", "1", False),
        ("shared", "auto", False),
        ("shared", "2", False),
    ]
    assert {m.dialogues for m in results} == {68}  # the sample's 34 scenarios x 2 trials
    # each run's timed engines end their driver threads with it
    assert [t.name for t in threading.enumerate() if t.name.startswith("timed ")] == []
    printed = capsys.readouterr().out
    assert printed.count("turns/s") == 9 and printed.count("x  prefilled") == 6
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
            _, count, in_flight, joins = run.split("-")
            assert str(saved.config.lockstep.cohorts) == count and in_flight == "all"
            cohorts = {r["cohort"] for r in read_rows(tmp_path / run / "trace")}
            # auto: one shared engine keeps 1; two engines that join calls get one cohort per 16
            # dialogues (68: 5), two that take calls in turn 2
            expected = {"1": 1, "2": 2}.get(count) or (1 if layout == "shared" else 5 if joins == "joins" else 2)
            assert cohorts == set(range(expected)), (run, cohorts)
    two = {m.layout: m for m in results if m.cohorts == "auto" and not m.joins}
    assert sorted(two["equal"].busy) == ["engine 0 (user-agent)", "engine 1 (assistant)"]
    assert sorted(two["shared"].busy) == ["engine 0 (user-agent)"]
    # the shared engine keeps one cohort under auto: the very same calls as with cohorts=1; two
    # engines get other calls (half the dialogues each), so other modelled seconds
    by = {(m.layout, m.cohorts, m.joins): m.engine_seconds for m in results}
    # (to rounding: each run's model clock starts from its own wall-clock idle time)
    same = by[("shared", "auto", False)]["user-agent"]
    assert same == pytest.approx(by[("shared", "1", False)]["user-agent"], rel=1e-9)
    assert same != pytest.approx(by[("shared", "2", False)]["user-agent"], rel=1e-3)
    assert by[("equal", "auto", False)] != by[("equal", "1", False)]
