"""The length-controlled difference of `compare` (docs/compare.md#length-controlled-difference): a pure
length effect gives a length-controlled difference near 0 whose interval covers 0 at about its level,
a true effect at equal length is kept (seeded simulations); and compare.csv carries it beside the
plain difference for written runs whose replies differ in length."""

from __future__ import annotations

import csv

import numpy as np
from test_compare import save_configs
from test_report import judge_all, write_run

from personalens.compare import build_comparison
from personalens.compare.length import length_controlled
from personalens.tables.stats import Bootstrap

USERS, SCENARIOS = 30, 6
PER_WORD = 0.01  # the judge's reward per word of reply


def paired(rng: np.random.Generator, effect: float, longer: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(score difference B - A, length difference B - A, user) per scenario: both arms score
    user + scenario effects + PER_WORD x their reply length + noise; B's replies are `longer` words
    longer on average (each scenario's difference spread N(0, 20)) and B is better by `effect` at
    equal length."""
    user = np.repeat(np.arange(USERS), SCENARIOS)
    shared = rng.normal(0, 0.5, USERS)[user] + rng.normal(0, 0.5, user.size)
    length_a = rng.normal(100, 20, user.size)
    length_b = length_a + longer + rng.normal(0, 20, user.size) + rng.normal(0, 10, USERS)[user]
    a = shared + PER_WORD * length_a + rng.normal(0, 0.4, user.size)
    b = shared + effect + PER_WORD * length_b + rng.normal(0, 0.4, user.size) + rng.normal(0, 0.1, USERS)[user]
    return b - a, length_b - length_a, user


def coverage(effect: float, longer: float, runs: int = 200) -> tuple[float, float, float]:
    """(mean plain difference, mean length-controlled difference, share of intervals covering `effect`)."""
    plain, controlled, covered = [], [], 0
    for seed in range(runs):
        d, x, users = paired(np.random.default_rng(seed), effect, longer)
        est = length_controlled(d, x, users.tolist(), Bootstrap(400, seed))
        plain.append(d.mean())
        controlled.append(est.mean)
        covered += est.lo <= effect <= est.hi
    return float(np.mean(plain)), float(np.mean(controlled)), covered / runs


def test_a_pure_length_effect_is_controlled_to_zero_with_nominal_coverage():
    """B's replies 30 words longer, no other difference: the plain difference is the length's reward
    (0.3), the controlled one near 0. Measured over 400 seeded runs of 30 users x 6 scenarios, 400
    resamples each: mean plain difference 0.298, controlled 0.002, coverage of 0 by the 95% interval
    93.5% (the test runs the first 200 and accepts 88-98%)."""
    plain, controlled, covered = coverage(effect=0.0, longer=30.0)
    assert abs(plain - 30 * PER_WORD) < 0.03 and abs(controlled) < 0.03
    assert 0.88 <= covered <= 0.98, covered


def test_a_true_effect_at_equal_length_is_kept():
    """B better by 0.4 with replies as long as A's: both differences near 0.4, and the controlled
    one's interval covers it at about its level (measured over 400 runs: controlled 0.400, coverage
    93.3%; 89.5% over the first 200, which the test runs)."""
    plain, controlled, covered = coverage(effect=0.4, longer=0.0)
    assert abs(plain - 0.4) < 0.03 and abs(controlled - 0.4) < 0.03
    assert 0.88 <= covered <= 0.98, covered


def test_compare_writes_the_control_beside_the_plain_difference(tmp_path):
    """Two runs of 3 users x 2 scenarios: B's replies are longer where its P is higher, so its P
    difference is all length; the control column is there and nearer 0 than the plain difference."""
    from run_rows import dialogue_row

    runs = []
    for name, extra in (("a", 0), ("b", 1)):
        dialogues, judgments = [], []
        for u in range(3):
            for t in range(2):
                gain = extra * (u + t) % 3  # how much longer and better B's reply is here
                words = " ".join(["word"] * (20 + 10 * gain))
                turns = [{"role": "user", "text": "hi", "completion_tokens": 1}]
                turns.append({"role": "assistant", "text": words, "completion_tokens": 1})
                d = dialogue_row(f"user{u}", f"SD-{t}", "SD", ["Movies"], turns=turns)
                dialogues.append(d)
                judgments += judge_all(d, 1.0, 1.0 + gain)
        write_run(tmp_path / name, dialogues, judgments, shards=1)
        runs.append(save_configs(tmp_path / name))
    build_comparison(runs, tmp_path / "cmp", bootstrap=200)
    with open(tmp_path / "cmp" / "compare.csv", newline="") as f:
        (p,) = [r for r in csv.DictReader(f) if r["kind"] == "SD" and r["metric"] == "P"]
    assert float(p["difference_mean"]) > 0.5
    assert abs(float(p["length_controlled_mean"])) < 1e-9  # every point on one line through 0
    assert "B - A at equal length (control)" in (tmp_path / "cmp" / "compare.md").read_text()
