"""The paper's tables as pure functions of loaded rows: no I/O, no formatting."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import TypeVar

from personalens.data.records import DOMAINS
from personalens.prompts.setting import setting_label, setting_sort_key
from personalens.store.metrics import TABLE3, TABLE4, TABLE12, Metric, mean_of, metric_cell
from personalens.store.results import KINDS, Dialogue, Judgment
from personalens.tables.model import Cell, Column, Table
from personalens.tables.stats import Bootstrap

ALL_SD = "All SD"  # the Figure 5 series over every single-domain task

Group = tuple[str, str]  # (assistant_model, setting)
R = TypeVar("R", Judgment, Dialogue)
K = TypeVar("K", bound=Hashable)


# ---- grouping ---------------------------------------------------------------------------------


def domain_sort_key(domain: str) -> tuple[int, str]:
    return (DOMAINS.index(domain), "") if domain in DOMAINS else (len(DOMAINS), domain)


def groups_of(rows: Iterable[Judgment | Dialogue]) -> list[Group]:
    """(model, setting) pairs present, models alphabetically and settings in ablation order."""
    return sorted({(r.assistant_model, r.setting) for r in rows}, key=lambda g: (g[0], setting_sort_key(g[1])))


def shows_setting(groups: Sequence[Group]) -> bool:
    """Whether rows need the setting to be told apart: some model ran in several settings."""
    models = [model for model, _ in groups]
    return len(set(models)) < len(models)


def group_header(with_setting: bool) -> tuple[str, ...]:
    return ("Assistant model", "Setting") if with_setting else ("Assistant model",)


def group_labels(group: Group, with_setting: bool) -> tuple[str, ...]:
    return (group[0], setting_label(group[1])) if with_setting else (group[0],)


def _by(rows: Iterable[R], key: Callable[[R], K]) -> dict[K, list[R]]:
    out: dict[K, list[R]] = defaultdict(list)
    for r in rows:
        out[key(r)].append(r)
    return out


# ---- metrics ----------------------------------------------------------------------------------


UNPARSED_NOTE = (
    "Means and rates exclude judgments whose output did not parse; "
    "a cell shows how many were excluded, and report.md counts them per dimension."
)


def _kind_metric_table(
    name: str,
    title: str,
    judgments: Sequence[Judgment],
    metrics: Sequence[Metric],
    rows: Sequence[tuple[tuple[str, ...], Group]],
    row_header: tuple[str, ...],
    boot: Bootstrap,
    context: tuple[tuple[str, str], ...] = (),
) -> Table:
    """One row per (labels, group), columns metric x kind (SD block, then MD block)."""
    columns = tuple(Column(f"{kind}_{m.key}", kind, m.label, m.digits) for kind in KINDS for m in metrics)
    by_cell = _by(judgments, lambda j: (j.assistant_model, j.setting, j.kind))
    cells = tuple(
        (labels, tuple(metric_cell(by_cell.get((*g, kind), []), m, boot) for kind in KINDS for m in metrics))
        for labels, g in rows
    )
    return Table(name, title, row_header, columns, cells, context, (UNPARSED_NOTE,))


def _group_rows(
    rows: Sequence[Judgment] | Sequence[Dialogue],
) -> tuple[list[tuple[tuple[str, ...], Group]], tuple[str, ...]]:
    """Row labels per group and the row header, with the setting shown only where needed."""
    groups = groups_of(rows)
    with_setting = shows_setting(groups)
    return [(group_labels(g, with_setting), g) for g in groups], group_header(with_setting)


# ---- the paper's tables -----------------------------------------------------------------------

PUBLISHED_SUFFIX = " (paper)"


def table3(
    judgments: Sequence[Judgment],
    boot: Bootstrap,
    published: Mapping[str, Mapping[str, float]] | None = None,
    notes: Sequence[str] = (),
) -> Table:
    """Table 3; with `published` (model -> column key -> value), each base-setting row of a model
    the paper reports is followed by the paper's row for it, labelled `<model> (paper)`."""
    table = _kind_metric_table(
        "table3",
        "Table 3: assistant models on single-domain (SD) and multi-domain (MD) tasks",
        judgments,
        TABLE3,
        *_group_rows(judgments),
        boot,
    )
    rows = []
    for labels, cells in table.rows:
        rows.append((labels, cells))
        model, setting = labels[0], (labels[1] if len(labels) > 1 else "base")
        if published and model in published and setting == "base":
            rows.append(
                ((model + PUBLISHED_SUFFIX, *labels[1:]), tuple(published[model].get(c.key) for c in table.columns))
            )
    extra = (
        (
            f"Rows marked{PUBLISHED_SUFFIX} are the paper's published Table 3 (Claude 3 Sonnet as user agent, "
            "Claude 3.5 Sonnet as judge), shown beside a reproduction of the same assistant.",
        )
        if published
        else ()
    )
    return replace(table, rows=tuple(rows), notes=(*notes, *table.notes, *extra))


