"""PersonalBench's metrics as pure functions of labels: extraction acceptance, relevance agreement
with the human majority, and the preference of personalized over generic responses.

Means get percentile-bootstrap intervals from report.stats; other statistics (F1, kappa, alpha,
Spearman) resample items with scipy.stats.bootstrap. Items are the resampled unit throughout."""

from __future__ import annotations

import math
import warnings
from collections import Counter
from collections.abc import Callable, Hashable, Mapping, Sequence
from itertools import combinations

import krippendorff
import numpy as np
from scipy import stats as sps
from sklearn.metrics import cohen_kappa_score, precision_recall_fscore_support

from personalens.tables.stats import Bootstrap, Estimate

Item = Hashable
Labels = Mapping[Item, object]  # one rater's label per item
NAN = float("nan")

ATTRIBUTE_LABELS = ("accept", "uncertain", "reject")
FAILURE_REASONS = ("overgeneralization", "task-context confusion", "missing evidence", "not standalone", "other")


def majority(labels: Sequence[object]) -> object | None:
    """The most frequent label; None when there is none or two labels tie for most frequent."""
    ranked = Counter(labels).most_common()
    if not ranked or (len(ranked) > 1 and ranked[0][1] == ranked[1][1]):
        return None
    return ranked[0][0]


def gold(raters: Mapping[str, Labels]) -> dict[Item, object]:
    """The human majority label of each item that has one."""
    by_item: dict[Item, list] = {}
    for labels in raters.values():
        for item, label in labels.items():
            by_item.setdefault(item, []).append(label)
    return {item: m for item, labels in by_item.items() if (m := majority(labels)) is not None}


def resampled(statistic: Callable[[np.ndarray], float], n: int, boot: Bootstrap) -> Estimate:
    """`statistic` of item indices 0..n-1 with a percentile-bootstrap interval over items."""
    point = statistic(np.arange(n)) if n else NAN
    if n < 2 or math.isnan(point):
        return Estimate(point, NAN, NAN, n)
    with warnings.catch_warnings():  # a resample without both classes gives nan, not an error
        warnings.simplefilter("ignore")
        result = sps.bootstrap(
            (np.arange(n),),
            statistic,
            vectorized=False,
            n_resamples=boot.resamples,
            method="percentile",
            random_state=boot.seed,
        )
    lo, hi = result.confidence_interval
    return Estimate(point, float(lo), float(hi), n)


def _quiet(fn: Callable[..., float], *args, **kwargs) -> float:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(fn(*args, **kwargs))


# ---- extraction --------------------------------------------------------------------------------


def extraction(
    raters: Mapping[str, Labels], reasons: Sequence[str], evidence_ok: Sequence[bool], boot: Bootstrap
) -> dict[str, Estimate | None]:
    """Acceptance rate (items whose human majority is "accept"), the share of each failure reason
    among the rejections, and the share of attributes whose evidence quote is not in the cited turn."""
    labels = gold(raters)
    out = {"acceptance rate": boot.estimate([float(v == "accept") for v in labels.values()])}
    for reason in FAILURE_REASONS:
        out[f"failure: {reason}"] = boot.estimate([float(r == reason) for r in reasons])
    out["evidence check failed"] = boot.estimate([float(not ok) for ok in evidence_ok])
    return out


# ---- relevance ---------------------------------------------------------------------------------


def _vectors(items: Sequence[Item], *raters: Labels) -> list[np.ndarray]:
    return [np.array([bool(r[i]) for i in items]) for r in raters]


def prf(truth: Labels, predicted: Labels, boot: Bootstrap) -> dict[str, Estimate]:
    """Precision, recall and F1 of `predicted` against `truth`, on the items both label."""
    items = sorted((i for i in truth if i in predicted), key=str)
    t, p = _vectors(items, truth, predicted)

    def score(k: int) -> Callable[[np.ndarray], float]:
        return lambda idx: (
            float(precision_recall_fscore_support(t[idx], p[idx], average="binary", zero_division=0.0)[k])
            if len(idx)
            else NAN
        )

    return {name: resampled(score(k), len(items), boot) for k, name in enumerate(("precision", "recall", "F1"))}


def over_retrieval(truth: Labels, predicted: Labels, boot: Bootstrap) -> Estimate:
    """The model's selection rate over the humans' selection rate, on the items both label."""
    items = sorted((i for i in truth if i in predicted), key=str)
    t, p = _vectors(items, truth, predicted)
    return resampled(lambda idx: float(p[idx].mean() / t[idx].mean()) if t[idx].any() else NAN, len(items), boot)


