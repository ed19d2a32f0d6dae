"""How long a run's shards take, and how many shards keep each under a wall-time limit, pure: the
expected generated tokens of each shard's dialogues over a throughput in generated tokens per second.
Shards split the selection by user (data/sharding.py), so their sizes come from the same split."""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from personalens.data import Scenario, assign_shards, scenario_counts
from personalens.errors import PersonalensError
from personalens.plan.budget import PerDialogue

_LIMIT = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")


def parse_time_limit(text: str) -> int:
    """Seconds of a SLURM time limit: M, M:S, H:M:S, D-H, D-H:M or D-H:M:S."""
    match = _LIMIT.match(str(text).strip())
    if not match:
        raise PersonalensError(f"plan.time_limit: {text!r} is not a SLURM time (e.g. 04:00:00 or 1-12:00:00)")
    days, *parts = match.groups()
    numbers = [int(x) for x in parts if x is not None]
    if days is not None:  # D-H[:M[:S]]
        hours, minutes, seconds = (numbers + [0, 0])[:3]
    else:  # M, M:S or H:M:S
        hours, minutes, seconds = (
            [0, *numbers, 0] if len(numbers) == 1 else [0, *numbers] if len(numbers) == 2 else numbers
        )
    total = int(days or 0) * 86400 + hours * 3600 + minutes * 60 + seconds
    if total <= 0:
        raise PersonalensError(f"plan.time_limit: {text!r} is no time at all")
    return total


def duration(seconds: float) -> str:
    minutes = math.ceil(seconds / 60)
    return f"{minutes // 60} h {minutes % 60:02d} min" if minutes >= 60 else f"{minutes} min"


def shard_loads(scenarios: Sequence[Scenario], count: int, trials: int) -> list[dict[str, int]]:
    """Dialogues of each kind in each of `count` shards."""
    assignment = assign_shards(scenario_counts(scenarios), count)
    loads = [Counter() for _ in range(count)]
    for s in scenarios:
        loads[assignment[s.user.index]][s.task.kind] += trials
    return [dict(load) for load in loads]


@dataclass(frozen=True)
class Rates:
    """Generated tokens per second of a generate job and of a judge job (None: unknown)."""

    generate: float | None
    judge: float | None
    source: str

    def seconds(
        self, load: Mapping[str, int], per_kind: Mapping[str, PerDialogue]
    ) -> tuple[float | None, float | None]:
        """(generate, judge) seconds of one shard's dialogues."""
        generated = sum(n * per_kind[k].generated for k, n in load.items())
        judged = sum(n * per_kind[k].judge_generated for k, n in load.items())
        return (
            generated / self.generate if self.generate else None,
            judged / self.judge if self.judge else None,
        )


def slowest(loads: Sequence[Mapping[str, int]], per_kind: Mapping[str, PerDialogue], rates: Rates) -> float:
    """The longest job (generate or judge) of any shard, in seconds."""
    return max(max(s or 0.0 for s in rates.seconds(load, per_kind)) for load in loads)


def array_size(
    scenarios: Sequence[Scenario], trials: int, per_kind: Mapping[str, PerDialogue], rates: Rates, limit: int
) -> int | None:
    """The fewest shards whose every generate and judge job fits in `limit` seconds; None when even one
    user per shard does not."""
    users = len({s.user.index for s in scenarios})
    whole = slowest(shard_loads(scenarios, 1, trials), per_kind, rates)
    count = max(1, min(users, math.ceil(whole / limit)))
    while count <= users:
        if slowest(shard_loads(scenarios, count, trials), per_kind, rates) <= limit:
            return count
        count += 1
    return None
