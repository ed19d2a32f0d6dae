"""`personalens stats` and `personalens diversity` end to end: read, compute, write md / csv / tex / png."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from personalens.data import (
    UserProfile,
    domains_of,
    list_user_indices,
    load_scenarios,
    load_task_definitions,
    load_user,
    user_indices,
)
from personalens.data.schema import SCHEMA_FILE, Domain, default_schema_path, load_schema
from personalens.tables import render
from personalens.tables.model import Table
from personalens.tables.render import write_tables
from personalens.validation import diversity as D
from personalens.validation import stats as S
from personalens.validation.figures import plot_demographics


@dataclass(frozen=True)
class Outputs:
    tables: tuple[Table, ...]
    messages: tuple[str, ...]  # what could not be computed, and why
    files: tuple[Path, ...]

    def markdown(self) -> str:
        return "\n".join([render.markdown(self.tables), *(f"**{m}**\n" for m in self.messages)])


def build_stats(data_root: Path, users: object, schema: Path | None, out_dir: Path) -> Outputs:
    """Table 1, Tables 6-9 and Figure 3 of the selected users; Tables 8-9 need the affinity schema.

    `schema` None looks for res/schema.json beside the data root and skips Tables 8-9 (with a
    message) when it is not there; an explicit path must exist.
    """
    root = Path(data_root)
    table1, profiles = _table1_and_profiles(root, users)
    tables = [table1, S.table6(profiles), S.table7(profiles)]
    messages = []
    schema_path = default_schema_path(root) if schema is None else Path(schema)
    if schema is None and not schema_path.is_file():
        messages.append(
            f"Tables 8-9 skipped: the affinity schema {SCHEMA_FILE} was not found at {schema_path} "
            "(it sits beside data/ in a clone of the official repository); "
            "point stats.schema at it to get them."
        )
    else:
        schema = load_schema(schema_path)
        tables += [S.table8(profiles, schema), S.table9(profiles, schema)]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for stale in ("table8", "table9"):  # left by an earlier run that had the schema
        for path in out.glob(f"{stale}.*"):
            path.unlink()
    files = [path for t in tables for path in write_tables([t], out)]
    files.append(
        plot_demographics(
            [(label, S.demographic_counts(profiles, key)) for key, label in S.FIGURE3_VARIABLES],
            len(profiles),
            out / "figure3.png",
        )
    )
    result = Outputs(tuple(tables), tuple(messages), ())
    summary = out / "stats.md"
    summary.write_text(f"# Data statistics of {root}\n\n![Figure 3](figure3.png)\n\n{result.markdown()}")
    return Outputs(result.tables, result.messages, (*files, summary))


def built_data_stats(data_root: Path, schema: Sequence[Domain], out_dir: Path) -> Outputs:
    """Table 1 and Tables 8-9 of every user of a data root that `personalens build` has written
    from `schema` (the domains it built), written as md / csv / tex into `out_dir`."""
    table1, profiles = _table1_and_profiles(Path(data_root), "all")
    tables = (table1, S.table8(profiles, schema), S.table9(profiles, schema))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return Outputs(tables, (), tuple(path for t in tables for path in write_tables([t], out)))


def _table1_and_profiles(root: Path, users: object) -> tuple[Table, list[UserProfile]]:
    """Table 1 of the selected users, and their profiles (for the other tables)."""
    selected = user_indices(users)
    indices = selected if selected is not None else tuple(list_user_indices(root))
    scenarios = load_scenarios(root, indices)
    loaded = {s.user.index: s.user for s in scenarios}  # parsed already, with their tasks
    profiles = [loaded[i] if i in loaded else load_user(root, i) for i in indices]
    return S.table1(load_task_definitions(root), scenarios, domains_of(root)), profiles


def build_diversity(source: Path, protocol: D.Protocol, by_speaker: bool, out_dir: Path) -> Outputs:
    """Table 10's lexical diversity of the dialogues in `source`, written as table10.{md,csv,tex}."""
    table = D.table10(D.read_dialogues(source), protocol, by_speaker)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return Outputs((table,), (), tuple(write_tables([table], out)))
