"""The length-controlled difference: B - A with the difference in the assistants' reply lengths
regressed out, a control beside the plain difference (docs/compare.md#length-controlled-difference).

A judge that rewards longer replies makes a longer-winded assistant look better. AlpacaEval's
length-controlled win rate (arXiv 2404.04475) fits the preference on the length difference and reads
it off at a difference of 0; here the paired analogue: over the scenarios both arms scored, the
score difference d_s (each side's trials averaged) is regressed on the reply-length difference x_s
(the assistant's mean reply length in words, each side's trials averaged), d = a + b x, and the
control is a, the difference at equal length. Its interval resamples users (the regression refitted
on each draw), expanded percentile, as every interval of compare. It answers "would B still differ
from A if its replies were as long?", under a linear length effect; it is no replacement for the
plain difference, which is what a reader of the replies gets. tests/test_length_control.py gives
the simulation that checks it."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np

from personalens.compare.paired import Comparison, ScenarioKey, scenario_scores
from personalens.store.metrics import Metric
from personalens.store.replies import DialogueKey
from personalens.tables.stats import Bootstrap, Estimate, Replicates, codes_of, interval

MIN_SCENARIOS = 3  # a line through fewer points leaves no residual to judge it by


def scenario_lengths(lengths: Mapping[DialogueKey, float], model: str, setting: str) -> dict[ScenarioKey, float]:
    """Per scenario of one assistant model and setting, its mean reply length over its trials."""
    trials: dict[ScenarioKey, list[float]] = defaultdict(list)
    for (_, user, task, s, _, m), words in lengths.items():
        if (m, s) == (model, setting):
            trials[(user, task)].append(words)
    return {key: sum(w) / len(w) for key, w in trials.items()}


def _intercepts(d: np.ndarray, x: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """The weighted least-squares intercept of d on x for each row of `weights`; nan where x does not vary."""
    total = weights.sum(axis=1)
    mx, md = (weights @ x) / total, (weights @ d) / total
    sxx = (weights * (x[None, :] - mx[:, None]) ** 2).sum(axis=1)
    sxd = (weights * (x[None, :] - mx[:, None]) * (d[None, :] - md[:, None])).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        slope = np.where(sxx > 1e-12 * np.maximum(1.0, total), sxd / sxx, np.nan)
    return md - slope * mx


def length_controlled(d: Sequence[float], x: Sequence[float], users: Sequence[str], boot: Bootstrap) -> Estimate | None:
    """The intercept of the regression of the differences `d` on the length differences `x` (one per
    scenario, `users` its user) with its interval resampling users; None with fewer than
    MIN_SCENARIOS scenarios or lengths that never differ."""
    dv, xv = np.asarray(d, dtype=np.float64), np.asarray(x, dtype=np.float64)
    if dv.size < MIN_SCENARIOS:
        return None
    (value,) = _intercepts(dv, xv, np.ones((1, dv.size)))
    if np.isnan(value):
        return None
    codes, k = codes_of(users) if boot.by_user and len(set(users)) > 1 else (np.arange(dv.size), dv.size)
    rng = np.random.default_rng(boot.seed)
    members = np.zeros((k, dv.size))
    members[codes, np.arange(dv.size)] = 1.0
    drawn = np.stack([np.bincount(rng.integers(0, k, k), minlength=k) for _ in range(boot.resamples)])
    draws = _intercepts(dv, xv, drawn.astype(np.float64) @ members)
    kept = draws[~np.isnan(draws)]
    if kept.size == 0:
        return None
    return Estimate(float(value), *interval(Replicates(float(value), kept, k), expanded=boot.expanded), dv.size)


def with_length_control(
    c: Comparison, lengths_a: Mapping[ScenarioKey, float], lengths_b: Mapping[ScenarioKey, float], boot: Bootstrap
) -> Comparison:
    """`c` with each row's length-controlled difference, over the scenarios both arms scored and
    both have a reply length for."""
    metrics: list[Metric] = list(dict.fromkeys(r.metric for r in c.rows))
    scores_a, scores_b = scenario_scores(c.a.judgments, metrics), scenario_scores(c.b.judgments, metrics)
    rows = []
    for r in c.rows:
        a, b = scores_a.get((r.kind, r.metric), {}), scores_b.get((r.kind, r.metric), {})
        shared = sorted(a.keys() & b.keys() & lengths_a.keys() & lengths_b.keys())
        est = length_controlled(
            [b[s] - a[s] for s in shared],
            [lengths_b[s] - lengths_a[s] for s in shared],
            [user for user, _ in shared],
            boot,
        )
        rows.append(replace(r, length_controlled=None if est is None else est.scaled(r.metric.scale)))
    return replace(c, rows=tuple(rows))
