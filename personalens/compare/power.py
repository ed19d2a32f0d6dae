"""Power of `compare`'s test from a pilot: pure functions of how a metric's paired differences vary.

The test is a t-test of the mean difference over n users with its cluster-robust standard error;
its power at n users follows from the variance one user adds (tables/power.py). The level is
alpha / m for a family of m tests: the threshold Holm's correction applies to the smallest p, so the
figure is Holm's power when the family's other metrics do not differ and conservative when some do.
docs/compare.md gives the simulation that checks it."""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from personalens.tables.stats import codes_of


def intra_user_correlation(values: Sequence[float] | np.ndarray, users: Sequence[Hashable]) -> float:
    """The share of the values' variance between users: the one-way ANOVA estimate
    (MSB - MSW) / (MSB + (n0 - 1) MSW), n0 the mean group size corrected for unequal groups.
    nan when there are fewer than two users, no user with two values, or no variance at all."""
    v = np.asarray(values, dtype=np.float64)
    codes, k = codes_of(users)
    sizes = np.bincount(codes, minlength=k).astype(np.float64)
    total = v.size
    if k < 2 or total <= k:
        return math.nan
    means = np.bincount(codes, v, minlength=k) / sizes
    between = float(sizes @ (means - v.mean()) ** 2) / (k - 1)
    within = float(np.sum((v - means[codes]) ** 2)) / (total - k)
    n0 = (total - float(sizes @ sizes) / total) / (k - 1)
    denominator = between + (n0 - 1) * within
    return (between - within) / denominator if denominator > 0 else math.nan


@dataclass(frozen=True)
class PowerPlan:
    """What `compare.power` asks: the power to plan for, and differences (by metric key, on the
    metric's shown scale: TCR in percentage points) whose users needed are wanted."""

    target: float = 0.8
    differences: tuple[tuple[str, float], ...] = ()

    def difference(self, key: str) -> float | None:
        return dict(self.differences).get(key)
