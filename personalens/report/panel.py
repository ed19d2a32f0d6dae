"""A judge panel in the report (docs/validation.md#judge-panels): Table 3 under each judge (and, where
the simulated user was checked, Table 3 without its flagged dialogues, the difference and length
against score), the agreement of every pair of judges on every metric, and the panel's own Table 3.
Every per-judge table is named by its judge's saved config (`table3_judge`, `table3_judge-warm`) and
carries `judge` and `judge_model` columns. Pure: judgments in, tables out.

Agreement pairs the two judges' whole-dialogue scores of the same dialogue and dimension (both
parsed and on the scale): Cohen's kappa for task completion, kappa with quadratic weights for the
ordinal scores, each with an interval resampling users (tables/kappa.py). The panel score of a
dialogue is the mean of its judges' parsed scores; for task completion their majority, a tie
counting 0.5."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from itertools import combinations

from personalens.config.judges import RunJudges
from personalens.report.length import length_table
from personalens.report.paper_tables import table3
from personalens.report.user_dialogues import CheckedDialogue
from personalens.report.user_flags import without_flagged
from personalens.store.metrics import TABLE3, TABLE12, Metric
from personalens.store.results import Judgment
from personalens.store.schema import SCORE_RANGES
from personalens.tables import render
from personalens.tables.kappa import kappa_estimate
from personalens.tables.model import Column, Table
from personalens.tables.stats import Bootstrap

PANEL = "panel"  # the panel score's judge key and label
# the starts of a panel's file names, which a later report into the same folder replaces
PANEL_FILES = (
    "table3_judge",
    "table3_unflagged_judge",
    "table3_flag_difference_judge",
    "length_score_judge",
    "judge_agreement",
    "table3_panel",
)
METRICS = (*TABLE3, *TABLE12)


@dataclass(frozen=True)
class PanelTables:
    per_judge: tuple[Table, ...]  # Table 3 under each judge, model@judge's first
    agreement: Table
    panel: Table  # Table 3 of the panel score
    # per judge, in per_judge's order: without flagged dialogues, the difference, length against score
    checks: tuple[tuple[Table, ...], ...] = ()

    @property
    def all(self) -> tuple[Table, ...]:
        return (*self.per_judge, *(t for tables in self.checks for t in tables), self.agreement, self.panel)


def weights_of(metric: Metric) -> str:
    """Unweighted kappa for task completion's two values, quadratic weights for ordinal scores."""
    return "none" if metric.dimension == "task_completion" else "quadratic"


def metric_name(metric: Metric) -> str:
    return f"{metric.label} ({metric.speaker})" if metric.speaker else metric.label


def panel_tables(
    judgments: Sequence[Judgment],
    order: Sequence[str],
    judges: RunJudges,
    boot: Bootstrap,
    checked: Sequence[CheckedDialogue] = (),
) -> PanelTables | None:
    """The panel's tables over `judgments` (each carrying its judge's key), judges in `order` (keys;
    any others after, by key), named and checked for self-preference by `judges`, with the checks of
    the simulated user per judge where dialogues were `checked` (user_dialogues.py); None with fewer than two judges."""
    label = judges.label
    keys = list(
        dict.fromkeys(
            [*(k for k in order if any(j.judge == k for j in judgments)), *sorted({j.judge for j in judgments})]
        )
    )
    if len(keys) < 2:
        return None
    by_judge = defaultdict(list)
    for j in judgments:
        by_judge[j.judge].append(j)
    stems = judges.stems(keys)

    def named(table: Table, key: str, title: str) -> Table:
        model = judges.judges[key].model.get("name", "") if key in judges.judges else ""
        return replace(
            table,
            name=f"{table.name}_{stems[key]}",
            title=f"{title} under judge {label(key)}",
            context=(("judge", judges.name(key)), ("judge_model", str(model or "unknown"))),
        )

    per_judge = []
    for k in keys:
        whole = table3(by_judge[k], boot)
        per_judge.append(replace(named(whole, k, "Table 3"), notes=(*judges.self_preference([k]), *whole.notes)))
    checks = ()
    if checked:
        checks = tuple(
            (
                *(named(t, k, t.title) for t in without_flagged(by_judge[k], checked, boot)),
                named(length_table(by_judge[k], checked, boot), k, "Length against score"),
            )
            for k in keys
        )
    panel = replace(
        table3(panel_judgments(judgments, keys), boot),
        name="table3_panel",
        title=f"Table 3 under the panel score of {len(keys)} judges (mean; task completion by majority, a tie 0.5)",
    )
    return PanelTables(tuple(per_judge), agreement_table(judgments, keys, label, boot), panel, checks)


