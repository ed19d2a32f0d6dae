"""Parse the release's files into records: the file readers that note faults as Problems, the
field checks, and the parsers of profiles, task definitions and assignments (used by loading.py,
which walks a data root with them). Every fault is recorded with its file and field path."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from personalens.data import files
from personalens.data.errors import DataError, Problems
from personalens.data.records import (
    SITUATION_KEYS,
    Kind,
    Situation,
    Task,
    UserProfile,
)

PROFILE_DIR = "profile"
TASK_DIR = "task"
MULTI_DOMAIN = "Multi-Domain"
TASK_FILE = "task.jsonl"
PROFILE_FILE = "profile.json"
ASSIGNMENT_FILES: dict[Kind, str] = {"SD": "tasks.json", "MD": "tasks_md.json"}
DEMOGRAPHIC_KEYS: tuple[str, ...] = (
    "user_id",
    "age",
    "gender",
    "employment_status",
    "education",
    "marital_status",
    "english_proficiency",
    "ethnicity",
    "religion",
    "birth_country",
    "reside_country",
)
# Task fields as the release spells them -> Task attribute; a user's copy must equal the definition.
TEXT_FIELDS: dict[str, str] = {"Task Description": "description", "User Intent": "user_intent", "Task Goal": "goal"}
LIST_FIELDS: dict[str, str] = {"Relevant Domains": "domains", "Relevant Affinity Types": "affinity_types"}

_SD_ID = re.compile(r"SD-(.+)-task-(\d+)")
_MD_ID = re.compile(r"MD-task-(\d+)")
UNREADABLE = object()  # a file that is missing or not JSON (already reported)
_STRAY = re.compile(r"[^\w ]+")  # what may surround a domain name in a key ("Buses**")

# the kinds of warning (see the module docstring)
TASK_COPY_DIFFERS = "a user's task copy differs from its definition; the user's copy is used, as the released code does"
DOMAIN_KEY_NORMALISED = "a domain key with stray punctuation is read as that domain"


# --------------------------------------------------------------------- file reading


@dataclass(frozen=True)
class At:
    """A place in one file (optional line, then a field path) at which problems are reported."""

    problems: Problems
    file: str
    line: int | None = None
    path: tuple[str | int, ...] = ()

    def __truediv__(self, key: str | int) -> At:
        return At(self.problems, self.file, self.line, self.path + (key,))

    def report(self, message: str, kind: str | None = None) -> None:
        """An error, or with `kind` a warning of that kind."""
        field_path = "".join(f"[{k}]" if isinstance(k, int) else f".{json.dumps(k)}" for k in self.path)[1:]
        line = f"line {self.line}" if self.line is not None else ""
        self.problems.add(self.file, ", ".join(p for p in (line, field_path) if p), message, kind)


def _read_text(root: Path, rel: str, problems: Problems) -> str | None:
    try:
        text, warnings = files.read_text(root / rel, rel)
    except DataError as e:
        problems.items.extend(e.problems)
        return None
    problems.items.extend(warnings)
    return text


def read_json(root: Path, rel: str, problems: Problems) -> Any:
    text = _read_text(root, rel, problems)
    if text is None:
        return UNREADABLE
    try:
        value, warnings = files.loads(text, rel)
    except DataError as e:
        problems.items.extend(e.problems)
        return UNREADABLE
    problems.items.extend(warnings)
    return value


def read_jsonl(root: Path, rel: str, problems: Problems) -> Iterator[tuple[At, Any]]:
    """(place, object) for each non-blank line that is valid JSON; lazily, so problems come in line order."""
    text = _read_text(root, rel, problems)
    for number, line in files.json_lines(text or ""):
        try:
            obj, warnings = files.loads(line, rel, number)
        except DataError as e:
            problems.items.extend(e.problems)
            continue
        problems.items.extend(warnings)
        yield At(problems, rel, number), obj


# -------------------------------------------------------------------- field checks

_JSON_TYPE_NAMES = {
    dict: "an object",
    list: "a list",
    str: "a string",
    int: "an integer",
    float: "a number",
    bool: "a boolean",
    type(None): "null",
}


def _is(value: Any, kind: type, at: At) -> bool:
    """Whether value has JSON type `kind` (a bool is not an integer); reports it when not."""
    ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
    if not ok:
        at.report(f"expected {_JSON_TYPE_NAMES[kind]}, got {_json_type(value)}")
    return ok


def _json_type(value: Any) -> str:
    return _JSON_TYPE_NAMES.get(type(value), type(value).__name__)


def _get(obj: dict, key: str, kind: type, at: At) -> Any:
    """obj[key] when present and of JSON type `kind`; otherwise report it and return None."""
    if key not in obj:
        (at / key).report("missing")
        return None
    return obj[key] if _is(obj[key], kind, at / key) else None


def _strings(value: Any, at: At) -> tuple[str, ...] | None:
    if not _is(value, list, at):
        return None
    flags = [_is(item, str, at / i) for i, item in enumerate(value)]
    return tuple(value) if all(flags) else None


def _get_strings(obj: dict, key: str, at: At) -> tuple[str, ...] | None:
    value = _get(obj, key, list, at)
    return None if value is None else _strings(value, at / key)


def _per_domain(obj: dict, key: str, domains: tuple[str, ...], at: At, parse_value) -> dict[str, Any] | None:
    """A domain -> value object that must hold every domain of the root, in the file's order."""
    mapping = _get(obj, key, dict, at)
    if mapping is None:
        return None
    here = at / key
    named = {name: _domain_key(name, mapping, domains, here / name) for name in mapping}
    for domain in domains:
        if domain not in named.values():
            (here / domain).report("missing")
    parsed = {domain: parse_value(mapping[name], here / name) for name, domain in named.items() if domain}
    return parsed if len(parsed) == len(mapping) == len(domains) and None not in parsed.values() else None


