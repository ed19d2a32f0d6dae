"""Where a score's noise comes from (docs/validation.md#where-a-scores-noise-comes-from): the nested
variance components recover known ones in a seeded simulation, with the coverage of their intervals
stated; the report's noise table from judgments of two trials and two judges; the smallest detectable
difference against simulated power; plan's trial-or-judging advice from the components and costs."""

from __future__ import annotations

import numpy as np
import pytest

from personalens.report.noise import detectable_differences, noise_table
from personalens.store.metrics import P
from personalens.store.results import Judgment, Scenario
from personalens.tables.components import Components, Design, components
from personalens.tables.stats import Bootstrap, Estimate, clustered_mean

TRUE = {"user": 1.0, "scenario": 0.8, "trial": 0.5, "judging": 0.3}


def simulate(seed: int, users: int = 30, scenarios: int = 5, trials: int = 2, judgings: int = 2, offset: float = 0.5):
    """Scores of a balanced nested design with the TRUE components; each judge `offset` above the last."""
    rng = np.random.default_rng(seed)
    shape = (users, scenarios, trials, judgings)
    y = (
        rng.normal(0, TRUE["user"] ** 0.5, shape[:1])[:, None, None, None]
        + rng.normal(0, TRUE["scenario"] ** 0.5, shape[:2])[:, :, None, None]
        + rng.normal(0, TRUE["trial"] ** 0.5, shape[:3])[:, :, :, None]
        + rng.normal(0, TRUE["judging"] ** 0.5, shape)
        + offset * np.arange(judgings)
    )
    idx = np.indices(shape).reshape(4, -1).T
    return (
        y.reshape(-1),
        [u for u, *_ in idx],
        [(u, s) for u, s, *_ in idx],
        [(u, s, t) for u, s, t, _ in idx],
        [j for *_, j in idx],
    )


def test_the_components_recover_known_ones_and_their_intervals_cover_them():
    """200 seeded simulations of 30 users x 5 scenarios x 2 trials x 2 judges (the second judge 0.5
    higher), 400 resamples each. Measured: mean estimates 1.004, 0.786, 0.505, 0.302 against 1.0, 0.8,
    0.5, 0.3; coverage of the 95% intervals 86.5% (users), 92.0% (scenarios), 93.0% (trials), 95.0%
    (judgings). A variance's interval from 30 resampled users covers less than its level, the more so
    the fewer units stand behind the level (30 users, 150 scenarios): docs/validation.md says so."""
    runs = 200
    estimates = {k: [] for k in TRUE}
    covered = dict.fromkeys(TRUE, 0)
    for seed in range(runs):
        c = components(*simulate(seed), resamples=400, seed=seed)
        for level, truth in TRUE.items():
            est = c.variances[level]
            estimates[level].append(est.mean)
            covered[level] += est.lo <= truth <= est.hi
    for level, truth in TRUE.items():
        mean = float(np.mean(estimates[level]))
        se = float(np.std(estimates[level])) / runs**0.5
        assert abs(mean - truth) < 3 * se + 0.01, (level, mean, truth)  # unbiased
    coverage = {k: v / runs for k, v in covered.items()}
    assert coverage["judging"] >= 0.91 and coverage["trial"] >= 0.89 and coverage["scenario"] >= 0.88, coverage
    assert coverage["user"] >= 0.82, coverage


def test_a_level_without_replication_is_not_estimated_and_stays_in_the_one_above():
    y, users, scenarios, dialogues, judges = simulate(1, users=40, trials=1, judgings=2, offset=0.0)
    c = components(y, users, scenarios, dialogues, judges, resamples=200)
    assert c.variances["trial"] is None and c.design.trials == 1
    # the scenario's estimate holds the dialogue's: 0.8 + 0.5
    assert c.variances["scenario"].lo < TRUE["scenario"] + TRUE["trial"] < c.variances["scenario"].hi
    one = [i for i, u in enumerate(users) if u == 0]  # one user: its scenarios are the units
    c1 = components(y[one], [users[i] for i in one], [scenarios[i] for i in one], [dialogues[i] for i in one])
    assert c1.units == "scenario" and c1.variances["user"] is None and c1.variances["scenario"] is not None


