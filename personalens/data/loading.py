"""Read the official PersonaLens release (or anything in its layout) into records, as released.

The release layout: `profile/userN/{profile.json,tasks.json,tasks_md.json}` and
`task/<Domain>/task.jsonl`. Every fault is recorded as a Problem with its file and field path;
the `load_*` functions raise them as one DataError, `validate` (validate.py) walks the same
readers over the whole root and keeps them all. Only the selected users' files are opened.

Two quirks of the public release are warnings, read the way the released code reads them: a
user's copy of a task that differs from its definition (the copy is used, as the released code
uses it), and a per-domain key with stray punctuation (`"Buses**"`, read as `"Buses"`).

The domains of a root are the release's 20 and any other `task/<Domain>/` folder that holds a task
file (a domain a lab added, `domains_of`); every profile holds every domain of its root.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from personalens.data import files
from personalens.data.errors import DataError, Problems, summarize_warnings
from personalens.data.records import (
    DOMAINS,
    SITUATION_KEYS,
    Kind,
    Scenario,
    Situation,
    Task,
    UserProfile,
    with_domains,
)
from personalens.data.selection import task_kinds, user_indices

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

_USER_DIR = re.compile(r"user(0|[1-9][0-9]*)", re.ASCII)
_SD_ID = re.compile(r"SD-(.+)-task-(\d+)")
_MD_ID = re.compile(r"MD-task-(\d+)")
_UNREADABLE = object()  # a file that is missing or not JSON (already reported)
_STRAY = re.compile(r"[^\w ]+")  # what may surround a domain name in a key ("Buses**")

# the kinds of warning (see the module docstring)
TASK_COPY_DIFFERS = "a user's task copy differs from its definition; the user's copy is used, as the released code does"
DOMAIN_KEY_NORMALISED = "a domain key with stray punctuation is read as that domain"
IGNORED_ENTRY = "an entry of profile/ that is not a user directory is ignored"
NO_USERS = "profile/ holds no user directory"

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------- public API


def list_user_indices(root: str | Path) -> list[int]:
    """Indices of every `profile/userN` directory under root, ascending; what else is in profile/
    is logged as warnings (`validate` lists them)."""
    problems = Problems()
    indices = read_user_listing(_existing_root(root), problems)
    for line in summarize_warnings(problems.warnings):
        log.warning("%s: %s", files.printable(str(root)), line)
    return indices


def read_user_listing(root: Path, problems: Problems) -> list[int]:
    """The user indices of `profile/`; each entry that is not a `user<ASCII digits>` directory is a
    warning naming it (printable even when the name is not UTF-8), a symlink loop included."""
    profile_dir = root / PROFILE_DIR
    if not profile_dir.is_dir():
        raise DataError(
            f"{PROFILE_DIR}/: missing in {files.printable(str(root))}; point the data root at the release's "
            "data/ directory"
        )
    indices = []
    with os.scandir(profile_dir) as entries:
        for entry in entries:
            name = files.printable(entry.name)
            rel = f"{PROFILE_DIR}/{name}"
            match = _USER_DIR.fullmatch(entry.name)
            try:
                is_dir = entry.is_dir() and os.path.isdir(os.path.realpath(entry.path, strict=True))
            except OSError:
                problems.add(rel, "", "a broken symbolic link or link loop: ignored", IGNORED_ENTRY)
                continue
            if match and is_dir:
                indices.append(int(match.group(1)))
            elif match:
                problems.add(rel, "", "a user entry that is not a directory: ignored", IGNORED_ENTRY)
            elif not entry.name.startswith("."):
                problems.add(rel, "", "not named user<digits 0-9>: ignored", IGNORED_ENTRY)
    if not indices:
        problems.add(f"{PROFILE_DIR}/", "", "no user directories (profile/user0, profile/user1, ...)", NO_USERS)
    return sorted(indices)


def domains_of(root: str | Path) -> tuple[str, ...]:
    """The domains of a data root: the release's, then each other `task/<Domain>/` folder with a
    task file, by name. A folder without one (or a misspelt one) declares nothing: the files that
    name it are reported as naming an unknown domain."""
    task_dir = Path(root) / TASK_DIR
    if not task_dir.is_dir():
        return DOMAINS
    with os.scandir(task_dir) as entries:
        return with_domains(
            e.name
            for e in entries
            if e.is_dir()
            and not e.name.startswith(".")
            and e.name != MULTI_DOMAIN
            and (task_dir / e.name / TASK_FILE).is_file()
        )


def load_task_definitions(root: str | Path) -> dict[str, Task]:
    """task_id -> Task for every line of every `task/<Domain>/task.jsonl` (SD ids first, MD last)."""
    problems = Problems()
    definitions = read_task_definitions(_existing_root(root), domains_of(root), problems)
    problems.raise_if_any(root)
    return definitions


def load_user(root: str | Path, index: int) -> UserProfile:
    """The profile of user `index` (reads only `profile/user<index>/profile.json`)."""
    path = _existing_root(root)
    _require_user_dirs(path, (index,))
    problems = Problems()
    profile, _ = read_user_files(path, index, (), domains_of(path), {}, problems)
    problems.raise_if_any(root)
    assert profile is not None  # no problems means the profile parsed
    return profile


def load_scenarios(
    root: str | Path, users: object = "all", kinds: object = "both", strict: bool = False
) -> list[Scenario]:
    """Every (user, assigned task) scenario of the selected users and task kinds.

    Order: by user index, then SD before MD, then the order of the user's tasks file.
    `users` and `kinds` take the `data.users` / `data.kinds` specs (see selection.py). Warnings
    are logged, grouped by kind; with `strict` they are errors.
    """
    path = _existing_root(root)
    selected = user_indices(users)
    kind_list = task_kinds(kinds)
    problems = Problems()
    if selected is None:
        selected = tuple(read_user_listing(path, problems))
    else:
        _require_user_dirs(path, selected)
    if not selected:
        raise DataError(f"0 users selected in {files.printable(str(root))}: profile/ holds no user directory")
    domains = domains_of(path)
    definitions = read_task_definitions(path, domains, problems)
    scenarios: list[Scenario] = []
    for index in selected:
        profile, assigned = read_user_files(path, index, kind_list, domains, definitions, problems)
        if profile is not None:
            scenarios.extend(
                Scenario(profile, task, situation) for kind in kind_list for task, situation in assigned[kind]
            )
    problems.raise_if_any(root, strict)
    for line in summarize_warnings(problems.warnings):
        log.warning("%s: %s", root, line)
    return scenarios


# ------------------------------------------------- readers shared with validate.py


def read_task_definitions(root: Path, domains: tuple[str, ...], problems: Problems) -> dict[str, Task]:
    """Parse every task.jsonl under `task/` (the root's `domains`), noting each fault in `problems`."""
    task_dir = root / TASK_DIR
    if not task_dir.is_dir():
        problems.add(f"{TASK_DIR}/", "", "missing directory (the task definitions)")
        return {}
    with os.scandir(task_dir) as entries:
        folders = [e.name for e in entries if e.is_dir() and not e.name.startswith(".")]
    order = {name: i for i, name in enumerate(domains + (MULTI_DOMAIN,))}
    definitions: dict[str, Task] = {}
    for folder in sorted(folders, key=lambda name: (order.get(name, len(order)), name)):
        if folder not in order:
            problems.add(f"{TASK_DIR}/{folder}/", "", f"unknown domain {folder!r}")
            continue
        rel = f"{TASK_DIR}/{folder}/{TASK_FILE}"
        for at, obj in _read_jsonl(root, rel, problems):
            task = _parse_definition(obj, folder, domains, at)
            if task is None:
                continue
            if task.task_id in definitions:
                (at / "Task Number").report(f"duplicate definition of {task.task_id}")
            else:
                definitions[task.task_id] = task
    return definitions


def read_user_files(
    root: Path,
    index: int,
    kinds: Iterable[Kind],
    domains: tuple[str, ...],
    definitions: dict[str, Task],
    problems: Problems,
) -> tuple[UserProfile | None, dict[Kind, list[tuple[Task, Situation]]]]:
    """Parse one user's profile and the assignment files of `kinds`, checked against the root's
    `domains` and `definitions`."""
    user_dir = f"{PROFILE_DIR}/user{index}"
    rel = f"{user_dir}/{PROFILE_FILE}"
    obj = _read_json(root, rel, problems)
    profile = None if obj is _UNREADABLE else _parse_profile(obj, index, domains, _At(problems, rel))
    seen: dict[str, str] = {}  # task_id -> where it was first assigned, across both files
    assigned: dict[Kind, list[tuple[Task, Situation]]] = {}
    for kind in kinds:
        rel = f"{user_dir}/{ASSIGNMENT_FILES[kind]}"
        obj = _read_json(root, rel, problems)
        assigned[kind] = (
            []
            if obj is _UNREADABLE
            else _parse_assignments(obj, kind, domains, definitions, profile, seen, _At(problems, rel))
        )
    return profile, assigned


# --------------------------------------------------------------------- file reading


@dataclass(frozen=True)
class _At:
    """A place in one file (optional line, then a field path) at which problems are reported."""

    problems: Problems
    file: str
    line: int | None = None
    path: tuple[str | int, ...] = ()

    def __truediv__(self, key: str | int) -> _At:
        return _At(self.problems, self.file, self.line, self.path + (key,))

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


def _read_json(root: Path, rel: str, problems: Problems) -> Any:
    text = _read_text(root, rel, problems)
    if text is None:
        return _UNREADABLE
    try:
        value, warnings = files.loads(text, rel)
    except DataError as e:
        problems.items.extend(e.problems)
        return _UNREADABLE
    problems.items.extend(warnings)
    return value


def _read_jsonl(root: Path, rel: str, problems: Problems) -> Iterator[tuple[_At, Any]]:
    """(place, object) for each non-blank line that is valid JSON; lazily, so problems come in line order."""
    text = _read_text(root, rel, problems)
    for number, line in files.json_lines(text or ""):
        try:
            obj, warnings = files.loads(line, rel, number)
        except DataError as e:
            problems.items.extend(e.problems)
            continue
        problems.items.extend(warnings)
        yield _At(problems, rel, number), obj


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


def _is(value: Any, kind: type, at: _At) -> bool:
    """Whether value has JSON type `kind` (a bool is not an integer); reports it when not."""
    ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
    if not ok:
        at.report(f"expected {_JSON_TYPE_NAMES[kind]}, got {_json_type(value)}")
    return ok


def _json_type(value: Any) -> str:
    return _JSON_TYPE_NAMES.get(type(value), type(value).__name__)


def _get(obj: dict, key: str, kind: type, at: _At) -> Any:
    """obj[key] when present and of JSON type `kind`; otherwise report it and return None."""
    if key not in obj:
        (at / key).report("missing")
        return None
    return obj[key] if _is(obj[key], kind, at / key) else None


def _strings(value: Any, at: _At) -> tuple[str, ...] | None:
    if not _is(value, list, at):
        return None
    flags = [_is(item, str, at / i) for i, item in enumerate(value)]
    return tuple(value) if all(flags) else None


def _get_strings(obj: dict, key: str, at: _At) -> tuple[str, ...] | None:
    value = _get(obj, key, list, at)
    return None if value is None else _strings(value, at / key)


def _per_domain(obj: dict, key: str, domains: tuple[str, ...], at: _At, parse_value) -> dict[str, Any] | None:
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


def _domain_key(name: str, mapping: dict, domains: tuple[str, ...], at: _At) -> str | None:
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


def _parse_profile(obj: Any, index: int, domains: tuple[str, ...], at: _At) -> UserProfile | None:
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


def _parse_demographics(obj: dict, index: int, at: _At) -> dict[str, str] | None:
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


def _parse_interest(value: Any, at: _At) -> int | None:
    if not _is(value, int, at):
        return None
    if value not in (0, 1):
        at.report(f"expected 0 or 1, got {value}")
        return None
    return value


def _parse_affinities(value: Any, at: _At) -> dict[str, str | tuple[str, ...]] | None:
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


def _parse_definition(obj: Any, folder: str, domains: tuple[str, ...], at: _At) -> Task | None:
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


def _known_domains(named: tuple[str, ...], domains: tuple[str, ...], at: _At, minimum: int) -> bool:
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


def _parse_assignments(
    obj: Any,
    kind: Kind,
    domains: tuple[str, ...],
    definitions: dict[str, Task],
    profile: UserProfile | None,
    seen: dict[str, str],
    at: _At,
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
    at: _At,
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


def _interested(task: Task, profile: UserProfile, at: _At) -> bool:
    """A task may only be assigned in domains the user's interests mask includes."""
    excluded = [d for d in task.domains if profile.interests.get(d) == 0]
    for domain in excluded:
        (at / "task_id").report(
            f"{task.task_id} is in domain {domain!r}, which the user's "
            f'interests exclude ({PROFILE_FILE} "interests"."{domain}" is 0)'
        )
    return not excluded


def _parse_situation(entry: dict, at: _At) -> Situation | None:
    situation = _get(entry, "situations", dict, at)
    if situation is None:
        return None
    values = [_get(situation, key, str, at / "situations") for key in SITUATION_KEYS]
    return None if None in values else Situation(*values)


# ------------------------------------------------------------------------- helpers


def _existing_root(root: str | Path) -> Path:
    path = Path(root)
    if not path.is_dir():
        raise DataError(f"data root {files.printable(str(root))} does not exist or is not a directory")
    return path


def _require_user_dirs(root: Path, indices: Iterable[int]) -> None:
    missing = [f"{PROFILE_DIR}/user{i}" for i in indices if not (root / PROFILE_DIR / f"user{i}").is_dir()]
    if missing:
        shown = ", ".join(missing[:10]) + (f" and {len(missing) - 10} more" if len(missing) > 10 else "")
        raise DataError(f"selected user directory missing in {root}: {shown}")