def _domain_key(name: str, mapping: dict, domains: tuple[str, ...], at: At) -> str | None:
    """The domain a per-domain key names: itself, or (with a warning) the domain it spells with
    stray punctuation when the object does not also hold that domain; None (an error) otherwise."""
    if name in domains:
        return name
    cleaned = _STRAY.sub("", name).strip()
    if cleaned in domains and cleaned not in mapping:
        at.report(f"read as {cleaned!r}", DOMAIN_KEY_NORMALISED)
        return cleaned
    at.report(f"unknown domain {name!r}")
    return None


# ------------------------------------------------------------------------ profiles


def parse_profile(obj: Any, index: int, domains: tuple[str, ...], at: At) -> UserProfile | None:
    if not _is(obj, dict, at):
        return None
    demographics = _parse_demographics(obj, index, at)
    interests = _per_domain(obj, "interests", domains, at, _parse_interest)
    affinities = _per_domain(obj, "affinities", domains, at, _parse_affinities)
    interactions = _per_domain(obj, "interactions", domains, at, lambda v, here: v if _is(v, str, here) else None)
    if demographics is None or interests is None or affinities is None or interactions is None:
        return None
    return UserProfile(
        index=index,
        user_id=f"user{index}",
        demographics=demographics,
        interests=interests,
        affinities=affinities,
        interactions=interactions,
    )


def _parse_demographics(obj: dict, index: int, at: At) -> dict[str, str] | None:
    demographics = _get(obj, "demographics", dict, at)
    if demographics is None:
        return None
    here = at / "demographics"
    flags = [_is(value, str, here / key) for key, value in demographics.items()]
    for key in DEMOGRAPHIC_KEYS:
        if key not in demographics:
            flags.append(False)
            (here / key).report("missing")
    user_id = demographics.get("user_id")
    if isinstance(user_id, str) and user_id != f"user{index}":
        flags.append(False)
        (here / "user_id").report(f"{user_id!r} does not match its directory user{index}")
    # user_id is dropped here, as the original pipeline does before showing demographics to models.
    return {k: v for k, v in demographics.items() if k != "user_id"} if all(flags) else None


def _parse_interest(value: Any, at: At) -> int | None:
    if not _is(value, int, at):
        return None
    if value not in (0, 1):
        at.report(f"expected 0 or 1, got {value}")
        return None
    return value


def _parse_affinities(value: Any, at: At) -> dict[str, str | tuple[str, ...]] | None:
    if not _is(value, dict, at):
        return None
    parsed = {}
    for preference, item in value.items():
        if isinstance(item, str):
            parsed[preference] = item
        elif isinstance(item, list):
            parsed[preference] = _strings(item, at / preference)
        else:
            (at / preference).report(f"expected a string or a list of strings, got {_json_type(item)}")
            parsed[preference] = None
    return parsed if None not in parsed.values() else None


# --------------------------------------------------------------------------- tasks


def _definition_file(task_id: str) -> str:
    """Where the definition of a (well-formed) task id lives."""
    match = _SD_ID.fullmatch(task_id)
    folder = match.group(1) if match else MULTI_DOMAIN
    return f"{TASK_DIR}/{folder}/{TASK_FILE}"


