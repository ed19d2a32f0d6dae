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
