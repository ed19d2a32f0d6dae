"""The report's intervals: a cluster bootstrap over users (trials of a scenario averaged first),
expanded percentile (tables/stats.py), checked by hand-computed cases and by a seeded simulation of
its coverage on runs whose scores are clustered by user (docs/outputs.md)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps
from synthetic_runs import completion
from test_report import judge_all, make_dialogue, write_run

from personalens.report import build_report
from personalens.tables.stats import Bootstrap, Replicates, clustered_mean, interval, replicates, scenario_means

# ---- the resampling, by hand ---------------------------------------------------------------------


def test_replicates_are_seeded_and_contain_the_mean():
    values = np.random.default_rng(1).integers(1, 5, size=50).astype(float)
    rep = replicates(values, 500, 3)
    lo, hi = interval(rep)
    assert rep.mean == pytest.approx(values.mean()) and lo < rep.mean < hi and rep.units == 50
    assert np.array_equal(replicates(values, 500, 3).draws, rep.draws)
    assert not np.array_equal(replicates(values, 500, 4).draws, rep.draws)


def test_interval_shrinks_with_more_data():
    small = np.random.default_rng(2).integers(0, 2, size=30).astype(float)
    large = np.tile(small, 30)  # same distribution, 30x the dialogues
    lo_s, hi_s = interval(replicates(small, 1000, 0))
    lo_l, hi_l = interval(replicates(large, 1000, 0))
    assert (hi_l - lo_l) < 0.4 * (hi_s - lo_s)  # ~1/sqrt(30) of the width


def test_weighted_mean_is_the_pooled_mean():
    rep = replicates([10.0, 40.0], 200, 0, weights=[1, 3])
    lo, hi = interval(rep)
    assert rep.mean == pytest.approx((10 * 1 + 40 * 3) / 4) and 10.0 <= lo <= rep.mean <= hi <= 40.0


def test_empty_or_mismatched_input_is_refused():
    with pytest.raises(ValueError, match="non-empty"):
        replicates([], 100, 0)
    with pytest.raises(ValueError, match="3 cluster labels for 2 values"):
        replicates([1.0, 2.0], 100, 0, clusters=["a", "b", "c"])


def test_clusters_are_drawn_whole():
    # user a: two scenarios scoring 1; user b: one scoring 4. A resample holds 0, 1 or 2 copies of b.
    rep = replicates([1.0, 1.0, 4.0], 2000, 0, clusters=["a", "a", "b"])
    assert set(np.round(rep.draws, 12)) == {1.0, 2.0, 4.0}  # (1+1+1+1)/4, (1+1+4)/3, 4/1
    assert rep.units == 2 and rep.mean == 2.0
    # with 2 units the expanded interval reaches both extremes: [1, 4]
    assert interval(rep) == (1.0, 4.0)


def test_trials_of_a_scenario_are_averaged_first():
    values, weights, first = scenario_means([1.0, 3.0, 4.0, 2.0], [("u", "t1"), ("u", "t1"), ("u", "t2"), ("v", "t3")])
    assert values.tolist() == [2.0, 4.0, 2.0] and weights.tolist() == [1.0, 1.0, 1.0] and first.tolist() == [0, 2, 3]
    # weighted (tokens per turn): a scenario's trials pool their turns; its weight is their mean turn count
    values, weights, _ = scenario_means([10.0, 40.0], ["s", "s"], weights=[1, 3])
    assert values.tolist() == [(10 + 120) / 4] and weights.tolist() == [2.0]


def test_one_user_resamples_its_scenarios_and_several_resample_users():
    boot = Bootstrap(400, 7)
    values = [1.0, 0.0, 1.0, 1.0, 0.0]
    alone = boot.replicates(values, users=["u"] * 5, scenarios=list("abcde"))
    assert alone.units == 5 and np.array_equal(alone.draws, replicates(values, 400, 7).draws)
    users = ["u", "u", "v", "v", "w"]
    clustered = boot.replicates(values, users=users, scenarios=list("abcde"))
    assert clustered.units == 3 and np.array_equal(clustered.draws, replicates(values, 400, 7, clusters=users).draws)
    old = Bootstrap(400, 7, by_user=False, expanded=False).replicates(values, users=users, scenarios=list("abcde"))
    assert old.units == 5


def test_expanded_percentile_takes_the_t_corrected_tail():
    draws = np.linspace(-1.0, 1.0, 100_001)
    rep = Replicates(0.0, draws, 5)
    z = math.sqrt(5 / 4) * sps.t.ppf(0.975, 4)  # 3.10: the tails are 0.1%, not 2.5%
    tail = sps.norm.cdf(-z)
    assert interval(rep) == pytest.approx((-1 + 2 * tail, 1 - 2 * tail), abs=1e-4)
    assert interval(rep, expanded=False) == pytest.approx((-0.95, 0.95), abs=1e-4)
    # with many units the expansion vanishes
    assert interval(Replicates(0.0, draws, 100_000)) == pytest.approx((-0.95, 0.95), abs=1e-3)


def test_clustered_mean_and_its_t_test_by_hand():
    # users a (1, 2, 3), b (4), c (0, 2): sums S 6, 4, 2 over N 3, 1, 2; mean 12 / 6 = 2; residuals
    # S - 2 N = 0, 2, -2; se = sqrt(3 / 2 * 8) / 6 = sqrt(12) / 6; t = 2 / se = sqrt(12) on 2 df,
    # whose two-sided p is 1 - t / sqrt(t^2 + 2)
    test = clustered_mean([1.0, 2.0, 3.0, 4.0, 0.0, 2.0], ["a", "a", "a", "b", "c", "c"])
    assert (test.mean, test.units) == (2.0, 3) and test.se == pytest.approx(math.sqrt(12) / 6)
    assert test.p() == pytest.approx(1 - math.sqrt(12 / 14))
    assert test.per_cluster_variance == pytest.approx(3 * 12 / 36)
    # one cluster: every value its own unit (as the bootstrap does); one value: no test
    alone = clustered_mean([1.0, 3.0], ["a", "a"])
    assert (alone.units, alone.se, alone.p(2.0)) == (2, 1.0, 1.0)
    assert math.isnan(clustered_mean([1.0]).p())
    # no spread: p is 1 at the mean, 0 elsewhere
    assert clustered_mean([0.5, 0.5], ["a", "b"]).p() == 0.0 and clustered_mean([0.0, 0.0], ["a", "b"]).p() == 1.0


def test_the_t_test_agrees_with_the_expanded_interval():
    """The null at the 90% expanded interval's end gets p of about 0.1: p < alpha where the interval
    excludes the null, up to the bootstrap's skew and resampling noise."""
    rng = np.random.default_rng(0)
    users = np.repeat(np.arange(40), 30)
    values = rng.normal(0.0, 1.0, 40)[users] + rng.normal(0.0, 1.0, users.size)
    boot = Bootstrap(20_000, 0)
    lo, hi = interval(boot.replicates(values, users=users.tolist()), 0.9)
    test = clustered_mean(values, users.tolist())
    assert test.p(lo) == pytest.approx(0.1, abs=0.01) and test.p(hi) == pytest.approx(0.1, abs=0.01)


