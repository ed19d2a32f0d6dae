"""The checks of the simulated user in the report: the flagged dialogues counted per user agent and
assistant, and Table 3 again without them, with the difference from Table 3 (docs/validation.md)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace

from personalens.prompts.setting import setting_label
from personalens.report.paper_tables import groups_of, shows_setting, table3
from personalens.report.user_checks import RULE_NAMES, RULES
from personalens.report.user_dialogues import CheckedDialogue, judgment_key
from personalens.store.results import Judgment
from personalens.tables.model import Cell, Column, Table
from personalens.tables.stats import Bootstrap, Estimate

ALL_ASSISTANTS = "all assistants"


def flag_counts(checked: Sequence[CheckedDialogue], unchecked: Sequence[str] = ()) -> Table:
    """Per user agent, per assistant (and setting, where a model ran in several) and over all its
    assistants: the dialogues, those breaking each rule, and those breaking any."""
    columns = (
        Column("dialogues", "", "Dialogues", holds="count"),
        *(Column(rule, "Flagged", RULE_NAMES[rule], holds="count") for rule in RULES),
        Column("flagged", "", "Any flag", holds="count"),
        Column("flagged_share", "", "Flagged (%)", digits=1, holds="value"),
    )
    groups = groups_of(checked)
    with_setting = shows_setting(groups)
    rows = []
    for agent in sorted({d.user_model for d in checked}):
        mine = [d for d in checked if d.user_model == agent]
        for model, setting in groups:
            ds = [d for d in mine if (d.assistant_model, d.setting) == (model, setting)]
            if ds:
                rows.append(((agent, model, *((setting_label(setting),) if with_setting else ())), _counts(ds)))
        rows.append(((agent, ALL_ASSISTANTS, *(("",) if with_setting else ())), _counts(mine)))
    return Table(
        "user_flags",
        "Checks of the simulated user: dialogues flagged per user agent and assistant",
        ("User agent", "Assistant model", *(("Setting",) if with_setting else ())),
        columns,
        tuple(rows),
        notes=(
            "A dialogue is flagged when a user turn breaks a rule of docs/validation.md (checks of the simulated "
            "user): it speaks as the assistant, quotes its prompt's instructions or profile, says TERMINATE before "
            "the assistant spoke, repeats an earlier user turn, or is empty. A dialogue may break several.",
            *(f"Prompt leaks not checked: {line}." for line in unchecked),
        ),
    )


def _counts(ds: Sequence[CheckedDialogue]) -> tuple[Cell, ...]:
    checked_leaks = [d for d in ds if d.leak_checked]
    per_rule: list[Cell] = [
        (sum("leak" in d.flags for d in checked_leaks) if checked_leaks else None)
        if rule == "leak"
        else sum(rule in d.flags for d in ds)
        for rule in RULES
    ]
    flagged = sum(bool(d.flags) for d in ds)
    return (len(ds), *per_rule, flagged, 100.0 * flagged / len(ds))


def unflagged(judgments: Iterable[Judgment], checked: Sequence[CheckedDialogue]) -> list[Judgment]:
    """The judgments of dialogues that break no rule."""
    flagged = {d.key for d in checked if d.flags}
    return [j for j in judgments if judgment_key(j) not in flagged]


def without_flagged(
    judgments: Sequence[Judgment], checked: Sequence[CheckedDialogue], boot: Bootstrap
) -> tuple[Table, Table]:
    """Table 3 over the dialogues no rule flags, and its difference from Table 3 over all `judgments`
    (one judge's: the report's own are model@judge's, a panel's are per judge, panel.py)."""
    clean = table3(unflagged(judgments, checked), boot)
    kept = replace(
        clean,
        name="table3_unflagged",
        title="Table 3 without the dialogues a check of the simulated user flags",
        notes=("Dialogues flagged by any rule of the user_flags table are left out.", *clean.notes),
    )
    return kept, _difference(table3(judgments, boot), clean)


def _difference(whole: Table, clean: Table) -> Table:
    """Each cell of `clean` minus the same cell of `whole`: how far the flagged dialogues moved it."""
    means = {labels: cells for labels, cells in clean.rows}
    rows = []
    for labels, cells in whole.rows:
        after = means.get(labels, (None,) * len(cells))
        rows.append((labels, tuple(_minus(a, b) for a, b in zip(after, cells))))
    return Table(
        "table3_flag_difference",
        "Table 3 without flagged dialogues minus Table 3",
        whole.row_header,
        tuple(replace(c, holds="value") for c in whole.columns),
        tuple(rows),
        notes=(
            "Positive: the assistant scores higher once the dialogues the simulated user spoilt are left out. "
            "A difference of means (TCR in points); both tables give each mean's interval.",
        ),
    )


def _minus(after: Cell, before: Cell) -> Cell:
    if isinstance(after, Estimate) and isinstance(before, Estimate):
        return after.mean - before.mean
    return None
