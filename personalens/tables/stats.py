"""Means and other statistics with bootstrap confidence intervals (numpy resampling, scipy's
distribution functions; no I/O).

Run results resample **users** (a cluster bootstrap): every scenario of a user is built from one
profile, so a user's dialogues are not independent and resampling them one by one understates the
uncertainty. The trials of a scenario are averaged first. Intervals are percentile intervals
*expanded* for the number of resampled units n (Hesterberg 2015, "What teachers should know about
the bootstrap", The American Statistician 69(4)): the percentiles are taken at the tail share
Phi(-sqrt(n/(n-1)) * t_{n-1, 1-alpha/2}) instead of alpha/2, which undoes the plain percentile
interval's narrowness with few units (a handful of users) and tends to it as n grows. A p-value is
the level at which the expanded interval just reaches the null value, so `p < alpha` exactly when
the 1-alpha interval excludes it (up to the resolution of the resamples). docs/outputs.md and
docs/compare.md give the method and its measured error rates.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

# Bound the (resamples x units) index matrix so that large cells do not need hundreds of MB at once.
_MAX_DRAWS_PER_CHUNK = 4_000_000


@dataclass(frozen=True)
class Replicates:
    """A weighted mean, its bootstrap replicates, and how many units (users or items) were resampled."""

    mean: float
    draws: np.ndarray
    units: int


def codes_of(labels: Sequence[Hashable]) -> tuple[np.ndarray, int]:
    """Integer codes 0..k-1 of `labels` in order of first appearance, and k."""
    index: dict[Hashable, int] = {}
    codes = np.fromiter((index.setdefault(label, len(index)) for label in labels), dtype=np.intp, count=len(labels))
    return codes, len(index)


def replicates(
    values: Sequence[float] | np.ndarray,
    resamples: int = 1000,
    seed: int = 0,
    *,
    weights: Sequence[float] | np.ndarray | None = None,
    clusters: Sequence[Hashable] | None = None,
) -> Replicates:
    """The weighted mean sum(w*v)/sum(w) of `values` and `resamples` bootstrap replicates of it.

    With `clusters` (a label per value) whole clusters are drawn with replacement and the statistic
    is the same ratio over the drawn clusters' values; without, every value is its own unit. With
    `weights`, (value, weight) pairs stay together: a per-dialogue mean weighted by its turn count
    gives the per-turn mean with dialogues, not turns, as the resampled unit.
    """
    v = np.asarray(values, dtype=np.float64)
    w = np.ones_like(v) if weights is None else np.asarray(weights, dtype=np.float64)
    if v.ndim != 1 or v.size == 0:
        raise ValueError(f"a bootstrap needs a non-empty 1-d sequence, got shape {v.shape}")
    if w.shape != v.shape:
        raise ValueError(f"weights have shape {w.shape}, values {v.shape}")
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")
    if clusters is None:
        sums, totals = w * v, w
    else:
        if len(clusters) != v.size:
            raise ValueError(f"{len(clusters)} cluster labels for {v.size} values")
        codes, k = codes_of(clusters)
        sums, totals = np.bincount(codes, w * v, minlength=k), np.bincount(codes, w, minlength=k)
    n = sums.size
    rng = np.random.default_rng(seed)
    chunk = max(1, _MAX_DRAWS_PER_CHUNK // n)
    draws = np.empty(resamples)
    for start in range(0, resamples, chunk):
        stop = min(start + chunk, resamples)
        idx = rng.integers(0, n, size=(stop - start, n))
        draws[start:stop] = sums[idx].sum(axis=1) / totals[idx].sum(axis=1)
    return Replicates(float(np.sum(w * v) / np.sum(w)), draws, n)


def _critical(units: int, level: float) -> float:
    """The expanded percentile interval's normal quantile for `units` resampled units."""
    if units < 2:
        return float(sps.norm.ppf(0.5 + level / 2))
    return math.sqrt(units / (units - 1)) * float(sps.t.ppf(0.5 + level / 2, units - 1))


