"""Where a mean's noise comes from: the variance components of a nested design, users > scenarios of a
user > trials of a scenario (each trial one simulated dialogue) > judgings of a dialogue (judges, or
one judge again with another seed), with intervals that resample users. Pure numpy, no I/O.

The model: a score y = mu + a_user + b_scenario + c_trial + e_judging, each term independent with
variance s2_user, s2_scenario, s2_trial, s2_judging. The estimates are the method of moments, bottom
up, exact for unbalanced designs: the pooled within-dialogue variance of the judgings estimates
s2_judging; the pooled variance of a scenario's dialogue means estimates s2_trial plus the judgings'
share of it (sum of s2_judging / J_d over its dialogues, known from below), which is subtracted; so
on up to the variance of the users' means. Each estimate is unbiased (it is linear in unbiased
ones) and may fall below 0 when a component is small against the noise of the levels below it.

A level with no replication (one trial per scenario, one judging per dialogue) cannot be told from
the level above: its component is not estimated (None) and stays inside the one above (the
scenario's then holds the dialogue's). With one user, the scenarios are the resampled units and the
user's component is not estimated. Judges of a panel may differ in their means: each judge's mean
offset is removed first (a fixed effect, one degree of freedom per further judge), so the judging
component is the scatter of judgings of one dialogue around the judges' own levels.

Intervals: the users are resampled (a cluster bootstrap: a user brings all its scenarios, trials
and judgings) and the estimates recomputed from per-user sums, the percentile interval expanded for
the number of users (tables/stats.py). tests/test_noise.py gives the simulation that checks them."""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from personalens.tables.stats import Estimate, Replicates, codes_of, interval

LEVELS = ("user", "scenario", "trial", "judging")
_BELOW = ("scenario", "trial", "judging")  # the levels estimated inside a unit


@dataclass(frozen=True)
class Design:
    """How many of each level a mean is over: users, scenarios per user, trials per scenario and
    judgings per dialogue (means where they vary)."""

    users: float
    scenarios: float
    trials: float
    judgings: float


@dataclass(frozen=True)
class Components:
    """Each level's variance (an Estimate with its interval; None where the data cannot tell it from
    the level above) and the design it was measured on."""

    variances: dict[str, Estimate | None]
    design: Design
    units: str  # "user", or "scenario" when one user's scenarios were resampled

    def value(self, level: str) -> float:
        """The level's estimate for a variance of the mean: 0 where it was not estimated (it is inside the
        level above) or fell below 0 (a variance is not negative)."""
        est = self.variances.get(level)
        return 0.0 if est is None or math.isnan(est.mean) else max(0.0, est.mean)

    def per_user(self, design: Design, *, within: bool = False) -> float:
        """The variance one user's mean has under `design` (the variance one user adds to a mean
        over users, as compare's t-test clusters): every component, or with `within` only those of
        the simulated dialogue and the judge (what two runs on the same scenarios do not share)."""
        m, t, j = design.scenarios, design.trials, design.judgings
        dialogue = self.value("trial") / (m * t) + self.value("judging") / (m * t * j)
        if within:
            return dialogue
        return self.value("user") + self.value("scenario") / m + dialogue


@dataclass(frozen=True)
class _UnitSums:
    """Per unit: its mean, and per level below it the sum of squares, its degrees of freedom and the
    coefficients of the lower components in its expectation; the noise of the unit's mean from each
    level below (its variance = s2_unit + sum of noise * s2)."""

    mean: np.ndarray
    ss: dict[str, np.ndarray]
    df: dict[str, np.ndarray]
    coef: dict[tuple[str, str], np.ndarray]  # (level, lower level) -> coefficient per unit
    noise: dict[str, np.ndarray]
    judge_df: int  # degrees of freedom the judges' offsets take from the judging level