def table4(judgments: Sequence[Judgment], boot: Bootstrap) -> list[Table]:
    """One ablation table per assistant model that ran in more than one prompt setting."""
    tables = []
    for model, model_rows in sorted(_by(judgments, lambda j: j.assistant_model).items()):
        groups = groups_of(model_rows)
        if len(groups) > 1:
            tables.append(
                _kind_metric_table(
                    "table4",
                    f"Table 4: prompt settings of {model}",
                    model_rows,
                    TABLE4,
                    [((setting_label(g[1]),), g) for g in groups],
                    ("Setting",),
                    boot,
                    context=(("assistant_model", model),),
                )
            )
    return tables


def table12(judgments: Sequence[Judgment], boot: Bootstrap) -> Table:
    return _kind_metric_table(
        "table12",
        "Table 12: the user agent's naturalness and coherence, per assistant model",
        judgments,
        TABLE12,
        *_group_rows(judgments),
        boot,
    )


def table13(dialogues: Sequence[Dialogue], boot: Bootstrap) -> Table:
    """Dialogue counts, rounds per dialogue and completion tokens per turn, for SD and MD."""
    group_rows, header = _group_rows(dialogues)
    columns = tuple(
        c
        for kind in KINDS
        for c in (
            Column(f"{kind}_dialogues", kind, "# Dialogues", holds="count"),
            Column(f"{kind}_rounds", kind, "Rounds/dialogue", 2, holds="estimate"),
            Column(f"{kind}_tokens_per_turn", kind, "Tokens/turn", 1, holds="estimate"),
        )
    )
    by_cell = _by(dialogues, lambda d: (d.assistant_model, d.setting, d.kind))
    rows = []
    for labels, g in group_rows:
        cells: list[Cell] = []
        for kind in KINDS:
            ds = by_cell.get((*g, kind), [])
            # Tokens per turn over all turns: each dialogue's own mean, weighted by its turn count.
            counted = [d for d in ds if d.completion_tokens]
            cells += [
                len(ds),
                boot.estimate([d.rounds for d in ds], **_sampled(ds)),
                boot.estimate(
                    [sum(d.completion_tokens) / len(d.completion_tokens) for d in counted],
                    weights=[len(d.completion_tokens) for d in counted],
                    **_sampled(counted),
                ),
            ]
        rows.append((labels, tuple(cells)))
    return Table(
        "table13",
        "Table 13: dialogue statistics",
        header,
        columns,
        tuple(rows),
        notes=(
            "Tokens/turn is the mean completion_tokens over all user and assistant turns "
            "(a dialogue weighted by its turn count).",
        ),
    )


def _sampled(dialogues: Sequence[Dialogue]) -> dict:
    """What a dialogue statistic's interval resamples: users, with the trials of a scenario averaged."""
    return {"users": [d.scenario.user_id for d in dialogues], "scenarios": [d.scenario.key for d in dialogues]}


def by_domain(judgments: Sequence[Judgment], boot: Bootstrap, kinds: Sequence[str] = KINDS) -> Table:
    """Figure 4's numbers: TCR and P per domain over the dialogues of `kinds` (the released code
    counts single-domain ones only); a multi-domain dialogue counts in each of its domains."""
    group_rows, header = _group_rows(judgments)
    per_domain: dict[tuple[str, str, str], list[Judgment]] = defaultdict(list)
    for j in (j for j in judgments if j.kind in kinds):
        for domain in j.domains:
            per_domain[(j.assistant_model, j.setting, domain)].append(j)
    rows = []
    for labels, g in group_rows:
        domains = sorted({d for model, setting, d in per_domain if (model, setting) == g}, key=domain_sort_key)
        rows += [((*labels, d), tuple(metric_cell(per_domain[(*g, d)], m, boot) for m in TABLE4)) for d in domains]
    which = " and ".join(kinds)
    notes = ("A multi-domain dialogue counts towards each of its domains.",) if "MD" in kinds else ()
    return Table(
        "figure4",
        f"Figure 4 data: TCR and P per domain ({which} dialogues)",
        (*header, "Domain"),
        tuple(Column(m.key, "", m.label, m.digits) for m in TABLE4),
        tuple(rows),
        notes=(*notes, UNPARSED_NOTE),
    )


