"""The paired comparison's statistics checked like code (docs/compare.md): Holm's correction and its
families against hand-computed cases; the t-test over users and the interval by seeded simulation
(A/A error rate and coverage at 10, 20 and 50 users, synthetic runs clustered by user); the power
figure against simulated power; and a large effect marked significant after Holm on written runs."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as sps
from synthetic_runs import aa_pair, better_pair, write_run
from test_compare import save_configs

from personalens.compare import build_comparison
from personalens.compare.paired import Arm, Comparison, MetricDifference, correct
from personalens.compare.power import intra_user_correlation
from personalens.store.metrics import TCR
from personalens.tables.power import detectable, power, users_needed
from personalens.tables.stats import Bootstrap, clustered_mean, holm

BOOT = Bootstrap(1000, 0)
USERS = (10, 20, 50)

# ---- Holm and its families, by hand --------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "adjusted"),
    [
        # sorted 0.01, 0.03, 0.04, 0.2 times 4, 3, 2, 1: 0.04, 0.09, 0.08, 0.2; running max 0.04, 0.09, 0.09, 0.2
        ([0.01, 0.04, 0.03, 0.2], [0.04, 0.09, 0.09, 0.2]),
        # 0.001 * 4, 0.005 * 3, 0.02 * 2, 0.04 * 1, all increasing already
        ([0.001, 0.02, 0.005, 0.04], [0.004, 0.04, 0.015, 0.04]),
        ([0.5, 0.6], [1.0, 1.0]),  # 0.5 * 2 caps at 1, and 0.6 rises to it
        ([0.03, 0.03, 0.0], [0.06, 0.06, 0.0]),  # ties: 0 * 3, 0.03 * 2, 0.03 * 1 -> 0.06
        ([0.2], [0.2]),
        ([], []),
    ],
)
def test_holm_by_hand(raw, adjusted):
    assert holm(raw).tolist() == pytest.approx(adjusted)


def _comparison(*p: float) -> Comparison:
    arm = Arm(Path("r"), "m", "base", ())
    rows = tuple(MetricDifference("SD", TCR, None, None, None, 5, x) for x in p)
    return Comparison("runs", arm, arm, rows, 0, 0)


def test_families_are_corrected_together_as_asked():
    first, second = _comparison(0.01, 0.04, math.nan), _comparison(0.02)
    by = {family: correct([first, second], family) for family in ("all", "comparison", "none")}
    # all: 0.01, 0.02, 0.04 times 3, 2, 1 -> 0.03, 0.04, 0.04
    assert [r.p_holm for c in by["all"] for r in c.rows if not math.isnan(r.p)] == pytest.approx([0.03, 0.04, 0.04])
    assert [c.family for c in by["all"]] == [3, 3]
    # comparison: 0.01 * 2, 0.04 * 1 -> 0.02, 0.04; the second alone keeps 0.02
    assert [r.p_holm for r in by["comparison"][0].rows[:2]] == pytest.approx([0.02, 0.04])
    assert by["comparison"][1].rows[0].p_holm == pytest.approx(0.02) and [c.family for c in by["comparison"]] == [2, 1]
    # none: each test its own family of one
    assert [r.p_holm for r in by["none"][0].rows[:2]] == pytest.approx([0.01, 0.04])
    assert math.isnan(by["none"][0].rows[2].p_holm) and [c.family for c in by["none"]] == [1, 1]


# ---- error rates, simulated ----------------------------------------------------------------------


def _decisions(draws: int, seed: int, users: int, pair, truth: float):
    """(p < 0.05, the expanded 95% interval excludes `truth`) over seeded draws of `pair`."""
    rejected, outside = np.zeros(draws, bool), np.zeros(draws, bool)
    for k in range(draws):
        a, b, owner = pair(np.random.default_rng(seed + k), users)
        labels = owner.tolist()
        lo, hi = BOOT.interval(BOOT.replicates(b - a, users=labels))
        rejected[k] = clustered_mean(b - a, labels).p(truth) < 0.05
        outside[k] = not lo <= truth <= hi
    return rejected, outside


@pytest.mark.parametrize("users", USERS)
def test_aa_comparisons_reject_at_the_nominal_rate_and_agree_with_the_interval(users):
    """Two runs drawn from one distribution, each with its own effect per user: p < 0.05 in 5% +- 2
    points of 1,000 seeded comparisons (the share's standard deviation is 0.7 points; 4.9%, 5.6% and
    6.2% at 10, 20 and 50 users with these seeds, 5.5%, 5.2% and 5.0% over 2,000 others in
    bench/calibration.py), and the 95% interval excludes 0 in nearly the same ones (the decisions
    differ in 1.9%, 1.0% and 0.9% of them)."""
    rejected, outside = _decisions(1000, 1_000 * users, users, aa_pair, 0.0)
    assert abs(rejected.mean() - 0.05) <= 0.02, rejected.mean()
    assert np.mean(rejected != outside) <= 0.03, np.mean(rejected != outside)


def test_resampling_scenarios_instead_of_users_would_be_caught():
    """The t-test over scenarios (the wrong unit) rejects far more often than 5% in A/A draws."""
    wrong = [
        clustered_mean(b - a).p() < 0.05 for a, b, _ in (aa_pair(np.random.default_rng(s), 50) for s in range(100))
    ]
    assert np.mean(wrong) > 0.2, np.mean(wrong)


@pytest.mark.parametrize("users", USERS)
def test_a_known_improvement_is_covered_and_detected(users):
    """B better than A on P by 0.3 for every user on average: the 95% interval covers 0.3 in 95% +- 2
    points of 1,000 seeded comparisons (the share's standard deviation is 0.7 points; 94.6%, 94.9%
    and 95.4% at 10, 20 and 50 users with these seeds), and the t-test of the true 0.3 rejects it in
    5% +- 2 points (5.9%, 4.8%, 5.0%)."""
    rejected, outside = _decisions(1000, 50_000 + 1_000 * users, users, lambda rng, n: better_pair(rng, n, 0.3), 0.3)
    assert abs(1 - outside.mean() - 0.95) <= 0.02, 1 - outside.mean()
    assert abs(rejected.mean() - 0.05) <= 0.02, rejected.mean()


# ---- power, planned against simulated ------------------------------------------------------------

STUDIES = 20_000
FAMILY = 12  # a comparison of two runs: 12 metrics
LEVEL = 0.05 / FAMILY


def _studies(pilot, users: int, difference: float, seed: int) -> tuple[np.ndarray, list]:
    """p-values of `STUDIES` studies of `users` users drawn with replacement from the pilot's users,
    their differences moved to mean `difference`: the t-test of `clustered_mean` computed for all
    studies at once from the drawn users' sums S and sizes N; and three studies' scenario values
    with their user labels, to check that computation against `clustered_mean` itself."""
    values, owner = pilot
    sizes = np.bincount(owner).astype(float)
    sums = np.bincount(owner, values) - (values.mean() - difference) * sizes
    drawn = np.random.default_rng(seed).integers(0, sizes.size, (STUDIES, users))
    s, n = sums[drawn], sizes[drawn]
    mean = s.sum(axis=1) / n.sum(axis=1)
    se = np.sqrt(users / (users - 1) * ((s - mean[:, None] * n) ** 2).sum(axis=1)) / n.sum(axis=1)
    p = 2 * sps.t.sf(np.abs(mean) / se, users - 1)
    moved = values - values.mean() + difference
    examples = [
        (np.concatenate([moved[owner == u] for u in row]), np.repeat(np.arange(users), sizes[row].astype(int)))
        for row in drawn[:3]
    ]
    return p, examples


@pytest.mark.parametrize("users", USERS)
def test_planned_power_matches_simulated_power(users):
    """A pilot of two A/A runs of 400 users is the population. In 20,000 studies of 10, 20 or 50 of
    its users (drawn with replacement) whose true difference is the one `compare` prints as
    detectable with 80% power, the P row is significant after Holm beside 11 metrics that do not
    differ (uniform p-values) in 80% +- 2 points of them (the share's standard deviation is 0.3
    points; 80.0%, 79.9% and 79.9% at 10, 20 and 50 users). At half that difference the plan is
    conservative: planned 16.7%, 15.8% and 15.6%, simulated 21.4%, 18.1% and 16.7%; the test allows
    the plan 5 points below the simulation and 1 above."""
    a, b, owner = aa_pair(np.random.default_rng(7), 400)
    variance = clustered_mean(b - a, owner.tolist()).per_cluster_variance
    full = detectable(users, variance, LEVEL)
    assert power(full, users, variance, LEVEL) == pytest.approx(0.8)
    rng = np.random.default_rng(users)
    for difference, low, high in ((full, -0.02, 0.02), (full / 2, -0.01, 0.05)):
        p, examples = _studies((b - a, owner), users, difference, seed=users)
        assert [clustered_mean(v, u.tolist()).p() for v, u in examples] == pytest.approx(p[:3].tolist())
        others = rng.random((STUDIES, FAMILY - 1))
        simulated = np.mean([holm([x, *rest])[0] < 0.05 for x, rest in zip(p, others)])
        planned = power(difference, users, variance, LEVEL)
        assert low <= simulated - planned <= high, (difference, planned, simulated)


def test_intra_user_correlation_by_hand():
    # users a (1, 3), b (5, 7): means 2 and 6 around 4; MSB = (2 * 4 + 2 * 4) / 1 = 16, MSW = 4 / 2 = 2,
    # n0 = (4 - 8 / 4) / 1 = 2: (16 - 2) / (16 + 2)
    assert intra_user_correlation([1.0, 3.0, 5.0, 7.0], ["a", "a", "b", "b"]) == pytest.approx(14 / 18)
    # no user with two values, or one user: no estimate
    assert math.isnan(intra_user_correlation([1.0, 2.0], ["a", "b"]))
    assert math.isnan(intra_user_correlation([1.0, 2.0], ["a", "a"]))


def test_users_needed_is_the_fewest_with_the_power_asked():
    variance = 0.5
    n = users_needed(0.2, variance, LEVEL)
    assert power(0.2, n, variance, LEVEL) >= 0.8 > power(0.2, n - 1, variance, LEVEL)
    assert users_needed(0.2, variance, 0.05) < n  # a family of one needs fewer
    # a little above the normal approximation (z_{1 - level/2} + z_0.8)^2 V / d^2: t's heavier tails
    z = 2.8653 + 0.8416  # z for 0.05 / 12 / 2 and for 0.8
    assert z**2 * variance / 0.04 < n < 1.05 * z**2 * variance / 0.04
    assert detectable(n, variance, LEVEL) <= 0.2 < detectable(n - 1, variance, LEVEL)


# ---- a large effect on written runs ----------------------------------------------------------------


def _raised_pair(folder: Path, users: int) -> tuple[Path, Path]:
    """Runs A and B of `users` users that differ by P one point higher on every other scenario of
    each user in B (about +0.45) and in nothing else."""
    a = save_configs(write_run(folder / "a", users, seed=users))
    return a, save_configs(write_run(folder / "b", users, seed=users, raised=True))


def test_a_large_effect_on_p_alone_is_significant_after_holm(tmp_path):
    """At 10 users, +0.45 on P alone: both kinds' P are marked significant after Holm over the 12
    tests, nothing else is (20 users: tests/test_compare.py, through the command line)."""
    users = 10
    a, b = _raised_pair(tmp_path, users)
    (c,) = build_comparison([a, b], tmp_path / "out", bootstrap=500).comparisons
    assert (c.users, c.family) == (users, 12)
    marked = [(r.kind, r.metric.key) for r in c.rows if r.significant(0.05)]
    assert marked == [("SD", "P"), ("MD", "P")], [(r.kind, r.name, r.p_holm) for r in c.rows]
    p = next(r for r in c.rows if r.metric.key == "P")
    assert 0.4 < p.difference.mean < 0.5 and p.p_holm < 1e-6
    assert all(r.p == 1.0 and r.difference.mean == 0.0 for r in c.rows if r.metric.key != "P")
