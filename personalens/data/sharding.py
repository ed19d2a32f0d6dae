"""Split scenarios into shards by user, e.g. one shard per SLURM array task.

The split depends only on (user indices, their scenario counts, shard count), so every process
of an array job, and a later merge step, computes the same assignment on its own.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from personalens.data.errors import DataError
from personalens.data.records import Scenario


def assign_shards(scenario_counts: Mapping[int, int], count: int) -> dict[int, int]:
    """user index -> shard, balancing scenario counts.

    Greedy largest-first onto the lightest shard (ties: larger users first by lower index, and the
    lower shard number among equally light shards). Shard loads then differ by at most the
    largest single user's scenario count.
    """
    _check_count(count)
    loads = [0] * count
    assignment: dict[int, int] = {}
    for user in sorted(scenario_counts, key=lambda u: (-scenario_counts[u], u)):
        lightest = min(range(count), key=lambda k: (loads[k], k))
        assignment[user] = lightest
        loads[lightest] += scenario_counts[user]
    return assignment


def scenario_counts(scenarios: Sequence[Scenario]) -> dict[int, int]:
    """user index -> number of scenarios of that user."""
    return dict(Counter(s.user.index for s in scenarios))


def shard(scenarios: Sequence[Scenario], index: int, count: int) -> list[Scenario]:
    """The scenarios of shard `index` of `count` (0-based), in their original order."""
    _check_count(count)
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < count:
        raise DataError(f"shard.index: expected an integer from 0 to {count - 1} (shard.count={count}), got {index!r}")
    assignment = assign_shards(scenario_counts(scenarios), count)
    return [s for s in scenarios if assignment[s.user.index] == index]


def _check_count(count: int) -> None:
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise DataError(f"shard.count: expected a positive integer, got {count!r}")
