"""bench/reproducibility.py's comparisons, on dialogues and tables made here (the bench itself runs
the real commands for an hour on a CPU; docs/reproducibility.md has what it measured)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from personalens.tables.model import Column, Table
from personalens.tables.stats import Estimate

_spec = importlib.util.spec_from_file_location(
    "bench_reproducibility", Path(__file__).resolve().parents[1] / "bench" / "reproducibility.py"
)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

OPENING, REPLY, CLOSING = ("user", "Book a table."), ("assistant", "Done."), ("user", "Thanks. TERMINATE")


def test_the_first_differing_turn_counts_from_the_opening_and_a_shorter_dialogue_differs_where_it_stops():
    assert bench.first_difference([OPENING, REPLY], [OPENING, REPLY]) is None
    assert bench.first_difference([OPENING, REPLY], [("user", "Book a room."), REPLY]) == 0
    assert bench.first_difference([OPENING, REPLY, CLOSING], [OPENING, ("assistant", "Sure."), CLOSING]) == 1
    assert bench.first_difference([OPENING, REPLY, CLOSING], [OPENING, REPLY]) == 2


def test_dialogues_are_compared_by_key_and_counted_by_first_difference():
    base = {("u0", "t1", "base", 0): [OPENING, REPLY], ("u0", "t2", "base", 0): [OPENING, REPLY, CLOSING]}
    other = {("u0", "t1", "base", 0): [OPENING, REPLY], ("u0", "t2", "base", 0): [OPENING, REPLY]}
    assert bench.compare_dialogues(base, other) == {
        "dialogues": 2,
        "identical": 1,
        "first_differing_turn": {2: 1},
        "first_differing_role": {"user": 1},
    }
    assert bench.compare_dialogues(base, other, {("u0", "t1", "base", 0)})["identical"] == 1


def test_a_dialogue_identity_is_its_key_and_text():
    row = {"user_id": "u0", "task_id": "t1", "setting": "base", "trial": 0, "turns": [{"role": "user", "text": "a"}]}
    same = {**row, "run_id": "elsewhere", "seconds": 9.0}
    assert bench.identity(row) == bench.identity(same)
    assert bench.identity(row) != bench.identity({**row, "turns": [{"role": "user", "text": "b"}]})
    assert bench.identity(row) != bench.identity({**row, "trial": 1})


def test_every_table3_cell_gets_its_change_beside_the_reference_interval():
    columns = (Column("SD_TCR", "SD", "TCR (%)"), Column("SD_P", "SD", "P"))
    ref = Table("table3", "", ("Assistant model",), columns, ((("m",), (Estimate(50, 20, 80, 10), None)),))
    other = Table("table3", "", ("Assistant model",), columns, ((("m",), (Estimate(60, 30, 90, 10), None)),))
    assert bench.cell_changes(ref, other) == [
        {"row": "m", "cell": "SD_TCR", "mean": 50, "lo": 20, "hi": 80, "n": 10, "change": 10}
    ]


def test_a_generate_summary_gives_its_rate_and_numbers_compare_bit_for_bit():
    assert bench.rate({"seconds": 40.0, "completion_tokens": 1000}) == {
        "tokens": 1000,
        "generate_s": 40.0,
        "tokens_per_s": 25.0,
    }
    first = [[(5, -0.25), (7, -1.5)], [(9, -0.125)]]
    assert bench.same_numbers(first, [[(5, -0.25), (7, -1.5)], [(9, -0.125)]]) == 2
    # one log-probability a unit in the last place apart: that prompt is not identical
    assert bench.same_numbers(first, [[(5, -0.25), (7, -1.5000000000000002)], [(9, -0.125)]]) == 1


def test_a_set_override_replaces_the_default_of_its_key_and_others_are_added(tmp_path):
    made = bench.Bench(tmp_path, "0", overrides=["protocol=paper", "protocol.max_rounds_sd=3"])
    assert made.base == ["data.users=0", "progress=false", "protocol=paper", "protocol.max_rounds_sd=3"]
    assert bench.Bench(tmp_path, "0-2").base == ["data.users=0-2", "protocol=quick", "progress=false"]
