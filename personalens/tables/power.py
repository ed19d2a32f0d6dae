"""Power of a t-test of a mean over n users with its cluster-robust standard error (tables/stats.py),
from the variance one user adds: pure functions of how a metric's values vary.

For users like a pilot's (the same selection, so about as many scenarios each), that standard error
is sqrt(V / n), V the variance one user adds (`ClusteredMean.per_cluster_variance`). A true
difference d is then detected with the probability that a noncentral t on n - 1 degrees of freedom,
noncentrality d / sqrt(V / n), falls beyond the test's critical value. `compare` plans with these
(compare/power.py), and the report's noise table gives the smallest difference a run detects."""

from __future__ import annotations

import math

from scipy import optimize
from scipy import stats as sps


def power(difference: float, users: int, per_user_variance: float, level: float) -> float:
    """The chance that the two-sided t-test at `level` finds a true `difference` with `users` users."""
    if users < 2:
        return math.nan
    if per_user_variance == 0.0:
        return 1.0 if difference != 0.0 else level
    df = users - 1
    critical = float(sps.t.isf(level / 2, df))
    shift = abs(difference) / math.sqrt(per_user_variance / users)
    # the far tail is below level / 2 and falls with the shift; scipy returns nan where it underflows
    far = float(sps.nct.cdf(-critical, df, shift))
    return float(sps.nct.sf(critical, df, shift)) + (0.0 if math.isnan(far) else far)


def detectable(users: int, per_user_variance: float, level: float, target: float = 0.8) -> float:
    """The smallest difference found with probability `target` at `users` users."""
    if users < 2:
        return math.nan
    if per_user_variance == 0.0:
        return 0.0
    high = math.sqrt(per_user_variance / users)
    while power(high, users, per_user_variance, level) < target:
        high *= 2
    return float(optimize.brentq(lambda d: power(d, users, per_user_variance, level) - target, 0.0, high))


def users_needed(difference: float, per_user_variance: float, level: float, target: float = 0.8) -> int:
    """The fewest users (at least 2) with which a true `difference` is found with probability `target`:
    from the normal approximation, then stepped to the t-test's exact count."""
    if difference == 0.0:
        raise ValueError("no number of users finds a difference of 0")
    if per_user_variance == 0.0:
        return 2
    z = float(sps.norm.isf(level / 2) + sps.norm.ppf(target))
    n = max(2, math.ceil(z**2 * per_user_variance / difference**2))
    while power(difference, n, per_user_variance, level) < target:
        n += 1
    while n > 2 and power(difference, n - 1, per_user_variance, level) >= target:
        n -= 1
    return n