def by_turn(judgments: Sequence[Judgment], domains: Sequence[str], boot: Bootstrap) -> Table | None:
    """Figure 5's numbers: mean turn-level P of SD tasks by turn, per chosen domain and over all SD.

    None when the runs hold no turn-level judgments (the judge's turn_level option was off).
    """
    turn_rows = [j for j in judgments if j.dimension == "personalization" and j.turn >= 1 and j.kind == "SD"]
    if not turn_rows:
        return None
    group_rows, header = _group_rows(turn_rows)
    series: dict[tuple[str, str, str, int], list[Judgment]] = defaultdict(list)
    for j in turn_rows:
        for name in (ALL_SD, *(d for d in j.domains if d in domains)):
            series[(j.assistant_model, j.setting, name, j.turn)].append(j)
    rows = []
    for labels, g in group_rows:
        for name in (*domains, ALL_SD):
            turns = sorted(t for model, setting, s, t in series if (model, setting, s) == (*g, name))
            rows += [((*labels, name, str(t)), (mean_of(series[(*g, name, t)], boot),)) for t in turns]
    return Table(
        "figure5",
        "Figure 5 data: turn-level personalization of SD tasks",
        (*header, "Series", "Turn"),
        (Column("P", "", "P"),),
        tuple(rows),
        notes=(
            "Turn k scores the dialogue cut after the k-th assistant reply; later turns have fewer dialogues.",
            UNPARSED_NOTE,
        ),
    )


def _dimension_label(j: Judgment) -> str:
    detail = j.speaker or ("turn-level" if j.turn >= 1 else "")
    return f"{j.dimension} ({detail})" if detail else j.dimension


FAILURE_REASONS_NOTE = (
    "Unparsed judgments by reason (a judgment's `failure` column): cut at max_tokens, the output ended at the "
    "judge's max_tokens before a valid score (\"cut at N tokens\"); refused, the judge's engine refused the "
    "request (a prompt longer than its context, or a bad request); the rest wrote no valid score."
)

OUT_OF_RANGE_NOTE = (
    "Out of range, kept: a score off the dimension's scale (TC 0/1, P 1-4, Nat./Coh. 1-5) that the "
    "judge wrote although its grammar forbids it (an endpoint without structured output); under "
    "fidelity=official it enters the means as the released util/gather_evaluation.py keeps it, under "
    "fidelity=paper it counts as unparsed (docs/fidelity.md)."
)


def parse_failures(judgments: Sequence[Judgment]) -> Table:
    """Judgments whose output did not parse, and parsed scores off the dimension's scale, per
    group and dimension (with speaker / turn level)."""
    group_rows, header = _group_rows(judgments)
    counts = _by(judgments, lambda j: (j.assistant_model, j.setting, _dimension_label(j), j.kind))
    columns = tuple(
        c
        for kind in KINDS
        for c in (
            Column(f"{kind}_unparsed", kind, "Unparsed", holds="count"),
            Column(f"{kind}_cut", kind, "of which cut at max_tokens", holds="count"),
            Column(f"{kind}_refused", kind, "of which refused", holds="count"),
            Column(f"{kind}_out_of_range", kind, "Out of range, kept", holds="count"),
            Column(f"{kind}_judged", kind, "Judged", holds="count"),
        )
    )
    rows = []
    for labels, g in group_rows:
        for dimension in sorted({dim for model, setting, dim, _ in counts if (model, setting) == g}):
            cells: list[Cell] = []
            for kind in KINDS:
                js = counts.get((*g, dimension, kind), [])
                cells += [
                    sum(not j.parsed for j in js),
                    sum((j.failure or "").startswith("cut at") for j in js),
                    sum(bool(j.failure) and j.finish_reason is None for j in js),
                    sum(j.out_of_range for j in js),
                    len(js),
                ]
            rows.append(((*labels, dimension), tuple(cells)))
    return Table(
        "parse_failures",
        "Judgments whose output did not parse (excluded from all means), and scores off the scale",
        (*header, "Dimension"),
        columns,
        tuple(rows),
        notes=(FAILURE_REASONS_NOTE, OUT_OF_RANGE_NOTE),
    )
