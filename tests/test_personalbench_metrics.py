"""PersonalBench metrics on small hand-made labels; expected values are computed here from the
definitions (counts, Cohen's and Krippendorff's formulas, ranks), not by the code under test."""

from __future__ import annotations

from itertools import combinations

import numpy as np
import pytest

from personalens.personalbench import metrics as M
from personalens.tables.stats import Bootstrap

BOOT = Bootstrap(resamples=50, seed=0)


def kappa(a, b):
    labels = sorted(set(a) | set(b))
    n = len(a)
    po = sum(x == y for x, y in zip(a, b)) / n
    pe = sum((a.count(c) / n) * (b.count(c) / n) for c in labels)
    return (po - pe) / (1 - pe)


def nominal_alpha(*raters):
    """Krippendorff's alpha for complete nominal data, from the coincidence matrix."""
    values = sorted({v for r in raters for v in r})
    o = np.zeros((len(values), len(values)))
    m = len(raters)
    for unit in zip(*raters):
        for i, j in ((i, j) for i in range(m) for j in range(m) if i != j):
            o[values.index(unit[i]), values.index(unit[j])] += 1 / (m - 1)
    n_c, n = o.sum(axis=1), o.sum()
    d_o = (o.sum() - np.trace(o)) / n
    d_e = (n * n - (n_c**2).sum()) / (n * (n - 1))
    return 1 - d_o / d_e


def test_majority_and_gold_leave_ties_out():
    assert M.majority(["accept", "reject", "accept"]) == "accept"
    assert M.majority(["accept", "reject"]) is None and M.majority([]) is None
    raters = {"a": {1: True, 2: False, 3: True}, "b": {1: True, 2: True}, "c": {1: False, 2: True, 3: False}}
    assert M.gold(raters) == {1: True, 2: True}  # item 3 ties 1-1


def test_extraction_acceptance_reasons_and_evidence():
    raters = {
        "a": {"x": "accept", "y": "reject", "z": "accept", "w": "uncertain"},
        "b": {"x": "accept", "y": "reject", "z": "reject", "w": "uncertain"},
        "c": {"x": "reject", "y": "reject", "z": "accept", "w": "accept"},
    }
    reasons = ["overgeneralization", "overgeneralization", "missing evidence", "not standalone", "overgeneralization"]
    out = M.extraction(raters, reasons, [True, False, True, True], BOOT)
    assert out["acceptance rate"].mean == pytest.approx(2 / 4) and out["acceptance rate"].n == 4
    assert out["failure: overgeneralization"].mean == pytest.approx(3 / 5)
    assert out["failure: missing evidence"].mean == pytest.approx(1 / 5)
    assert out["failure: task-context confusion"].mean == 0.0
    assert sum(out[f"failure: {r}"].mean for r in M.FAILURE_REASONS) == pytest.approx(1.0)
    assert out["evidence check failed"].mean == pytest.approx(1 / 4)
    e = out["acceptance rate"]
    assert 0.0 <= e.lo <= e.mean <= e.hi <= 1.0


# 8 relevance items, three annotators, the model and a baseline
HUMANS = {"a": [1, 0, 0, 1, 0, 0, 0, 1], "b": [1, 0, 0, 0, 0, 0, 1, 1], "c": [1, 1, 0, 1, 0, 0, 0, 0]}
MODEL = [1, 1, 1, 1, 0, 1, 0, 1]
BM25 = [0, 0, 0, 1, 1, 0, 0, 1]


def _labels(values):
    return {i: bool(v) for i, v in enumerate(values)}