def _group_means(values: np.ndarray, codes: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    sizes = np.bincount(codes, minlength=k).astype(np.float64)
    return np.bincount(codes, values, minlength=k) / sizes, sizes


def _parents(child: np.ndarray, parent: np.ndarray, k: int) -> np.ndarray:
    """The parent code of each of k child groups, from rows carrying both codes."""
    out = np.empty(k, dtype=np.intp)
    out[child] = parent
    return out


def _unit_sums(
    values: np.ndarray, units: np.ndarray, scenarios: np.ndarray, dialogues: np.ndarray, judges: np.ndarray | None
) -> _UnitSums:
    n_units, n_scen, n_dial = (int(c.max()) + 1 for c in (units, scenarios, dialogues))
    judge_df = 0
    if judges is not None:
        jcodes, k = codes_of(judges.tolist())
        if k > 1:
            offsets, _ = _group_means(values, jcodes, k)
            values = values - (offsets - values.mean())[jcodes]
            judge_df = k - 1
    d_mean, d_size = _group_means(values, dialogues, n_dial)
    d_scen = _parents(dialogues, scenarios, n_dial)
    s_unit = _parents(scenarios, units, n_scen)
    d_unit = s_unit[d_scen]
    # judgings of a dialogue
    ss_j = np.bincount(units, (values - d_mean[dialogues]) ** 2, minlength=n_units)
    df_j = np.bincount(d_unit, d_size - 1, minlength=n_units)
    # trials of a scenario: dialogue means around the scenario's mean
    s_mean, s_size = _group_means(d_mean, d_scen, n_scen)
    inv_j = 1.0 / d_size
    s_inv_j = np.bincount(d_scen, inv_j, minlength=n_scen)  # sum over its dialogues of 1 / J_d
    ss_t = np.bincount(d_unit, (d_mean - s_mean[d_scen]) ** 2, minlength=n_units)
    df_t = np.bincount(s_unit, s_size - 1, minlength=n_units)
    coef_tj = np.bincount(s_unit, (s_size - 1) * s_inv_j / s_size, minlength=n_units)
    # scenarios of a unit: scenario means around the unit's mean; a scenario mean's noise from below
    a = 1.0 / s_size  # times s2_trial
    b = s_inv_j / s_size**2  # times s2_judging
    u_mean, u_size = _group_means(s_mean, s_unit, n_units)
    ss_s = np.bincount(s_unit, (s_mean - u_mean[s_unit]) ** 2, minlength=n_units)
    df_s = u_size - 1
    mean_a = np.bincount(s_unit, a, minlength=n_units) / u_size
    mean_b = np.bincount(s_unit, b, minlength=n_units) / u_size
    return _UnitSums(
        mean=u_mean,
        ss={"scenario": ss_s, "trial": ss_t, "judging": ss_j},
        df={"scenario": df_s, "trial": df_t, "judging": df_j},
        coef={
            ("trial", "judging"): coef_tj,
            ("scenario", "trial"): df_s * mean_a,
            ("scenario", "judging"): df_s * mean_b,
        },
        noise={"scenario": 1.0 / u_size, "trial": mean_a / u_size, "judging": mean_b / u_size},
        judge_df=judge_df,
    )


def _estimates(sums: _UnitSums, weights: np.ndarray) -> dict[str, np.ndarray]:
    """Every level's estimate for each row of `weights` (resamples x units: how often each unit is
    drawn); nan where a level has no degrees of freedom in a draw."""
    out: dict[str, np.ndarray] = {}
    used: dict[str, np.ndarray] = {}  # the estimates subtracted above: 0 where a level is not estimated
    for level in reversed(_BELOW):
        df = weights @ sums.df[level] - (sums.judge_df if level == "judging" else 0)
        ss = weights @ sums.ss[level]
        for lower in _BELOW[_BELOW.index(level) + 1 :]:
            ss = ss - used[lower] * (weights @ sums.coef.get((level, lower), np.zeros_like(sums.mean)))
        with np.errstate(invalid="ignore", divide="ignore"):
            out[level] = np.where(df > 0, ss / np.where(df > 0, df, 1), np.nan)
        used[level] = np.nan_to_num(out[level])
    total = weights.sum(axis=1)
    mean = (weights @ sums.mean) / total
    spread = (weights * (sums.mean[None, :] - mean[:, None]) ** 2).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        between = np.where(total > 1, spread / np.where(total > 1, total - 1, 1), np.nan)
    for lower in _BELOW:
        between = between - used[lower] * (weights @ sums.noise[lower]) / total
    out["user"] = between
    return out


def components(
    values: Sequence[float] | np.ndarray,
    users: Sequence[Hashable],
    scenarios: Sequence[Hashable],
    dialogues: Sequence[Hashable],
    judges: Sequence[Hashable] | None = None,
    *,
    resamples: int = 1000,
    seed: int = 0,
    level: float = 0.95,
) -> Components:
    """The variance components of `values`, one per judging of a dialogue: each row's user, scenario
    and dialogue (labels unique across the data: a scenario of one user only, a dialogue of one
    scenario only) and, for a panel, its judge."""
    v = np.asarray(values, dtype=np.float64)
    if v.ndim != 1 or v.size == 0:
        raise ValueError(f"variance components need a non-empty 1-d sequence, got shape {v.shape}")
    if not len(users) == len(scenarios) == len(dialogues) == v.size or (judges is not None and len(judges) != v.size):
        raise ValueError("one user, scenario, dialogue (and judge) label per value")
    user_codes, n_users = codes_of(users)
    scen_codes, n_scen = codes_of(scenarios)
    dial_codes, n_dial = codes_of(dialogues)
    one_user = n_users < 2
    units = scen_codes if one_user else user_codes
    sums = _unit_sums(v, units, scen_codes, dial_codes, None if judges is None else np.asarray(judges, dtype=object))
    n = int(units.max()) + 1
    point = {k: float(x[0]) for k, x in _estimates(sums, np.ones((1, n))).items()}
    rng = np.random.default_rng(seed)
    weights = np.stack([np.bincount(rng.integers(0, n, n), minlength=n) for _ in range(resamples)]).astype(np.float64)
    draws = _estimates(sums, weights)
    names = {"user": "scenario", "trial": "trial", "judging": "judging"} if one_user else {k: k for k in LEVELS}
    variances: dict[str, Estimate | None] = dict.fromkeys(LEVELS)
    for name, shown in names.items():  # one user: the units are scenarios, their spread the scenario's
        estimate, kept = point[name], draws[name][~np.isnan(draws[name])]
        if math.isnan(estimate) or kept.size == 0:
            continue
        variances[shown] = Estimate(estimate, *interval(Replicates(estimate, kept, n), level), n)
    design = Design(
        users=float(n_users),
        scenarios=n_scen / n_users,
        trials=n_dial / n_scen,
        judgings=v.size / n_dial,
    )
    return Components(variances, design, "scenario" if one_user else "user")
