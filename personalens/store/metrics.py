"""The judged metrics of Tables 3, 4 and 12 (which judgment rows each one averages, and how it is
shown) and a metric's estimate over judgments: what `report` prints and `compare` differences."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from personalens.store.results import Judgment
from personalens.tables.stats import Bootstrap, Estimate


@dataclass(frozen=True)
class Metric:
    """A judged quantity: which judgment rows it averages and how it is shown."""

    key: str
    label: str
    dimension: str
    speaker: str = ""
    scale: float = 1.0
    digits: int = 2

    def selects(self, j: Judgment) -> bool:
        return j.dimension == self.dimension and j.speaker == self.speaker and j.turn == -1


TCR = Metric("TCR", "TCR (%)", "task_completion", scale=100.0)
P = Metric("P", "P", "personalization")
NAT_ASSISTANT = Metric("Nat", "Nat.", "naturalness", "assistant")
COH_ASSISTANT = Metric("Coh", "Coh.", "coherence", "assistant")
NAT_USER = Metric("Nat", "Nat.", "naturalness", "user")
COH_USER = Metric("Coh", "Coh.", "coherence", "user")
TABLE3 = (TCR, P, NAT_ASSISTANT, COH_ASSISTANT)
TABLE4 = (TCR, P)
TABLE12 = (NAT_USER, COH_USER)


def mean_of(judgments: Sequence[Judgment], boot: Bootstrap, scale: float = 1.0) -> Estimate | None:
    """Mean score of parsed judgments, its interval resampling users (trials of a scenario averaged
    first); the unparsed ones are counted on the cell, not averaged."""
    scored = [j for j in judgments if j.score is not None]
    unparsed = len(judgments) - len(scored)
    est = boot.estimate(
        [j.score for j in scored],
        unparsed=unparsed,
        users=[j.scenario.user_id for j in scored],
        scenarios=[j.scenario.key for j in scored],
    )
    if est is None:
        # Every judgment failed to parse: an empty cell that still shows how many were excluded.
        return Estimate(float("nan"), float("nan"), float("nan"), 0, unparsed) if unparsed else None
    return est.scaled(scale)


def metric_cell(judgments: Sequence[Judgment], metric: Metric, boot: Bootstrap) -> Estimate | None:
    return mean_of([j for j in judgments if metric.selects(j)], boot, metric.scale)
