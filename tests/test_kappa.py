"""Kappa between two raters (tables/kappa.py): the value against statsmodels, and the coverage of its
user-clustered interval over seeded simulations of scripted judges made to agree to a known degree."""

from __future__ import annotations

import numpy as np
import pytest
from statsmodels.stats.inter_rater import cohens_kappa

from personalens.tables.kappa import kappa_estimate
from personalens.tables.stats import Bootstrap


@pytest.mark.parametrize(("weights", "wt"), [("none", None), ("quadratic", "quadratic")])
def test_kappa_is_statsmodels_kappa(weights, wt):
    rng = np.random.default_rng(1)
    a = rng.integers(1, 6, 300)
    b = np.where(rng.random(300) < 0.5, a, rng.integers(1, 6, 300))
    table = np.zeros((5, 5))
    np.add.at(table, (a - 1, b - 1), 1)
    expected = cohens_kappa(table, wt=wt, return_results=False) if wt else cohens_kappa(table, return_results=False)
    est = kappa_estimate(list(a), list(b), [1, 2, 3, 4, 5], Bootstrap(200), weights=weights)
    assert est.mean == pytest.approx(expected)
    assert est.lo < est.mean < est.hi and est.n == 300


def test_perfect_and_off_scale_and_empty():
    boot = Bootstrap(100)
    assert kappa_estimate([1, 2, 3, 4] * 5, [1, 2, 3, 4] * 5, [1, 2, 3, 4], boot, weights="quadratic").mean == 1.0
    assert kappa_estimate([], [], [0, 1], boot, weights="none") is None
    with pytest.raises(ValueError, match="off the scale"):
        kappa_estimate([1, 7], [1, 2], [1, 2, 3], boot, weights="none")


def scripted_judges(rng, users: int, items: int, k: int, agreement: float):
    """Judge A scores uniformly on 1..k; judge B copies A with a user's own probability p_u (drawn
    around `agreement`, so users agree more or less, as real users' dialogues do) and else scores
    uniformly at random. With uniform margins both the unweighted and the quadratic kappa equal the
    copy probability: the truth is E[p_u] = `agreement`."""
    p = rng.beta(agreement * 2, (1 - agreement) * 2, users)
    user = np.repeat(np.arange(users), items)
    a = rng.integers(1, k + 1, users * items)
    copy = rng.random(users * items) < p[user]
    b = np.where(copy, a, rng.integers(1, k + 1, users * items))
    return a, b, user


@pytest.mark.parametrize(("weights", "k"), [("none", 2), ("quadratic", 4)])
def test_clustered_interval_covers_the_true_kappa(weights, k):
    truth, covered, sims = 0.6, 0, 200
    for seed in range(sims):
        rng = np.random.default_rng(seed)
        a, b, user = scripted_judges(rng, users=20, items=15, k=k, agreement=truth)
        est = kappa_estimate(list(a), list(b), range(1, k + 1), Bootstrap(500, seed), weights=weights, users=user)
        covered += est.lo <= truth <= est.hi
    # 95% nominal; 200 simulations give a binomial standard error of about 1.5 points
    assert 0.90 <= covered / sims <= 0.99, covered / sims


def test_dialogue_resampling_undercovers_clustered_agreement():
    """The same simulations resampled item by item cover the truth far less often: users differ in
    how much the judges agree, which only resampling users carries into the interval."""
    truth, covered, sims = 0.6, 0, 100
    for seed in range(sims):
        rng = np.random.default_rng(seed)
        a, b, user = scripted_judges(rng, users=20, items=15, k=4, agreement=truth)
        boot = Bootstrap(500, seed, by_user=False, expanded=False)
        est = kappa_estimate(list(a), list(b), range(1, 5), boot, weights="quadratic", users=user)
        covered += est.lo <= truth <= est.hi
    assert covered / sims < 0.85, covered / sims
