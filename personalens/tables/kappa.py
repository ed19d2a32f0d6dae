"""Agreement between two raters of the same items: Cohen's kappa, unweighted or with quadratic
weights, with an interval that resamples users as the report's other intervals do (stats.py).

kappa = 1 - sum(w * O) / sum(w * E) over the raters' (k x k) table of shares O, E the product of its
margins (the agreement chance alone gives), w the disagreement weights: 1 off the diagonal
(unweighted, Cohen 1960: for task completion's two values) or ((i - j) / (k - 1))^2 (quadratic,
Cohen 1968: for the ordinal 1-4 and 1-5 scores, where a 3 against a 4 is a smaller disagreement
than a 1 against a 4). A resample draws users with replacement and keeps all of a drawn user's
items; each user's table is counted once, so a resample is a sum of tables. No I/O.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np

from personalens.tables.stats import Bootstrap, Estimate, Replicates, codes_of, interval

WEIGHTS = ("none", "quadratic")


def disagreement(categories: int, weights: str) -> np.ndarray:
    """The (k x k) disagreement weights of `weights` (WEIGHTS)."""
    if weights not in WEIGHTS:
        raise ValueError(f"weights must be one of {WEIGHTS}, got {weights!r}")
    i, j = np.indices((categories, categories))
    if weights == "none":
        return (i != j).astype(np.float64)
    return ((i - j) / max(categories - 1, 1)) ** 2


def kappas(tables: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Kappa of each (k x k) count table in `tables` (shape (..., k, k)); nan where chance alone
    agrees fully (every item in one category for both raters)."""
    shares = tables / tables.sum(axis=(-2, -1), keepdims=True)
    expected = shares.sum(axis=-1)[..., :, None] * shares.sum(axis=-2)[..., None, :]
    observed_w, expected_w = (shares * w).sum(axis=(-2, -1)), (expected * w).sum(axis=(-2, -1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(expected_w > 0, 1.0 - observed_w / expected_w, np.nan)


def kappa_estimate(
    a: Sequence[float],
    b: Sequence[float],
    scale: Sequence[float],
    boot: Bootstrap,
    *,
    weights: str,
    users: Sequence[Hashable] | None = None,
) -> Estimate | None:
    """Kappa between ratings `a` and `b` of the same items on `scale` (their possible values, in
    order), with its interval resampling `users` (a label per item; items one by one without them,
    with a single user, or when `boot` does not cluster), expanded as `boot` says; None without
    items. Ratings off the scale are refused."""
    if len(a) != len(b):
        raise ValueError(f"{len(a)} ratings against {len(b)}")
    if not a:
        return None
    code = {float(v): i for i, v in enumerate(scale)}
    off = sorted({float(x) for x in (*a, *b)} - code.keys())
    if off:
        raise ValueError(f"ratings {off} are off the scale {list(scale)}")
    k = len(scale)
    cells = np.array([code[float(x)] * k + code[float(y)] for x, y in zip(a, b)])
    clustered = boot.by_user and users is not None and len(set(users)) > 1
    units, n = codes_of(users) if clustered else (np.arange(len(cells)), len(cells))
    per_unit = np.zeros((n, k * k))
    np.add.at(per_unit, (units, cells), 1.0)
    w = disagreement(k, weights)
    value = float(kappas(per_unit.sum(axis=0).reshape(k, k), w))
    rng = np.random.default_rng(boot.seed)
    drawn = rng.integers(0, n, size=(boot.resamples, n))
    counts = np.zeros((boot.resamples, n))
    np.add.at(counts, (np.arange(boot.resamples)[:, None], drawn), 1.0)
    draws = kappas((counts @ per_unit).reshape(-1, k, k), w)
    draws = draws[~np.isnan(draws)]
    if np.isnan(value) or draws.size == 0:
        return Estimate(float("nan"), float("nan"), float("nan"), len(cells))
    lo, hi = interval(Replicates(value, draws, n), expanded=boot.expanded)
    return Estimate(value, lo, hi, len(cells))
