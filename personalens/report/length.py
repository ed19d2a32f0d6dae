"""Length against score: per metric, the rank correlation (Spearman) between a dialogue's
score and the assistant's mean reply length in it, with a user-clustered interval (docs/outputs.md,
"Length against score")."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from personalens.report.paper_tables import group_labels, groups_of, shows_setting
from personalens.report.user_dialogues import CheckedDialogue, judgment_key
from personalens.store.metrics import TABLE3, Metric
from personalens.store.results import Judgment
from personalens.tables.model import Column, Table
from personalens.tables.stats import Bootstrap, Estimate, bootstrap_statistic

MIN_DIALOGUES = 3  # fewer points give no rank correlation worth a cell
ALL = "all assistants"


def average_ranks(v: np.ndarray) -> np.ndarray:
    """Ranks 1..n of `v`, ties sharing their average rank (scipy's rankdata, without its overhead:
    a cell's interval ranks every resample)."""
    order = np.argsort(v, kind="stable")
    ordered = v[order]
    ends = np.append(np.flatnonzero(ordered[1:] != ordered[:-1]) + 1, v.size)
    starts = np.append(0, ends[:-1])
    ranks = np.empty(v.size)
    ranks[order] = np.repeat((starts + ends + 1) / 2, ends - starts)
    return ranks


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rho: Pearson's correlation of the average ranks; nan when either side is constant."""
    rx, ry = average_ranks(x), average_ranks(y)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    scale = math.sqrt(float(rx @ rx) * float(ry @ ry))
    return float(rx @ ry) / scale if scale > 0 else math.nan


def rank_correlation(x: Sequence[float], y: Sequence[float], users: Sequence[str], boot: Bootstrap) -> Estimate | None:
    """Spearman's rho of (x, y) with its interval from resampling whole users (expanded percentile,
    as the report's means); None with fewer than MIN_DIALOGUES points."""
    if len(x) < MIN_DIALOGUES:
        return None
    xs, ys = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    rho, lo, hi = bootstrap_statistic(
        lambda idx: spearman(xs[idx], ys[idx]),
        len(xs),
        boot.resamples,
        boot.seed,
        clusters=list(users) if boot.by_user else None,
    )
    return Estimate(rho, lo, hi, len(xs))


def _cell(judgments: Sequence[Judgment], metric: Metric, lengths: dict, boot: Bootstrap) -> Estimate | None:
    pairs = [
        (lengths[judgment_key(j)], j.score, j.scenario.user_id)
        for j in judgments
        if metric.selects(j) and j.score is not None and lengths.get(judgment_key(j)) is not None
    ]
    return rank_correlation([p[0] for p in pairs], [p[1] for p in pairs], [p[2] for p in pairs], boot)


def length_table(judgments: Sequence[Judgment], checked: Sequence[CheckedDialogue], boot: Bootstrap) -> Table:
    """One judge's table (the report's is model@judge's, a panel's per judge, panel.py): a row per
    assistant (and setting, where a model ran in several) and one over all of them, a column per
    Table 3 metric (SD and MD dialogues together)."""
    lengths = {d.key: d.reply_words for d in checked}
    groups = groups_of(judgments)
    with_setting = shows_setting(groups)
    rows = [
        (
            group_labels(g, with_setting),
            tuple(
                _cell([j for j in judgments if (j.assistant_model, j.setting) == g], m, lengths, boot) for m in TABLE3
            ),
        )
        for g in groups
    ]
    rows.append(((ALL, *(("",) if with_setting else ())), tuple(_cell(judgments, m, lengths, boot) for m in TABLE3)))
    return Table(
        "length_score",
        "Length against score: Spearman's rho of a dialogue's score and the assistant's mean reply length",
        ("Assistant model", *(("Setting",) if with_setting else ())),
        tuple(Column(m.key, "", "TC" if m.key == "TCR" else m.label, holds="estimate") for m in TABLE3),
        tuple(rows),
        notes=(
            "Reply length: the words of the assistant's replies in a dialogue, averaged over its replies. "
            "rho > 0: longer replies score higher. n counts dialogues with a parsed score; the 95% interval "
            f"resamples users, expanded percentile ({boot.resamples} resamples, seed {boot.seed}; "
            "docs/outputs.md). The row over all assistants mixes their lengths and levels; a row per "
            "assistant shows the judge's preference within one model.",
        ),
    )