def parse_definition(obj: Any, folder: str, domains: tuple[str, ...], at: At) -> Task | None:
    if not _is(obj, dict, at):
        return None
    number = _get(obj, "Task Number", int, at)
    texts = [_get(obj, key, str, at) for key in TEXT_FIELDS]
    affinity_types = _get_strings(obj, "Relevant Affinity Types", at)
    if folder == MULTI_DOMAIN:
        kind: Kind = "MD"
        relevant = _get_strings(obj, "Relevant Domains", at)
        if relevant is not None and not _known_domains(relevant, domains, at / "Relevant Domains", minimum=2):
            relevant = None
        task_id = f"MD-task-{number}"
    else:
        kind, relevant, task_id = "SD", (folder,), f"SD-{folder}-task-{number}"
    if number is None or None in texts or affinity_types is None or relevant is None:
        return None
    description, intent, goal = texts
    return Task(
        task_id=task_id,
        kind=kind,
        description=description,
        user_intent=intent,
        goal=goal,
        domains=relevant,
        affinity_types=affinity_types,
    )


def _known_domains(named: tuple[str, ...], domains: tuple[str, ...], at: At, minimum: int) -> bool:
    """Whether every domain `named` is one of the root's `domains`, and there are at least `minimum`."""
    ok = True
    for i, domain in enumerate(named):
        if domain not in domains:
            (at / i).report(f"unknown domain {domain!r}")
            ok = False
    if len(named) < minimum:
        at.report(f"expected at least {minimum} domains, got {len(named)}")
        ok = False
    return ok


def parse_assignments(
    obj: Any,
    kind: Kind,
    domains: tuple[str, ...],
    definitions: dict[str, Task],
    profile: UserProfile | None,
    seen: dict[str, str],
    at: At,
) -> list[tuple[Task, Situation]]:
    """The (task, situation) pairs of one tasks.json / tasks_md.json, in file order."""
    if not _is(obj, dict, at):
        return []
    assigned = []
    for key, entry in obj.items():
        pair = _parse_assignment(entry, kind, domains, definitions, profile, at / key)
        if pair is None:
            continue
        task_id = pair[0].task_id
        if task_id in seen:
            (at / key / "task_id").report(f"duplicate task id {task_id!r} (also assigned in {seen[task_id]})")
            continue
        seen[task_id] = f"{at.file} {json.dumps(key)}"
        assigned.append(pair)
    return assigned


def _parse_assignment(
    entry: Any,
    kind: Kind,
    domains: tuple[str, ...],
    definitions: dict[str, Task],
    profile: UserProfile | None,
    at: At,
) -> tuple[Task, Situation] | None:
    if not _is(entry, dict, at):
        return None
    situation = _parse_situation(entry, at)
    copy = {
        **{key: _get(entry, key, str, at) for key in TEXT_FIELDS},
        **{key: _get_strings(entry, key, at) for key in LIST_FIELDS},
    }
    task_id = _get(entry, "task_id", str, at)
    if task_id is None:
        return None
    id_at = at / "task_id"
    match = (_SD_ID if kind == "SD" else _MD_ID).fullmatch(task_id)
    if match is None:
        shape = "SD-<Domain>-task-<n>" if kind == "SD" else "MD-task-<n>"
        id_at.report(f"{task_id!r} is not a {'single' if kind == 'SD' else 'multi'}-domain task id ({shape})")
        return None
    if kind == "SD" and match.group(1) not in domains:
        id_at.report(f"unknown domain {match.group(1)!r} in {task_id!r}")
        return None
    task = definitions.get(task_id)
    if task is None:
        id_at.report(f"no definition of {task_id!r} in {_definition_file(task_id)}")
        return None
    relevant = copy["Relevant Domains"]
    consistent = relevant is None or _known_domains(relevant, domains, at / "Relevant Domains", minimum=1)
    differing = {
        attr: copy[key]
        for key, attr in {**TEXT_FIELDS, **LIST_FIELDS}.items()
        if copy[key] is not None and copy[key] != getattr(task, attr)
    }
    if consistent and differing:
        for key, attr in {**TEXT_FIELDS, **LIST_FIELDS}.items():
            if attr in differing:
                (at / key).report(
                    f"{task_id} differs from its definition in {_definition_file(task_id)}", TASK_COPY_DIFFERS
                )
        task = replace(task, **differing)
    if profile is not None:
        consistent &= _interested(task, profile, at)
    if situation is None or None in copy.values() or not consistent:
        return None
    return task, situation


def _interested(task: Task, profile: UserProfile, at: At) -> bool:
    """A task may only be assigned in domains the user's interests mask includes."""
    excluded = [d for d in task.domains if profile.interests.get(d) == 0]
    for domain in excluded:
        (at / "task_id").report(
            f"{task.task_id} is in domain {domain!r}, which the user's "
            f'interests exclude ({PROFILE_FILE} "interests"."{domain}" is 0)'
        )
    return not excluded


def _parse_situation(entry: dict, at: At) -> Situation | None:
    situation = _get(entry, "situations", dict, at)
    if situation is None:
        return None
    values = [_get(situation, key, str, at / "situations") for key in SITUATION_KEYS]
    return None if None in values else Situation(*values)