def mean_pairwise_kappa(raters: Sequence[Labels], boot: Bootstrap, against: Sequence[Labels] = ()) -> Estimate | None:
    """Mean Cohen's kappa over pairs of `raters` (or, with `against`, over pairs of one rater from
    each side), each pair on the items both label; resampled over the union of items."""
    pairs = [(a, b) for a in raters for b in against] if against else list(combinations(raters, 2))
    items = sorted({i for a, b in pairs for i in a if i in b}, key=str)
    if not pairs or not items:
        return None

    def stat(idx: np.ndarray) -> float:
        chosen = [items[k] for k in idx]
        kappas = []
        for a, b in pairs:
            common = [i for i in chosen if i in a and i in b]
            if common:
                kappas.append(_quiet(cohen_kappa_score, [a[i] for i in common], [b[i] for i in common]))
        kappas = [k for k in kappas if not math.isnan(k)]
        return float(np.mean(kappas)) if kappas else NAN

    return resampled(stat, len(items), boot)


def alpha(raters: Sequence[Labels], level: str = "nominal", values: Sequence[object] | None = None) -> Estimate | None:
    """Krippendorff's alpha of `raters` (items any rater labels; missing labels allowed)."""
    items = sorted({i for r in raters for i in r}, key=str)
    if len(raters) < 2 or not items:
        return None
    codes = {v: k for k, v in enumerate(values or sorted({r[i] for r in raters for i in r if i in r}, key=str))}
    data = np.array([[codes[r[i]] if i in r else np.nan for i in items] for r in raters], dtype=float)
    try:
        value = _quiet(
            krippendorff.alpha, reliability_data=data, level_of_measurement=level, value_domain=list(range(len(codes)))
        )
    except ValueError:  # no pairable labels (each item labelled once) or a single value in the data
        value = NAN
    return Estimate(value, NAN, NAN, len(items))


def relevance(
    humans: Mapping[str, Labels],
    methods: Mapping[str, Labels],
    boot: Bootstrap,
    models: Mapping[str, Labels] | None = None,
) -> dict[str, dict[str, Estimate | None]]:
    """Per method (the model "llm", baselines "bm25", ...): P/R/F1 against the human majority,
    over-retrieval, kappa with each human and Krippendorff's alpha with the humans; "humans": their
    own kappa and alpha; "models": mean kappa between the LLM selections of several models."""
    truth = gold(humans)
    out: dict[str, dict[str, Estimate | None]] = {
        "humans": {
            "human selection rate": boot.estimate([float(v) for v in truth.values()]),
            "kappa human-human": mean_pairwise_kappa(list(humans.values()), boot),
            "alpha humans": alpha(list(humans.values()), values=[False, True]),
        }
    }
    for name, predicted in methods.items():
        out[name] = {
            **prf(truth, predicted, boot),
            "selection rate": boot.estimate([float(predicted[i]) for i in truth if i in predicted]),
            "over-retrieval ratio": over_retrieval(truth, predicted, boot),
            "kappa human-model": mean_pairwise_kappa(list(humans.values()), boot, against=[predicted]),
            "alpha humans+model": alpha([*humans.values(), predicted], values=[False, True]),
        }
    if models and len(models) > 1:
        out["models"] = {"kappa model-model": mean_pairwise_kappa(list(models.values()), boot)}
    return out


# ---- generation and judging --------------------------------------------------------------------


def preference(
    humans: Mapping[str, Labels], judge: Labels, mentions: Labels, boot: Bootstrap
) -> dict[str, Estimate | None]:
    """Ratings of the personalized response against the generic one, 1..5 (3 = about the same):
    the humans' mean (per item, then over items), the share of items the humans rate no better than
    generic (mean <= 3), the judge's mean, judge inflation (judge minus human mean, per item),
    judge-human Spearman correlation, and the judge's rate of explicit attribute mentions."""
    by_item: dict[Item, list[float]] = {}
    for labels in humans.values():
        for item, rating in labels.items():
            by_item.setdefault(item, []).append(float(rating))
    human = {i: float(np.mean(v)) for i, v in by_item.items()}
    both = sorted((i for i in human if i in judge), key=str)
    h, j = np.array([human[i] for i in both]), np.array([float(judge[i]) for i in both])
    return {
        "human preference (1-5)": boot.estimate(list(human.values())),
        "share no better than generic": boot.estimate([float(v <= 3) for v in human.values()]),
        "judge preference (1-5)": boot.estimate([float(v) for v in judge.values()]),
        "judge inflation": boot.estimate(list(j - h)),
        "judge-human Spearman": resampled(
            lambda idx: _quiet(lambda: sps.spearmanr(j[idx], h[idx]).statistic), len(both), boot
        ),
        "explicit mention rate": boot.estimate([float(bool(v)) for v in mentions.values()]),
        "alpha humans (ordinal)": alpha(list(humans.values()), level="ordinal", values=[1, 2, 3, 4, 5]),
    }
