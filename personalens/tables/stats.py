"""Means and other statistics with bootstrap confidence intervals (numpy resampling, scipy's
distribution functions; no I/O).

Run results resample **users** (a cluster bootstrap): every scenario of a user is built from one
profile, so a user's dialogues are not independent and resampling them one by one understates the
uncertainty. The trials of a scenario are averaged first. Intervals are percentile intervals
*expanded* for the number of resampled units n (Hesterberg 2015, "What teachers should know about
the bootstrap", The American Statistician 69(4)): the percentiles are taken at the tail share
Phi(-sqrt(n/(n-1)) * t_{n-1, 1-alpha/2}) instead of alpha/2, which undoes the plain percentile
interval's narrowness with few units (a handful of users) and tends to it as n grows.

A p-value is analytic, from the same unit: a t-test of the mean over n users with the cluster-robust
(linearized) standard error and n-1 degrees of freedom (`ClusteredMean`). The expanded interval is
about mean +- t_{n-1} times that standard error, so the two agree up to the bootstrap's skew and
resampling noise; unlike a p-value counted from resamples this one has no floor, so a difference
of many standard errors gets a p small enough for any multiple-testing correction (`holm`).
docs/outputs.md and docs/compare.md give the methods and their measured error rates.
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


@dataclass(frozen=True)
class ClusteredMean:
    """The mean of values pooled over their clusters (their sum over their count), its
    cluster-robust standard error and the number of clusters n behind it (the t-test's n - 1
    degrees of freedom). `per_cluster_variance` is n * se^2, the variance that one cluster adds:
    the standard error at another number of clusters like these follows from it (compare/power.py)."""

    mean: float
    se: float
    units: int

    @property
    def per_cluster_variance(self) -> float:
        return self.units * self.se**2

    def p(self, null: float = 0.0) -> float:
        """Two-sided p of `null` from t = (mean - null) / se on n - 1 degrees of freedom; nan with
        fewer than 2 units. A standard error of 0 (every unit the same mean) gives 1 at the null and
        0 elsewhere."""
        if self.units < 2:
            return math.nan
        if self.se == 0.0:
            return 1.0 if self.mean == null else 0.0
        return float(2 * sps.t.sf(abs(self.mean - null) / self.se, self.units - 1))


def clustered_mean(values: Sequence[float] | np.ndarray, clusters: Sequence[Hashable] | None = None) -> ClusteredMean:
    """The mean of `values` with its cluster-robust standard error over `clusters` (a label per
    value); without clusters, or when all values share one, every value is its own unit (as
    `Bootstrap.replicates` resamples them).

    The mean is the ratio sum(S_u) / sum(N_u) of the clusters' sums S_u and sizes N_u; its
    linearized variance is n / (n - 1) * sum((S_u - mean * N_u)^2) / sum(N_u)^2 (the sandwich
    estimator with the small-sample factor n / (n - 1)), which the bootstrap over clusters
    approximates with 1 in place of that factor."""
    v = np.asarray(values, dtype=np.float64)
    if v.ndim != 1 or v.size == 0:
        raise ValueError(f"a mean needs a non-empty 1-d sequence, got shape {v.shape}")
    if clusters is not None and len(clusters) != v.size:
        raise ValueError(f"{len(clusters)} cluster labels for {v.size} values")
    codes, k = codes_of(clusters) if clusters is not None else (None, 1)
    if k > 1:
        sums, sizes = np.bincount(codes, v, minlength=k), np.bincount(codes, minlength=k).astype(np.float64)
    else:
        sums, sizes = v, np.ones_like(v)
    n, total = sums.size, float(sizes.sum())
    mean = float(sums.sum() / total)
    if n < 2:
        return ClusteredMean(mean, math.nan, n)
    residuals = sums - mean * sizes
    return ClusteredMean(mean, math.sqrt(n / (n - 1) * float(residuals @ residuals)) / total, n)


def holm(p_values: Sequence[float] | np.ndarray) -> np.ndarray:
    """Holm's step-down adjusted p-values, in the input's order: the i-th smallest of m p-values
    (from i = 0) times m - i, made non-decreasing in that order and capped at 1. Rejecting where the
    adjusted p is below alpha keeps the chance of any false rejection among the m at most alpha."""
    p = np.asarray(p_values, dtype=np.float64)
    order = np.argsort(p, kind="stable")
    adjusted = np.empty_like(p)
    adjusted[order] = np.minimum(1.0, np.maximum.accumulate((p.size - np.arange(p.size)) * p[order]))
    return adjusted


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
    clusters: Sequence[Hashable] | None = None,
) -> tuple[float, float, float]:
    """(value, lo, hi): `statistic` of items 0..n-1 and its percentile interval.

    `statistic` takes an array of item indices (drawn with replacement), for statistics that are no
    mean, such as a kappa or a rank correlation over dialogues. Resamples where it is undefined (nan)
    are left out. Without `clusters` the items are resampled and the interval is the plain
    percentile one; with `clusters` (a label per item, e.g. the user) whole clusters are drawn, each
    bringing all its items, and the interval is expanded for the number of clusters as the report's
    means are (one cluster: its items are resampled, as a mean's cell of one user).
    """
    if n < 1 or resamples < 1:
        raise ValueError(f"bootstrap_statistic needs n >= 1 and resamples >= 1, got {n} and {resamples}")
    if clusters is not None and len(clusters) != n:
        raise ValueError(f"{len(clusters)} cluster labels for {n} items")
    value = float(statistic(np.arange(n)))
    codes, k = codes_of(clusters) if clusters is not None else (None, 1)
    # each cluster's items, when there are several clusters; else the items are the units
    members = np.split(np.argsort(codes, kind="stable"), np.cumsum(np.bincount(codes))[:-1]) if k > 1 else None
    units = k if members is not None else n
    rng = np.random.default_rng(seed)

    def draw() -> np.ndarray:
        picked = rng.integers(0, units, size=units)
        return picked if members is None else np.concatenate([members[c] for c in picked])

    stats = np.array([statistic(draw()) for _ in range(resamples)], dtype=np.float64)
    stats = stats[~np.isnan(stats)]
    if math.isnan(value) or stats.size == 0:
        return value, math.nan, math.nan
    return (value, *interval(Replicates(value, stats, units), level, expanded=clusters is not None))


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