# ---- coverage, simulated -------------------------------------------------------------------------

DRAWS = 200


def test_user_clustered_interval_covers_the_completion_rate_and_per_dialogue_does_not():
    """200 seeded synthetic runs of 50 users whose completion rates vary (Beta(3, 2), so the true
    rate is 0.6): the report's interval covers 0.6 in 95% +- 3 points of them (97% measured).
    Resampling dialogues, as reports did before, covers it in about half (checked on the first 40
    draws with fewer resamples: it is the slow one, 2,000 units a resample)."""
    users, dialogues = Bootstrap(1000, 0), Bootstrap(200, 0, by_user=False, expanded=False)
    covered = {"users": 0, "dialogues": 0}
    for seed in range(DRAWS):
        tc, owner = completion(np.random.default_rng(seed), 50)
        for name, boot in (("users", users), ("dialogues", dialogues)) if seed < 40 else (("users", users),):
            est = boot.estimate(tc, users=owner.tolist(), scenarios=list(range(tc.size)))
            covered[name] += est.lo <= 0.6 <= est.hi
    assert 0.92 <= covered["users"] / DRAWS <= 0.98, covered
    assert covered["dialogues"] / 40 < 0.75, covered


# ---- in the report -------------------------------------------------------------------------------


def test_report_cells_resample_users_and_average_trials(tmp_path):
    """Two users: one completes all four of its tasks, the other none. Resampling users, a resample
    holds 0, 1 or 2 copies of the first, so the interval spans [0, 100]; resampling dialogues gave
    a narrow one. A scenario run twice counts once in the mean."""
    dialogues, judgments = [], []
    for i, (user, tc) in enumerate([("user1", 1.0)] * 4 + [("user2", 0.0)] * 4):
        d = make_dialogue(i, "SD", ["Books"])
        d["user_id"] = user
        dialogues.append(d)
        judgments += judge_all(d, tc, 2.0 + (i % 2))
    # a second trial of user2's first task, P 4 where its first trial had 2: that scenario's P is 3
    again = dict(dialogues[4], trial=1, seed=99)
    dialogues.append(again)
    judgments += judge_all(again, 0.0, 4.0)
    run = write_run(tmp_path / "run", dialogues, judgments, shards=1)
    report = build_report([run], tmp_path / "out", bootstrap=2000)
    tcr = report.table3.cell(("m1",), "SD_TCR")
    assert (tcr.mean, tcr.lo, tcr.hi, tcr.n) == (50.0, 0.0, 100.0, 9)
    p = report.table3.cell(("m1",), "SD_P")
    assert p.mean == pytest.approx((2 + 3 + 2 + 3 + 3 + 3 + 2 + 3) / 8)  # user2's first scenario: (2 + 4) / 2
    assert "95% intervals resample users" in (tmp_path / "out" / "report.md").read_text()