def interval(rep: Replicates, level: float = 0.95, *, expanded: bool = True) -> tuple[float, float]:
    """(lo, hi): the percentile interval of `rep`, expanded for its number of units (or the plain
    alpha/2 percentiles with `expanded=False`, the method of reports before user clustering)."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    z = _critical(rep.units, level) if expanded else float(sps.norm.ppf(0.5 + level / 2))
    tail = 100.0 * float(sps.norm.cdf(-z))
    lo, hi = np.percentile(rep.draws, [tail, 100.0 - tail])
    # Float rounding in the resampled sums can put a bound a hair past the mean of a constant sample.
    return float(min(lo, rep.mean)), float(max(hi, rep.mean))


def p_value(rep: Replicates, null: float = 0.0) -> float:
    """Two-sided p-value of `null`: the level 1-p at which the expanded interval's nearer end reaches
    `null`. The share of replicates on the far side of `null` (ties count on both sides; one is added
    to it and to the resamples, so p is never 0) is turned into the normal quantile z it cuts off, and
    p = 2 * P(T_{n-1} > z * sqrt((n-1)/n)), inverting `_critical`."""
    draws = rep.draws
    beyond = min(int(np.sum(draws <= null)), int(np.sum(draws >= null)))
    share = (1 + beyond) / (draws.size + 1)
    if share >= 0.5:
        return 1.0
    z = -float(sps.norm.ppf(share))
    if rep.units < 2:
        return min(1.0, 2 * float(sps.norm.sf(z)))
    n = rep.units
    return min(1.0, 2 * float(sps.t.sf(z * math.sqrt((n - 1) / n), n - 1)))


def scenario_means(
    values: Sequence[float],
    scenarios: Sequence[Hashable],
    weights: Sequence[float] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The trials of each scenario averaged: (value, weight, index of its first row) per scenario.

    A scenario's value is its trials' weighted mean and its weight their mean weight, so a scenario
    run k times counts once, not k times, in a mean over scenarios."""
    v = np.asarray(values, dtype=np.float64)
    w = np.ones_like(v) if weights is None else np.asarray(weights, dtype=np.float64)
    codes, k = codes_of(scenarios)
    first = np.full(k, v.size, dtype=np.intp)
    np.minimum.at(first, codes, np.arange(v.size))
    trials = np.bincount(codes, minlength=k)
    total = np.bincount(codes, w, minlength=k)
    return np.bincount(codes, w * v, minlength=k) / total, total / trials, first


def bootstrap_statistic(
    statistic: Callable[[np.ndarray], float],
    n: int,
    resamples: int = 1000,
    seed: int = 0,
    *,
    level: float = 0.95,
) -> tuple[float, float, float]:
    """(value, lo, hi): `statistic` of items 0..n-1 and its (plain) percentile interval over items.

    `statistic` takes an array of item indices (drawn with replacement), for statistics that are no
    mean, such as a kappa over dialogues. Resamples where it is undefined (nan) are left out.
    """
    if n < 1 or resamples < 1:
        raise ValueError(f"bootstrap_statistic needs n >= 1 and resamples >= 1, got {n} and {resamples}")
    value = float(statistic(np.arange(n)))
    rng = np.random.default_rng(seed)
    stats = np.array([statistic(rng.integers(0, n, size=n)) for _ in range(resamples)], dtype=np.float64)
    stats = stats[~np.isnan(stats)]
    if math.isnan(value) or stats.size == 0:
        return value, math.nan, math.nan
    return (value, *interval(Replicates(value, stats, n), level, expanded=False))


@dataclass(frozen=True)
class Estimate:
    """One table cell: a mean with its 95% interval, the n behind it and the judgments left out."""

    mean: float
    lo: float
    hi: float
    n: int
    unparsed: int = 0

    def scaled(self, factor: float) -> Estimate:
        return Estimate(self.mean * factor, self.lo * factor, self.hi * factor, self.n, self.unparsed)


@dataclass(frozen=True)
class Bootstrap:
    """The resampling settings shared by every cell of a report.

    `by_user` and `expanded` are the method (docs/outputs.md); switched off together they give the
    per-dialogue percentile intervals of reports before user clustering, which bench/intervals.py
    sets beside the current ones."""

    resamples: int = 1000
    seed: int = 0
    by_user: bool = True
    expanded: bool = True

    def describe(self) -> str:
        """The method in one sentence, for a page's or table's heading."""
        if not self.by_user:
            return f"intervals are percentile bootstrap over dialogues ({self.resamples} resamples, seed {self.seed})"
        return (
            "95% intervals resample users (a cluster bootstrap: a user's scenarios stay together, the "
            "trials of a scenario are averaged first; a cell of one user resamples its scenarios), "
            f"{'expanded ' if self.expanded else ''}percentile, {self.resamples} resamples, seed {self.seed} "
            "(docs/outputs.md)"
        )

    def replicates(
        self,
        values: Sequence[float],
        *,
        weights: Sequence[float] | None = None,
        users: Sequence[Hashable] | None = None,
        scenarios: Sequence[Hashable] | None = None,
    ) -> Replicates:
        """Replicates of the mean of `values`: with `scenarios` the trials of a scenario are averaged
        first (the mean is then over scenarios); with `users` whole users are resampled when the
        values come from more than one (a single user's scenarios are resampled one by one)."""
        if scenarios is not None and self.by_user:
            values, weights, first = scenario_means(values, scenarios, weights)
            users = None if users is None else [users[i] for i in first]
        clusters = users if self.by_user and users is not None and len(set(users)) > 1 else None
        return replicates(values, self.resamples, self.seed, weights=weights, clusters=clusters)

    def interval(self, rep: Replicates) -> tuple[float, float]:
        return interval(rep, expanded=self.expanded)

    def estimate(
        self,
        values: Sequence[float],
        *,
        unparsed: int = 0,
        weights: Sequence[float] | None = None,
        users: Sequence[Hashable] | None = None,
        scenarios: Sequence[Hashable] | None = None,
    ) -> Estimate | None:
        """The cell for `values` (n counts them, before trials are averaged); None when there is
        nothing to average."""
        if len(values) == 0:
            return None
        rep = self.replicates(values, weights=weights, users=users, scenarios=scenarios)
        return Estimate(rep.mean, *self.interval(rep), len(values), unparsed)