def panel_markdown(panel: PanelTables) -> str:
    """report.md's judge-panel section (docs/validation.md#judge-panels)."""
    return "\n\n".join(
        [
            "## Judge panel\n\nThe same dialogues under each judge (the tables above hold each run's model@judge), "
            "the judges' agreement, and the panel score (docs/validation.md#judge-panels).",
            render.markdown(panel.per_judge),
            *(render.markdown(list(tables)) for tables in zip(*panel.checks)),
            render.markdown([panel.agreement]),
            render.markdown([panel.panel]),
        ]
    )


def _whole(judgments: Sequence[Judgment]) -> dict[tuple, dict[str, Judgment]]:
    """Whole-dialogue judgments by (run, dialogue, dimension, speaker), then by judge."""
    out: dict[tuple, dict[str, Judgment]] = defaultdict(dict)
    for j in judgments:
        if j.turn == -1:
            out[(j.run, j.assistant_model, j.setting, j.scenario, j.dimension, j.speaker)][j.judge] = j
    return out


def agreement_table(
    judgments: Sequence[Judgment], keys: Sequence[str], label: Callable[[str], str], boot: Bootstrap
) -> Table:
    """Per pair of judges and metric, kappa over the dialogues both scored on the scale."""
    items = _whole(judgments)
    rows, left_out = [], 0
    for a, b in combinations(keys, 2):
        for metric in METRICS:
            lo, hi = SCORE_RANGES[metric.dimension]
            pairs = [
                (by[a], by[b])
                for by in items.values()
                if a in by and b in by and metric.selects(by[a]) and by[a].score is not None and by[b].score is not None
            ]
            on_scale = [(x, y) for x, y in pairs if lo <= x.score <= hi and lo <= y.score <= hi]
            left_out += len(pairs) - len(on_scale)
            est = kappa_estimate(
                [x.score for x, _ in on_scale],
                [y.score for _, y in on_scale],
                range(lo, hi + 1),
                boot,
                weights=weights_of(metric),
                users=[x.scenario.user_id for x, _ in on_scale],
            )
            rows.append(((label(a), label(b), metric_name(metric), weights_of(metric)), (est,)))
    notes = (
        "Kappa between two judges' whole-dialogue scores of the same dialogues: Cohen's (unweighted) for TCR, "
        "quadratic weights for the ordinal P, Nat. and Coh.; n counts the dialogues both judges scored (each trial "
        f"apart); 95% intervals resample users (a user's dialogues stay together; docs/validation.md#judge-panels), "
        f"{'expanded ' if boot.expanded else ''}percentile, {boot.resamples} resamples, seed {boot.seed}.",
        *(
            (f"{left_out} pairs with a score off its scale (fidelity=official keeps them) are left out.",)
            if left_out
            else ()
        ),
    )
    return Table(
        "judge_agreement",
        "Agreement between judges",
        ("Judge A", "Judge B", "Metric", "Weights"),
        (Column("kappa", "", "Kappa", 3, holds="estimate"),),
        tuple(rows),
        notes=notes,
    )


def panel_judgments(judgments: Sequence[Judgment], keys: Sequence[str]) -> list[Judgment]:
    """One judgment per dialogue, dimension and speaker with the panel score of `keys`' judges (the
    mean of their parsed scores, the majority for task completion); unparsed where none parsed."""
    by_item: dict[tuple, list[Judgment]] = defaultdict(list)
    for j in judgments:
        if j.judge in keys:
            by_item[(j.run, j.assistant_model, j.setting, j.scenario, j.dimension, j.speaker, j.turn)].append(j)
    out = []
    for rows in by_item.values():
        scores = [j.score for j in rows if j.score is not None]
        score = _panel_score(rows[0].dimension, scores) if scores else None
        out.append(replace(rows[0], judge=PANEL, score=score, parsed=score is not None, failure=None))
    return out


def _panel_score(dimension: str, scores: list[float]) -> float:
    mean = sum(scores) / len(scores)
    if dimension != "task_completion":
        return mean
    return 1.0 if mean > 0.5 else 0.0 if mean < 0.5 else 0.5
