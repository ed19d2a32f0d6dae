"""A judged metric's variance split into users, scenarios, the simulated dialogue (trials) and the
judge (judgings of one dialogue) from a run's judgments (tables/components.py): what the report's
noise table shows and `plan` weighs a further trial against a further judging with."""

from __future__ import annotations

from collections.abc import Sequence

from personalens.store.metrics import Metric
from personalens.store.results import Judgment
from personalens.tables.components import Components, components
from personalens.tables.stats import Bootstrap


def metric_components(judgments: Sequence[Judgment], metric: Metric, boot: Bootstrap) -> Components | None:
    """The components of `metric` over `judgments` (one assistant model, setting and task kind;
    every judge's rows, each carrying its judge's key), on the metric's shown scale (TCR in percent);
    None without a parsed score. A dialogue is a run's scenario and trial; its judgings are the
    judges' parsed scores of it."""
    rows = [j for j in judgments if metric.selects(j) and j.score is not None]
    if not rows:
        return None
    return components(
        [j.score * metric.scale for j in rows],
        [(j.run, j.scenario.user_id) for j in rows],
        [(j.run, *j.scenario.key) for j in rows],
        [(j.run, *j.scenario.key, j.scenario.trial) for j in rows],
        [j.judge for j in rows],
        resamples=boot.resamples,
        seed=boot.seed,
    )