def test_relevance_against_the_human_majority():
    gold = [int(sum(col) >= 2) for col in zip(*HUMANS.values())]
    out = M.relevance(
        {k: _labels(v) for k, v in HUMANS.items()},
        {"llm": _labels(MODEL), "bm25": _labels(BM25)},
        BOOT,
        models={"m1": _labels(MODEL), "m2": _labels(BM25)},
    )
    for name, pred in (("llm", MODEL), ("bm25", BM25)):
        tp = sum(p and g for p, g in zip(pred, gold))
        precision, recall = tp / sum(pred), tp / sum(gold)
        got = out[name]
        assert got["precision"].mean == pytest.approx(precision)
        assert got["recall"].mean == pytest.approx(recall)
        assert got["F1"].mean == pytest.approx(2 * precision * recall / (precision + recall))
        assert got["over-retrieval ratio"].mean == pytest.approx((sum(pred) / 8) / (sum(gold) / 8))
        assert got["selection rate"].mean == pytest.approx(sum(pred) / 8)
        assert got["kappa human-model"].mean == pytest.approx(np.mean([kappa(h, pred) for h in HUMANS.values()]))
        assert got["alpha humans+model"].mean == pytest.approx(nominal_alpha(*HUMANS.values(), pred))
        assert got["F1"].n == 8 and got["F1"].lo <= got["F1"].mean <= got["F1"].hi
    humans = out["humans"]
    assert humans["human selection rate"].mean == pytest.approx(sum(gold) / 8)
    assert humans["kappa human-human"].mean == pytest.approx(
        np.mean([kappa(a, b) for a, b in combinations(HUMANS.values(), 2)])
    )
    assert humans["alpha humans"].mean == pytest.approx(nominal_alpha(*HUMANS.values()))
    assert out["models"]["kappa model-model"].mean == pytest.approx(kappa(MODEL, BM25))
    # the LLM selects more than the humans do: over-retrieval above 1
    assert out["llm"]["over-retrieval ratio"].mean > 1


def test_kappa_uses_only_items_both_raters_labelled():
    a = {1: True, 2: False, 3: True, 4: False}
    b = {1: True, 2: False, 3: False, 5: True}
    got = M.mean_pairwise_kappa([a, b], BOOT)
    assert got.mean == pytest.approx(kappa([1, 0, 1], [1, 0, 0]))


def test_preference_metrics():
    # A/B already converted: ratings of the personalized response, 3 = same as generic
    humans = {"a": {"p1": 4, "p2": 2, "p3": 3, "p4": 5}, "b": {"p1": 5, "p2": 3, "p3": 2, "p4": 4}}
    judge = {"p1": 5, "p2": 4, "p3": 4, "p4": 3}
    mentions = {"p1": True, "p2": False, "p3": True, "p4": False}
    out = M.preference(humans, judge, mentions, BOOT)
    human_mean = {p: (humans["a"][p] + humans["b"][p]) / 2 for p in judge}
    assert out["human preference (1-5)"].mean == pytest.approx(np.mean(list(human_mean.values())))
    assert out["share no better than generic"].mean == pytest.approx(sum(v <= 3 for v in human_mean.values()) / 4)
    assert out["judge preference (1-5)"].mean == pytest.approx(4.0)
    assert out["judge inflation"].mean == pytest.approx(4.0 - np.mean(list(human_mean.values())))

    # Spearman: the Pearson correlation of the ranks (average ranks for ties)
    def ranks(v):
        v = np.asarray(v, float)
        return np.array([np.mean(np.flatnonzero(np.sort(v) == x)) for x in v])

    keys = sorted(judge)
    h, j = ranks([human_mean[k] for k in keys]), ranks([judge[k] for k in keys])
    assert out["judge-human Spearman"].mean == pytest.approx(np.corrcoef(h, j)[0, 1])
    assert out["explicit mention rate"].mean == pytest.approx(0.5)
    assert out["alpha humans (ordinal)"].n == 4


def test_empty_inputs_give_empty_cells_not_errors():
    out = M.relevance({}, {"llm": {}}, BOOT)
    assert out["humans"]["kappa human-human"] is None and out["humans"]["human selection rate"] is None
    assert np.isnan(out["llm"]["F1"].mean) and out["llm"]["F1"].n == 0
    assert M.preference({}, {}, {}, BOOT)["judge inflation"] is None
