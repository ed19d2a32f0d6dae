"""The domain schema (`res/schema.json` of the release): domains, their tasks and affinity types.

Read by `build` (the grammars of generated preferences) and `stats` (Tables 8-9). A lab adds a domain by
adding it to a copy of the schema: `build` writes it into the data root, where the loader finds it
(`domains_of`)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from personalens.data.loading import MULTI_DOMAIN
from personalens.errors import PersonalensError

SCHEMA_FILE = Path("res") / "schema.json"


class SchemaError(PersonalensError, ValueError):
    """A schema file that cannot be used; the message names the file and the field."""


@dataclass(frozen=True)
class AffinityType:
    name: str
    description: str
    is_categorical: bool
    has_multiple_values: bool
    possible_values: tuple[str, ...]

    @property
    def closed(self) -> bool:
        """Whether the grammar restricts the value to `possible_values` (a categorical type with a list)."""
        return self.is_categorical and bool(self.possible_values)


@dataclass(frozen=True)
class DomainTask:
    name: str
    description: str


@dataclass(frozen=True)
class Domain:
    name: str
    description: str
    tasks: tuple[DomainTask, ...]
    affinities: tuple[AffinityType, ...]

    def affinity(self, name: str) -> AffinityType:
        return next(a for a in self.affinities if a.name == name)


def default_schema_path(data_root: str | Path) -> Path:
    """Where every clone of the official repository keeps the schema: `res/schema.json` beside `data/`."""
    return Path(data_root).resolve().parent / SCHEMA_FILE


def find_schema(configured: str | None, data_root: str | Path | None) -> Path:
    """The configured path, else the one beside the data root."""
    if configured:
        path = Path(configured)
    elif data_root is not None:
        path = default_schema_path(data_root)
    else:
        raise SchemaError("no domain schema: name a schema.json (datagen.schema)")
    if not path.is_file():
        raise SchemaError(
            f"domain schema not found: {path} (set datagen.schema to the release's res/schema.json or a copy of it)"
        )
    return path


def load_schema(path: str | Path, domains: Sequence[str] | str = "all") -> tuple[Domain, ...]:
    """The schema's domains (all, or the named ones in the schema's order), checked field by field."""
    path = Path(path)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        raise SchemaError(f"{path}: cannot read the schema: {err}") from None
    if not isinstance(raw, list):
        raise SchemaError(f"{path}: expected a list of domain objects, got {type(raw).__name__}")
    parsed = [_domain(item, f"{path}: [{i}]") for i, item in enumerate(raw)]
    names = [d.name for d in parsed]
    for i, d in enumerate(parsed):
        # a domain becomes the folder task/<Domain>/ of the data and a key of every profile
        if (
            not d.name
            or d.name != d.name.strip()
            or d.name.startswith(".")
            or d.name == MULTI_DOMAIN
            or any(c in d.name for c in "/\\")
        ):
            raise SchemaError(
                f"{path}: [{i}].domain: {d.name!r} cannot name a domain folder task/<Domain>/ "
                f"(empty, surrounding spaces, a leading dot, a slash, or {MULTI_DOMAIN!r})"
            )
    if len(set(names)) != len(names):
        raise SchemaError(f"{path}: a domain is listed twice")
    if domains == "all":
        return tuple(parsed)
    wanted = list(domains)
    unknown = [d for d in wanted if d not in names]
    if unknown:
        raise SchemaError(f"datagen.domains: {unknown} not in {path} (it has {names})")
    return tuple(d for d in parsed if d.name in wanted)


def _field(obj: dict, key: str, kind: type, where: str) -> Any:
    if key not in obj:
        raise SchemaError(f"{where}.{key}: missing")
    value = obj[key]
    if not isinstance(value, kind):
        raise SchemaError(f"{where}.{key}: expected {kind.__name__}, got {type(value).__name__}")
    return value


def _strings(value: list, where: str) -> tuple[str, ...]:
    if not all(isinstance(v, str) for v in value):
        raise SchemaError(f"{where}: expected a list of strings")
    return tuple(value)


def _domain(obj: Any, where: str) -> Domain:
    if not isinstance(obj, dict):
        raise SchemaError(f"{where}: expected an object")
    affinities = tuple(
        _affinity(a, f"{where}.affinities[{i}]") for i, a in enumerate(_field(obj, "affinities", list, where))
    )
    if not affinities:
        raise SchemaError(f"{where}.affinities: empty")
    tasks = tuple(
        DomainTask(_field(t, "name", str, f"{where}.tasks[{i}]"), _field(t, "description", str, f"{where}.tasks[{i}]"))
        for i, t in enumerate(obj.get("tasks", []))
    )
    return Domain(_field(obj, "domain", str, where), str(obj.get("description", "")), tasks, affinities)


def _affinity(obj: Any, where: str) -> AffinityType:
    if not isinstance(obj, dict):
        raise SchemaError(f"{where}: expected an object")
    values = obj.get("possible_values") or []
    if not isinstance(values, list):
        raise SchemaError(f"{where}.possible_values: expected a list")
    return AffinityType(
        name=_field(obj, "name", str, where),
        description=str(obj.get("description", "")),
        is_categorical=_field(obj, "is_categorical", bool, where),
        has_multiple_values=_field(obj, "has_multiple_values", bool, where),
        possible_values=_strings(values, f"{where}.possible_values"),  # as listed, repeats included
    )
