"""The people to build profiles for: one row per person of a CSV, Parquet or JSON-lines table.

A column mapping names, for each demographic field of the release, the column that holds it; a dotted
name reaches into nested records, as in the PRISM survey file (`location.reside_country`)."""

from __future__ import annotations

import csv
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from personalens.data.loading import DEMOGRAPHIC_KEYS
from personalens.errors import PersonalensError

FIELDS = DEMOGRAPHIC_KEYS[1:]  # user_id is given by the builder: user0, user1, ... in table order
MISSING = "N/A"  # how the release spells an unanswered field


class DemographicsError(PersonalensError, ValueError):
    pass


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    path = Path(path)
    if not path.is_file():
        raise DemographicsError(f"demographics table not found: {path}")
    suffix = path.suffix.lower()
    try:
        if suffix == ".csv":
            with path.open(newline="", encoding="utf-8") as f:
                return list(csv.DictReader(f))
        if suffix == ".parquet":
            return pq.read_table(path).to_pylist()
        if suffix in (".jsonl", ".json"):
            lines = path.read_text(encoding="utf-8").splitlines()
            return [json.loads(line) for line in lines if line.strip()]
    except (OSError, ValueError, UnicodeDecodeError) as err:
        raise DemographicsError(f"{path}: cannot read: {err}") from None
    raise DemographicsError(f"{path}: unknown table format {suffix!r} (use .csv, .parquet or .jsonl)")


def _lookup(row: Mapping[str, Any], column: str) -> tuple[bool, Any]:
    value: Any = row
    for part in column.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return False, None
        value = value[part]
    return True, value


def load_demographics(
    path: str | Path, columns: Mapping[str, str], users: int | str = "all", skip_rows: Mapping[str, Any] | None = None
) -> list[dict[str, str]]:
    """The first `users` people (all: every row) as demographic dicts in the release's key order,
    without user_id. Rows whose column equals a `skip_rows` value are left out (e.g. PRISM's
    participants who gave no survey answers). Empty cells become "N/A"."""
    missing = [f for f in FIELDS if f not in columns]
    if missing:
        raise DemographicsError(f"datagen.demographics.columns: no column given for {missing}")
    rows = [r for r in read_rows(path) if not any(_lookup(r, c) == (True, v) for c, v in (skip_rows or {}).items())]
    if users != "all":
        if not isinstance(users, int) or users < 1:
            raise DemographicsError(f"datagen.users: expected a positive number or 'all', got {users!r}")
        if users > len(rows):
            raise DemographicsError(f"datagen.users={users} but {path} has only {len(rows)} usable rows")
        rows = rows[:users]
    people = []
    for number, row in enumerate(rows, start=1):
        person = {}
        for field in FIELDS:
            found, value = _lookup(row, columns[field])
            if not found:
                raise DemographicsError(
                    f"{path}: row {number}: no column {columns[field]!r} "
                    f"(mapped to {field} in datagen.demographics.columns)"
                )
            text = "" if value is None else str(value).strip()
            person[field] = text or MISSING
        people.append(person)
    return people
