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
    results = bench().main(["--tiny", "--keep", str(tmp_path)])
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
    assert printed.count("turns/s") == 7 and printed.count("x  busy") == 4
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
            assert str(saved.config.lockstep.cohorts) == run.split("-")[1]
            cohorts = {r["cohort"] for r in read_rows(tmp_path / run / "trace")}
            forced_two = run.endswith("-2") or (run.endswith("-auto") and layout != "shared")
            assert cohorts == ({0, 1} if forced_two else {0})
    two = {m.layout: m for m in results if m.cohorts == "auto"}
    assert sorted(two["equal"].busy) == ["engine 0 (user-agent)", "engine 1 (assistant)"]
    assert sorted(two["shared"].busy) == ["engine 0 (user-agent)"]
    # the shared engine keeps one cohort under auto: the very same calls as with cohorts=1; two
    # engines get other calls (half the dialogues each), so other modelled seconds
    by = {(m.layout, m.cohorts): m.engine_seconds for m in results}
    assert by[("shared", "auto")] == by[("shared", "1")] != by[("shared", "2")]
    assert by[("equal", "auto")] != by[("equal", "1")]
