"""Length against score (personalens/report/length.py): Spearman's rho, and the coverage of its
user-clustered interval in a seeded simulation where users generate data of a known rank
correlation."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps

from personalens.report.length import rank_correlation, spearman
from personalens.tables.stats import Bootstrap

# Each user u draws a level (a_u, b_u) of length and score, correlated R_USER; each of its dialogues
# adds noise (e, f) correlated R_DIALOGUE, of the same variance. (x, y) = (a_u + e, b_u + f) is then
# bivariate normal with Pearson's r = (R_USER + R_DIALOGUE) / 2, whose Spearman's rho is
# 6 / pi * asin(r / 2). A user's dialogues hang together, as a user's dialogues do in a run.
R_USER, R_DIALOGUE = 0.7, 0.1
TRUE_RHO = 6 / math.pi * math.asin((R_USER + R_DIALOGUE) / 4)
USERS, DIALOGUES_PER_USER = 30, (4, 16)
DRAWS, RESAMPLES = 200, 300
TOLERANCE = 0.05  # over 3 binomial standard errors of a coverage of 0.95 at 200 draws (0.015)


def draw(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, list[str]]:
    sizes = rng.integers(DIALOGUES_PER_USER[0], DIALOGUES_PER_USER[1] + 1, size=USERS)
    owner = np.repeat(np.arange(USERS), sizes)
    levels = rng.multivariate_normal([0, 0], [[1, R_USER], [R_USER, 1]], size=USERS)
    noise = rng.multivariate_normal([0, 0], [[1, R_DIALOGUE], [R_DIALOGUE, 1]], size=owner.size)
    x, y = (levels[owner] + noise).T
    return x, y, [f"user{u}" for u in owner]


def test_spearman_is_scipys_with_ties_and_nan_when_constant():
    x = np.array([3.0, 1.0, 2.0, 2.0, 5.0, 4.0])
    y = np.array([1.0, 1.0, 2.0, 3.0, 4.0, 4.0])
    assert spearman(x, y) == pytest.approx(sps.spearmanr(x, y).statistic)
    assert math.isnan(spearman(x, np.ones_like(x)))


def test_the_user_clustered_interval_covers_the_true_rank_correlation_95_percent_of_the_time():
    rng = np.random.default_rng(47)
    clustered = Bootstrap(RESAMPLES, seed=1)
    by_dialogue = Bootstrap(RESAMPLES, seed=1, by_user=False, expanded=False)
    covered = {"users": 0, "dialogues": 0}
    for k in range(DRAWS):
        x, y, users = draw(rng)
        for name, boot in (("users", clustered), ("dialogues", by_dialogue)):
            cell = rank_correlation(x, y, users, Bootstrap(boot.resamples, k, boot.by_user, boot.expanded))
            covered[name] += cell.lo <= TRUE_RHO <= cell.hi
    coverage = {name: hits / DRAWS for name, hits in covered.items()}
    assert abs(coverage["users"] - 0.95) <= TOLERANCE, coverage
    # resampling dialogues as if they were independent gives intervals too narrow for clustered data
    assert coverage["dialogues"] < coverage["users"] - TOLERANCE, coverage


def test_a_cell_needs_three_dialogues():
    boot = Bootstrap(50)
    assert rank_correlation([1.0, 2.0], [1.0, 2.0], ["a", "b"], boot) is None
    cell = rank_correlation([1.0, 2.0, 3.0, 4.0], [1.0, 3.0, 2.0, 4.0], ["a", "a", "b", "b"], boot)
    assert cell.mean == pytest.approx(0.8) and cell.n == 4 and cell.lo <= cell.mean <= cell.hi
