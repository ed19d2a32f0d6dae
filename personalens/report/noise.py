"""Where a Table 3 score's noise comes from (docs/validation.md#where-a-scores-noise-comes-from): per
assistant, task kind and metric, the variance between users, between a user's scenarios, between the
trials of a scenario (the simulated dialogue) and between the judgings of one dialogue (the judge),
each with an interval resampling users (store/components.py), and the smallest difference a run like
this one detects (tables/power.py). Pure: judgments in, a table out."""

from __future__ import annotations

from collections.abc import Sequence

from personalens.report.paper_tables import group_header, group_labels, groups_of, shows_setting
from personalens.store.components import metric_components
from personalens.store.metrics import TABLE3
from personalens.store.results import KINDS, Judgment
from personalens.tables.components import Components
from personalens.tables.model import Cell, Column, Table
from personalens.tables.power import detectable
from personalens.tables.stats import Bootstrap

ALPHA, POWER = 0.05, 0.8  # compare's defaults: a two-sided test at 5% with 80% power

COLUMNS = (
    Column("users", "", "Users", holds="count"),
    Column("trials", "", "Trials / scenario", 2, holds="value"),
    Column("judgings", "", "Judgings / dialogue", 2, holds="value"),
    Column("user", "Variance", "Users", 2, holds="estimate"),
    Column("scenario", "Variance", "Scenarios of a user", 2, holds="estimate"),
    Column("trial", "Variance", "Trials (dialogue)", 2, holds="estimate"),
    Column("judging", "Variance", "Judgings (judge)", 2, holds="estimate"),
    Column("mde", "Detectable difference", "Independent", 2, holds="value"),
    Column("mde_within", "Detectable difference", "Same scenarios", 2, holds="value"),
)


def replicated(judgments: Sequence[Judgment]) -> bool:
    """Whether a scenario was run more than once or a dialogue judged more than once: what a split
    of the noise below the scenario needs."""
    dialogues = {(j.run, j.scenario) for j in judgments if j.turn == -1}
    scenarios = {(run, s.key) for run, s in dialogues}
    judged = {(j.run, j.scenario, j.judge) for j in judgments if j.turn == -1}
    return len(dialogues) > len(scenarios) or len(judged) > len(dialogues)


def detectable_differences(c: Components) -> tuple[float | None, float | None]:
    """The smallest difference from another run on as many users found with 80% power at 5%, by
    compare's t-test over users: against a run whose scores share nothing with these (twice the
    variance one user adds), and against one on the same scenarios that shares their user and
    scenario effects (twice the dialogue's and the judge's share alone): the bounds a paired
    comparison falls between."""
    users = int(c.design.users)
    if c.units != "user" or users < 2:
        return None, None
    return tuple(detectable(users, 2 * c.per_user(c.design, within=within), ALPHA, POWER) for within in (False, True))


def noise_table(judgments: Sequence[Judgment], boot: Bootstrap) -> Table | None:
    """The split of every Table 3 metric, from every judge's whole-dialogue rows (each carrying its
    judge's key); None where no scenario ran twice and no dialogue was judged twice."""
    if not replicated(judgments):
        return None
    groups = groups_of(judgments)
    with_setting = shows_setting(groups)
    rows = []
    for group in groups:
        own = [j for j in judgments if (j.assistant_model, j.setting) == group]
        for kind in KINDS:
            of_kind = [j for j in own if j.kind == kind]
            for metric in TABLE3:
                c = metric_components(of_kind, metric, boot)
                if c is None:
                    continue
                cells: tuple[Cell, ...] = (
                    int(c.design.users),
                    c.design.trials,
                    c.design.judgings,
                    *(c.variances[level] for level in ("user", "scenario", "trial", "judging")),
                    *detectable_differences(c),
                )
                rows.append(((*group_labels(group, with_setting), kind, metric.label), cells))
    return Table(
        "noise",
        "Where a score's noise comes from: the variance of Table 3's metrics by level",
        (*group_header(with_setting), "Kind", "Metric"),
        COLUMNS,
        tuple(rows),
        notes=(
            "Variance on the metric's scale (TCR in %^2) between users, between the scenarios of a user, between "
            "the trials of a scenario (each a new simulated dialogue) and between the judgings of one dialogue "
            "(the panel's judges, each judge's mean offset removed): "
            "method-of-moments estimates of a nested random-effects model, unbiased and so below 0 at times "
            "when a component is small; – where the run cannot tell a level from the one above (one trial: "
            "the dialogue's variance is inside the scenario's; one user: the users' inside the scenarios'). "
            "95% intervals resample users (a run of one user: its scenarios; n counts the resampled units), expanded "
            f"percentile ({boot.resamples} resamples, seed {boot.seed}).",
            "Detectable difference: the smallest difference from another run on as many users that compare's "
            f"t-test over users finds with {POWER:.0%} power at level {ALPHA:g} (one test, no Holm correction). "
            "Independent: the other run shares no user or scenario effect with this one; Same scenarios: it "
            "shares them, so only the dialogue's and the judge's noise differ. A paired comparison of two "
            "assistants falls between the two. More trials and judgings lower the second, not the users' "
            "share (`personalens plan plan.noise_from=RUN` weighs one against the other; "
            "docs/validation.md#where-a-scores-noise-comes-from).",
        ),
    )