def test_the_detectable_difference_is_found_with_its_power_in_simulated_runs():
    """The smallest difference found with 80% power between two independent runs like this one, by
    compare's test (scenario differences, t-test over users with their cluster-robust standard error):
    pairs of simulated runs B - A with that difference are found about 80% of the time (measured
    76.7% of 300 pairs)."""
    users, scenarios = 40, 5
    design = Design(users, scenarios, 2, 2)
    known = Components({k: Estimate(v, v, v, users) for k, v in TRUE.items()}, design, "user")
    independent, within = detectable_differences(known)
    assert 0 < within < independent
    # from one simulated run's estimates: near the figure of the known components
    measured, _ = detectable_differences(components(*simulate(7, users=users, offset=0.0), resamples=200))
    assert 0.7 * independent < measured < 1.3 * independent

    def scenario_means(seed: int) -> np.ndarray:
        return simulate(seed, users=users, scenarios=scenarios, offset=0.0)[0].reshape(users, scenarios, -1).mean(-1)

    clusters = np.repeat(np.arange(users), scenarios)
    found = sum(
        clustered_mean((scenario_means(20_000 + s) + independent - scenario_means(10_000 + s)).ravel(), clusters).p()
        < 0.05
        for s in range(300)
    )
    assert 0.72 <= found / 300 <= 0.88, found / 300


def judgment(user: str, task: str, trial: int, judge: str, score: float, kind: str = "SD") -> Judgment:
    return Judgment(
        Scenario(user, task, trial), "m", "base", kind, ("Movies",), "personalization", "", -1, score, True, judge=judge
    )


def test_the_noise_table_splits_each_metric_and_is_absent_without_replication():
    rng = np.random.default_rng(0)
    level = rng.normal(0, 0.7, 8)  # users differ
    rows = [
        judgment(f"u{u}", f"t{t}", trial, judge, float(np.clip(round(2.5 + level[u] + rng.normal()), 1, 4)))
        for u in range(8)
        for t in range(3)
        for trial in range(2)
        for judge in ("a", "b")
    ]
    table = noise_table(rows, Bootstrap(200, 0))
    (row,) = [r for r in table.rows if r[0][-1] == P.label]
    cells = dict(zip([c.key for c in table.columns], row[1]))
    assert cells["users"] == 8 and cells["trials"] == 2.0 and cells["judgings"] == 2.0
    assert all(cells[k] is not None and cells[k].lo <= cells[k].mean <= cells[k].hi for k in TRUE)
    assert cells["mde"] > cells["mde_within"] > 0
    once = [j for j in rows if j.scenario.trial == 0 and j.judge == "a"]
    assert noise_table(once, Bootstrap(200, 0)) is None


def test_the_mean_variance_at_another_design_follows_the_components():
    from personalens.plan.noise import mean_variance

    c = Components({k: Estimate(v, v, v, 10) for k, v in TRUE.items()}, Design(10, 5, 1, 1), "user")
    assert mean_variance(c, Design(10, 5, 1, 1)) == pytest.approx(1.0 / 10 + 0.8 / 50 + 0.5 / 50 + 0.3 / 50)
    # a second trial halves the dialogue's and the judge's shares; a second judging the judge's alone
    assert mean_variance(c, Design(10, 5, 2, 1)) == pytest.approx(1.0 / 10 + 0.8 / 50 + 0.5 / 100 + 0.3 / 100)
    assert mean_variance(c, Design(10, 5, 1, 2)) == pytest.approx(1.0 / 10 + 0.8 / 50 + 0.5 / 50 + 0.3 / 100)
