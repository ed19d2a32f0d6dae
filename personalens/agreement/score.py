"""`agreement score`: Table 5 from filled sheets and the run's judgments.

Per metric: Fleiss' kappa among the annotators and the mean over annotators of Cohen's kappa between
the annotator and the judge (unweighted, as the paper reports plain kappas), both from statsmodels,
each with a bootstrap interval that resamples users, as every interval of the report does (a user's
dialogues are drawn together; expanded percentile, tables/stats.py). statsmodels computes both from
count tables, so a bootstrap resample only re-weights precomputed per-dialogue counts."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from statsmodels.stats.inter_rater import aggregate_raters, cohens_kappa, fleiss_kappa

from personalens.agreement.metrics import METRICS, AgreementError
from personalens.agreement.sheets import Manifest, read_manifest, read_sheets
from personalens.config.judges import DEFAULT, RunJudges, run_judges
from personalens.store import KEY_COLUMNS, read_table
from personalens.tables.model import Column, Table
from personalens.tables.stats import Bootstrap, Estimate, bootstrap_statistic

COLUMNS = (
    Column("cohen", "", "Cohen's Kappa", 3, holds="estimate"),
    Column("fleiss", "", "IAA (Fleiss' Kappa)", 3, holds="estimate"),
)
ALL_RATERS = Column("fleiss_all", "", "IAA (Fleiss' Kappa, annotators and judges)", 3, holds="estimate")


def score_sheets(
    export_dir: Path, sheet_paths: Sequence[Path], run_dir: Path, boot: Bootstrap, judges: Sequence[str] = (DEFAULT,)
) -> Table:
    """Table 5 of the sheets against the run's `judges` (names of its panel: "judge" for model@judge,
    else a `judges:` entry's). Beyond model@judge alone, one Cohen column per judge, and Fleiss'
    kappa over the annotators and the judges together: humans and judges in one table."""
    manifest = read_manifest(export_dir)
    sheets = read_sheets(sheet_paths, manifest)
    panel = run_judges([Path(run_dir)])
    by_name = {j.name: j.key for j in panel.judges.values()} | {DEFAULT: panel.default[str(Path(run_dir))]}
    unknown = [n for n in judges if n not in by_name]
    if unknown or not judges:
        raise AgreementError(
            f"agreement.judges: {run_dir} has no judge {', '.join(unknown) or '(none named)'}; "
            f"its judges are {', '.join(sorted(by_name))}"
        )
    scored = [judge_scores(Path(run_dir), manifest, by_name[n], n == DEFAULT) for n in judges]
    items = [int(item["item"]) for item in manifest.items]
    users = np.array([str(item["user_id"]) for item in manifest.items]) if boot.by_user else None
    alone = list(judges) == [DEFAULT]
    columns = COLUMNS if alone else (*(_cohen_column(n, panel) for n in judges), COLUMNS[1], ALL_RATERS)
    rows = []
    for metric in METRICS:
        # scores as category codes 0..k-1; -1 where a judge has no parsed score
        code = {score: c for c, score in enumerate(metric.scores)}
        codes = np.array([[code[s.scores[i][metric.column]] for s in sheets] for i in items])
        judged = [np.array([code.get(judge.get((i, metric.column)), -1) for i in items]) for judge in scored]
        k = len(metric.scores)
        cohens = tuple(cohen_cell(codes, j, k, boot, users) for j in judged)
        every = np.column_stack([codes, *judged])
        rated = (every >= 0).all(axis=1)
        everyone = () if alone else (fleiss_cell(every[rated], k, boot, None if users is None else users[rated]),)
        rows.append(((metric.label,), (*cohens, fleiss_cell(codes, k, boot, users), *everyone)))
    unjudged = sum(1 for judge in scored for i in items for m in METRICS if (i, m.column) not in judge)
    notes = (
        f"Export {manifest.export_id}: {len(items)} dialogues rated by {len(sheets)} annotators "
        f"({', '.join(s.annotator for s in sheets)}).",
        "Cohen's Kappa is the mean over annotators of the unweighted kappa between an annotator and the judge; "
        "IAA is Fleiss' kappa among the annotators"
        + ("" if alone else f", and among the annotators and the judges {', '.join(judges)} together")
        + f". {_method(boot)}; n counts dialogues.",
        *(
            (
                f"{unjudged} (dialogue, metric{'' if alone else ', judge'}) {'pairs' if alone else 'triples'} have "
                "no parsed judge score and are left out of Cohen's Kappa.",
            )
            if unjudged
            else ()
        ),
    )
    return Table(
        "table5",
        "Table 5: agreement of human annotators with each other and with the judge"
        + ("" if alone else f"s ({', '.join(judges)})"),
        ("Metric",),
        columns,
        tuple(rows),
        notes=notes,
    )


def _cohen_column(name: str, panel: RunJudges) -> Column:
    label = next((j.label for j in panel.judges.values() if j.name == name), name)
    return Column(f"cohen_{name}", "", f"Cohen's Kappa ({label})", 3, holds="estimate")


def judge_scores(run_dir: Path, manifest: Manifest, key: str = "", legacy: bool = True) -> dict[tuple[int, str], int]:
    """(item, metric column) -> judge `key`'s whole-dialogue score, for judgments that parsed; rows
    written before judge keys count as its own when `legacy` (model@judge's)."""
    table = read_table(
        run_dir / "judgments",
        [*KEY_COLUMNS, "dimension", "speaker", "turn", "score", "parsed"],
        optional=("judge_key",),
    )
    if table is None:
        raise AgreementError(
            f"{run_dir / 'judgments'} holds no judgments: run `personalens judge` with this run.out_dir first"
        )
    item_of = {tuple(item[c] for c in KEY_COLUMNS): int(item["item"]) for item in manifest.items}
    column_of = {(m.dimension, m.speaker): m.column for m in METRICS}
    scores = {}
    for row in table.to_pylist():
        if not (row.get("judge_key") == key or (row.get("judge_key") is None and legacy)):
            continue
        item = item_of.get(tuple(row[c] for c in KEY_COLUMNS))
        column = column_of.get((row["dimension"], row["speaker"] or ""))
        if item is not None and column is not None and row["turn"] == -1 and row["parsed"]:
            scores[(item, column)] = int(row["score"])
    if not any(item in item_of.values() for item, _ in scores):
        raise AgreementError(
            f"{run_dir / 'judgments'} holds no judgment of the exported dialogues: "
            f"is run.out_dir the run that export {manifest.export_id} was drawn from?"
        )
    return scores


def fleiss(counts: np.ndarray) -> float:
    """Fleiss' kappa from (items x categories) counts of annotators' scores."""
    with np.errstate(invalid="ignore", divide="ignore"):  # one category only: kappa is undefined (nan)
        return float(fleiss_kappa(counts, method="fleiss"))


def cohen(table: np.ndarray) -> float:
    """Cohen's kappa (unweighted) from a square contingency table of two raters' scores."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return float(cohens_kappa(table, return_results=False))


def _method(boot: Bootstrap) -> str:
    if not boot.by_user:
        return f"Intervals are percentile bootstrap over dialogues ({boot.resamples} resamples, seed {boot.seed})"
    return (
        "95% intervals resample users (a user's dialogues are drawn together; the dialogues of a single user are "
        f"resampled one by one), expanded percentile, {boot.resamples} resamples, seed {boot.seed} (docs/agreement.md)"
    )


def fleiss_cell(codes: np.ndarray, categories: int, boot: Bootstrap, users: np.ndarray | None = None) -> Estimate:
    """Fleiss' kappa among the annotators; its interval resamples `users` (a label per dialogue)."""
    counts, _ = aggregate_raters(codes, n_cat=categories)
    return _estimate(lambda idx: fleiss(counts[idx]), len(codes), boot, users)


def cohen_cell(
    codes: np.ndarray, judged: np.ndarray, categories: int, boot: Bootstrap, users: np.ndarray | None = None
) -> Estimate | None:
    """Mean over annotators of Cohen's kappa with the judge, on the dialogues the judge scored; its
    interval resamples `users` (a label per dialogue)."""
    keep = judged >= 0
    if not keep.any():
        return None
    # each (annotator, dialogue) falls into one cell of the annotator's table with the judge; a resample
    # weights the dialogues by how often it drew them
    cells = codes[keep] * categories + judged[keep, None]
    n = int(keep.sum())

    def mean_kappa(idx: np.ndarray) -> float:
        weights = np.bincount(idx, minlength=n)
        return float(
            np.mean(
                [
                    cohen(
                        np.bincount(cells[:, a], weights=weights, minlength=categories**2).reshape(
                            categories, categories
                        )
                    )
                    for a in range(cells.shape[1])
                ]
            )
        )

    return _estimate(mean_kappa, n, boot, None if users is None else users[keep])


def _estimate(statistic: Callable[[np.ndarray], float], n: int, boot: Bootstrap, users: np.ndarray | None) -> Estimate:
    """The statistic with its interval: users resampled where there are several, else dialogues."""
    clusters = list(users) if users is not None and len(set(users)) > 1 else None
    value, lo, hi = bootstrap_statistic(statistic, n, boot.resamples, boot.seed, clusters=clusters)
    return Estimate(value, lo, hi, n)
