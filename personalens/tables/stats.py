"""Means and other statistics with percentile-bootstrap confidence intervals (pure numpy, no I/O)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

# Bound the (resamples x n) index matrix so that large cells do not need hundreds of MB at once.
_MAX_DRAWS_PER_CHUNK = 4_000_000


def bootstrap_ci(
    values: Sequence[float] | np.ndarray,
    resamples: int = 1000,
    seed: int = 0,
    *,
    weights: Sequence[float] | np.ndarray | None = None,
    level: float = 0.95,
) -> tuple[float, float, float]:
    """(mean, lo, hi): the mean of `values` and its percentile-bootstrap interval.

    With `weights` the statistic is the weighted mean sum(w*v)/sum(w), resampling (value, weight)
    pairs together: a per-dialogue mean weighted by its turn count gives the per-turn mean with
    dialogues, not turns, as the resampled unit.
    """
    v = np.asarray(values, dtype=np.float64)
    w = np.ones_like(v) if weights is None else np.asarray(weights, dtype=np.float64)
    if v.ndim != 1 or v.size == 0:
        raise ValueError(f"bootstrap_ci needs a non-empty 1-d sequence, got shape {v.shape}")
    if w.shape != v.shape:
        raise ValueError(f"weights have shape {w.shape}, values {v.shape}")
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    mean = float(np.sum(w * v) / np.sum(w))
    rng = np.random.default_rng(seed)
    n = v.size
    chunk = max(1, _MAX_DRAWS_PER_CHUNK // n)
    stats = np.empty(resamples)
    for start in range(0, resamples, chunk):
        stop = min(start + chunk, resamples)
        idx = rng.integers(0, n, size=(stop - start, n))
        stats[start:stop] = np.sum(w[idx] * v[idx], axis=1) / np.sum(w[idx], axis=1)
    tail = 100.0 * (1.0 - level) / 2.0
    lo, hi = np.percentile(stats, [tail, 100.0 - tail])
    # Float rounding in the resampled sums can put a bound a hair past the mean of a constant sample.
    return mean, float(min(lo, mean)), float(max(hi, mean))


def bootstrap_statistic(
    statistic: Callable[[np.ndarray], float],
    n: int,
    resamples: int = 1000,
    seed: int = 0,
    *,
    level: float = 0.95,
) -> tuple[float, float, float]:
    """(value, lo, hi): `statistic` of items 0..n-1 and its percentile-bootstrap interval.

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
    tail = 100.0 * (1.0 - level) / 2.0
    lo, hi = np.percentile(stats, [tail, 100.0 - tail])
    return value, float(lo), float(hi)


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
    """The resampling settings shared by every cell of a report."""

    resamples: int = 1000
    seed: int = 0

    def estimate(
        self,
        values: Sequence[float],
        *,
        unparsed: int = 0,
        weights: Sequence[float] | None = None,
    ) -> Estimate | None:
        """The cell for `values`; None when there is nothing to average."""
        if len(values) == 0:
            return None
        mean, lo, hi = bootstrap_ci(values, self.resamples, self.seed, weights=weights)
        return Estimate(mean, lo, hi, len(values), unparsed)
