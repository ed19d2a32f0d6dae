"""Paired differences between two arms (a run's rows of one assistant model and prompt setting) over
the scenarios both hold: pure functions of judgment records, no I/O.

Every arm meets the same scenarios, so a difference is computed scenario by scenario (each side's
trials averaged first) and its interval resamples users, whose scenarios all come from one profile
(tables/stats.py); its p-value is a t-test over the same users with their cluster-robust standard
error. `correct` applies Holm's correction over a family of tests: one comparison's metrics, every
test of an invocation, or each test alone (`FAMILIES`)."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from personalens.compare.power import intra_user_correlation
from personalens.store.metrics import Metric
from personalens.store.results import KINDS, Judgment
from personalens.tables.stats import Bootstrap, Estimate, clustered_mean, holm

ScenarioKey = tuple[str, str]  # (user_id, task_id)

# compare.family: the tests corrected together
FAMILIES = {
    "all": "every test of the invocation",
    "comparison": "each comparison's metrics",
    "none": "each test alone (no correction)",
}


@dataclass(frozen=True)
class Arm:
    """One side of a comparison: the judgments of one assistant model in one prompt setting of a run."""

    run_dir: Path
    assistant_model: str
    setting: str
    judgments: tuple[Judgment, ...]
    judge: str = ""  # the judge's label where judges are compared on the same dialogues (compare/judges.py)

    @property
    def run(self) -> str:
        return self.run_dir.name or str(self.run_dir)

    @property
    def label(self) -> str:
        under = f", judge {self.judge}" if self.judge else ""
        return f"{self.run} ({self.assistant_model}, {self.setting}{under})"

    @property
    def scenarios(self) -> frozenset[ScenarioKey]:
        return frozenset(j.scenario.key for j in self.judgments)


@dataclass(frozen=True)
class MetricDifference:
    """One metric of one task kind: each arm's mean over the paired scenarios, the difference B - A
    with its interval, its p-value before and after Holm's correction, the scenarios left out
    because only one arm has a score for them (the other's judgment missing or unparsed), and how
    the scenario differences vary: the variance one user adds to their mean (the t-test's, on the
    metric's scale) and the intra-user correlation, which a power calculation reads."""

    kind: str
    metric: Metric
    a: Estimate | None
    b: Estimate | None
    difference: Estimate | None
    users: int
    p: float
    p_holm: float = math.nan
    left_out: int = 0
    per_user_variance: float = math.nan
    icc: float = math.nan
    length_controlled: Estimate | None = None  # B - A at equal reply length, a control (compare/length.py)

    @property
    def name(self) -> str:
        return f"{self.metric.label} ({self.metric.speaker})" if self.metric.speaker else self.metric.label

    def significant(self, alpha: float) -> bool:
        return self.p_holm < alpha


@dataclass(frozen=True)
class Comparison:
    """B against A on `metrics` for both task kinds: `kind` is "runs" (two runs), "settings"
    (a prompt setting against `base` inside one run) or "judges" (two judges of one run's dialogues)."""

    kind: str
    a: Arm
    b: Arm
    rows: tuple[MetricDifference, ...]
    only_a: int  # scenarios judged in A only
    only_b: int
    family: int = 0  # tests in the family its p-values were corrected in (`correct`)

    @property
    def title(self) -> str:
        if self.kind == "settings":
            return f"{self.b.setting} - {self.a.setting} in {self.a.run} ({self.a.assistant_model})"
        if self.kind == "judges":
            return (
                f"judge {self.b.judge} - judge {self.a.judge} on the same dialogues of {self.a.run} "
                f"({self.a.assistant_model}, {self.a.setting})"
            )
        return f"{self.b.label} - {self.a.label}"

    @property
    def tests(self) -> int:
        """Rows with a p-value."""
        return sum(not math.isnan(r.p) for r in self.rows)

    @property
    def users(self) -> int:
        """Users behind the paired scenarios (the resampled unit)."""
        return max((r.users for r in self.rows), default=0)


Scores = dict[tuple[str, Metric], dict[ScenarioKey, float]]  # (task kind, metric) -> scenario -> score


def scenario_scores(judgments: Sequence[Judgment], metrics: Sequence[Metric]) -> Scores:
    """Each scenario's score per task kind and metric, in one pass: the mean over its trials with a
    parsed score (unparsed judgments carry no score and stay out, as in the report)."""
    trials: dict[tuple[str, Metric], dict[ScenarioKey, list[float]]] = defaultdict(lambda: defaultdict(list))
    for j in judgments:
        if j.score is None:
            continue
        for metric in metrics:
            if metric.selects(j):
                trials[(j.kind, metric)][j.scenario.key].append(j.score)
    return {cell: {key: sum(s) / len(s) for key, s in by_scenario.items()} for cell, by_scenario in trials.items()}


def metric_difference(
    scores_a: dict[ScenarioKey, float], scores_b: dict[ScenarioKey, float], metric: Metric, kind: str, boot: Bootstrap
) -> MetricDifference:
    """B - A for one metric and task kind over the scenarios both arms scored."""
    shared = sorted(scores_a.keys() & scores_b.keys())
    left_out = len(scores_a.keys() ^ scores_b.keys())
    if not shared:
        return MetricDifference(kind, metric, None, None, None, 0, math.nan, left_out=left_out)
    users = [user for user, _ in shared]
    va = np.array([scores_a[s] for s in shared])
    vb = np.array([scores_b[s] for s in shared])
    rep = boot.replicates(vb - va, users=users)
    test = clustered_mean(vb - va, users)
    difference = Estimate(rep.mean, *boot.interval(rep), len(shared)).scaled(metric.scale)
    return MetricDifference(
        kind,
        metric,
        boot.estimate(va, users=users).scaled(metric.scale),
        boot.estimate(vb, users=users).scaled(metric.scale),
        difference,
        len(set(users)),
        test.p(),
        left_out=left_out,
        per_user_variance=test.per_cluster_variance * metric.scale**2,
        icc=intra_user_correlation(vb - va, users),
    )


def correct(comparisons: Sequence[Comparison], family: str) -> tuple[Comparison, ...]:
    """`comparisons` with Holm-adjusted p-values over `family` (a key of FAMILIES), each comparison
    holding the number of tests in its family; rows without a p-value are no test."""
    tested = [[(c, i) for i, r in enumerate(comp.rows) if not math.isnan(r.p)] for c, comp in enumerate(comparisons)]
    if family == "all":
        groups = [[test for tests in tested for test in tests]]
    elif family == "comparison":
        groups = tested
    else:
        groups = [[test] for tests in tested for test in tests]
    rows = [list(comp.rows) for comp in comparisons]
    sizes = [0] * len(comparisons)
    for members in groups:
        for (c, i), p in zip(members, holm([rows[c][i].p for c, i in members])):
            rows[c][i] = replace(rows[c][i], p_holm=float(p))
            sizes[c] = len(members)
    return tuple(replace(comp, rows=tuple(r), family=m) for comp, r, m in zip(comparisons, rows, sizes))


def compare_arms(kind: str, a: Arm, b: Arm, metrics: Sequence[Metric], boot: Bootstrap) -> Comparison:
    """Every metric of both task kinds, B against A (p-values not yet corrected: `correct`)."""
    scores_a, scores_b = scenario_scores(a.judgments, metrics), scenario_scores(b.judgments, metrics)
    rows = tuple(
        metric_difference(scores_a.get((k, m), {}), scores_b.get((k, m), {}), m, k, boot)
        for k in KINDS
        for m in metrics
    )
    scenarios_a, scenarios_b = a.scenarios, b.scenarios
    return Comparison(kind, a, b, rows, len(scenarios_a - scenarios_b), len(scenarios_b - scenarios_a))
