"""Sharding scenarios by user: a partition, balanced, and a function of the counts alone."""

import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from personalens.data import DataError, assign_shards, load_scenarios, scenario_counts, shard
from personalens.data.records import Scenario, Situation, Task, UserProfile

_SITUATION = Situation("Here", "Phone", "Morning", "Monday", "Quiet")


def _scenarios(counts: dict[int, int]) -> list[Scenario]:
    """`counts[u]` scenarios for each user u, interleaved so shard() has to keep the input order."""
    users = {u: UserProfile(u, f"user{u}", {}, {}, {}, {}) for u in counts}
    tasks = [
        Task(f"SD-Alarm-task-{n}", "SD", "", "", "", ("Alarm",), ()) for n in range(max(counts.values(), default=0))
    ]
    rows = [(n, u) for u, c in counts.items() for n in range(c)]
    return [Scenario(users[u], tasks[n], _SITUATION) for n, u in sorted(rows)]


counts_strategy = st.dictionaries(st.integers(0, 1499), st.integers(1, 90), max_size=40)


@settings(max_examples=200, deadline=None)
@given(counts=counts_strategy, count=st.integers(1, 12))
def test_shards_partition_and_balance(counts, count):
    scenarios = _scenarios(counts)
    shards = [shard(scenarios, k, count) for k in range(count)]

    assert Counter(s.key for part in shards for s in part) == Counter(s.key for s in scenarios)
    owner = {}
    for k, part in enumerate(shards):
        keys = {s.key for s in part}
        assert [s.key for s in part] == [s.key for s in scenarios if s.key in keys]  # input order kept
        for s in part:
            assert owner.setdefault(s.user.index, k) == k  # a user never spans two shards
    sizes = [len(part) for part in shards]
    assert max(sizes) - min(sizes) <= max(counts.values(), default=0)


@settings(max_examples=100, deadline=None)
@given(counts=counts_strategy, count=st.integers(1, 12), seed=st.integers(0, 2**16))
def test_assignment_depends_only_on_the_counts(counts, count, seed):
    items = list(counts.items())
    random.Random(seed).shuffle(items)
    assert assign_shards(dict(items), count) == assign_shards(counts, count)
    assignment = assign_shards(counts, count)
    assert set(assignment) == set(counts) and set(assignment.values()) <= set(range(count))


def test_shards_of_the_sample_match_the_assignment(sample_root):
    scenarios = load_scenarios(sample_root)
    assignment = assign_shards(scenario_counts(scenarios), 4)
    for k in range(4):
        assert {s.user.index for s in shard(scenarios, k, 4)} == {u for u, v in assignment.items() if v == k}


@pytest.mark.parametrize("index, count", [(0, 0), (0, -1), (2, 2), (-1, 2), ("0", 2), (0, True), (0, 2.0)])
def test_bad_index_or_count_is_a_data_error(index, count):
    with pytest.raises(DataError, match="shard"):
        shard(_scenarios({1: 2}), index, count)
