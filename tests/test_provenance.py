"""report/provenance.py: which runs were written in more than one go (pure, on records made here)."""

from __future__ import annotations

from typing import NamedTuple

from personalens.report.provenance import mixed_runs


class Row(NamedTuple):
    run: str
    shard: str
    session: float | None


def test_a_run_written_in_one_go_per_shard_is_not_named():
    rows = [Row("r", "shard-000-of-002", 1.0), Row("r", "shard-001-of-002", 2.0), Row("r", "shard-001-of-002", 2.0)]
    assert mixed_runs(rows, rows) == ()


def test_a_resumed_shard_and_mixed_shard_counts_are_named_per_run_and_table():
    dialogues = [
        Row("a", "shard-000-of-001", 1.0),
        Row("a", "shard-000-of-001", 5.0),  # the same shard, a later invocation: resumed
        Row("b", "shard-000-of-001", 1.0),
        Row("b", "shard-001-of-002", 2.0),  # the run's rows under two shard counts
        Row("c", "shard-000-of-001", None),  # written before sessions were kept, then resumed
        Row("c", "shard-000-of-001", 3.0),
    ]
    judgments = [Row("a", "shard-000-of-001", 7.0)]
    assert mixed_runs(dialogues, judgments) == (
        "`a`: dialogues written by more than one `generate` invocation (resumed): shard-000-of-001 by 2",
        "`b`: dialogues written under 2 shard counts (1, 2)",
        "`c`: dialogues written by more than one `generate` invocation (resumed): shard-000-of-001 by 2",
    )
    assert mixed_runs([], dialogues[:2])[0].startswith("`a`: judgments written by more than one `judge` invocation")
    # dialogues continued mid-dialogue: named per run and shard, first; a run with none is not
    continued = {"a": {"shard-000-of-002": 3, "shard-001-of-002": 0}, "b": {"shard-000-of-001": 0}}
    assert mixed_runs([], [], continued) == (
        "`a`: 3 dialogue(s) continued mid-dialogue from the turns a stopped `generate` stored, their turns from "
        "more than one invocation: shard-000-of-002 3",
    )


def test_the_report_names_a_run_extended_by_a_second_invocation_and_one_under_two_shard_counts(tmp_path):
    from test_fidelity import PromptRecorder, config

    from personalens.judge import command as judge_command
    from personalens.report import build_report
    from personalens.simulate import command as simulate_command

    engine = PromptRecorder()
    engines = lambda: {"user_agent": engine, "assistant": engine, "judge": engine}  # noqa: E731
    once, twice, counts = tmp_path / "once", tmp_path / "twice", tmp_path / "counts"
    for out, steps in (
        (once, [("data.users=0-1",)]),
        (twice, [("data.users=0",), ("data.users=0-1",)]),  # a second generate fills in user 1
        # user 0 as one shard, then user 1 as shard 1 of 2
        (counts, [("data.users=0",), ("data.users=0-1", "shard.index=1", "shard.count=2")]),
    ):
        for overrides in steps:
            cfg = config(f"run.out_dir={out}", f"run.name={out.name}", *overrides)
            assert simulate_command.generate(cfg, engines) == 0 and judge_command.judge(cfg, engines) == 0

    assert build_report([once], once / "report", bootstrap=20).mixed == ()
    assert "Written in more than one go" not in (once / "report" / "report.md").read_text()
    report = build_report([twice, counts], tmp_path / "report", bootstrap=20)
    assert report.mixed == (
        f"`{twice}`: dialogues written by more than one `generate` invocation (resumed): shard-000-of-001 by 2",
        f"`{counts}`: dialogues written under 2 shard counts (1, 2)",
        f"`{twice}`: judgments written by more than one `judge` invocation (resumed): shard-000-of-001 by 2",
        f"`{counts}`: judgments written under 2 shard counts (1, 2)",
    )
    md = (tmp_path / "report" / "report.md").read_text()
    assert "**Written in more than one go**" in md and f"- `{twice}`: dialogues written by more than one" in md
    assert "Written in more than one go (docs/reproducibility.md)" in (tmp_path / "report" / "table3.md").read_text()
