"""Read the official PersonaLens release (or anything in its layout) into records, as released.

The release layout: `profile/userN/{profile.json,tasks.json,tasks_md.json}` and
`task/<Domain>/task.jsonl`. Every fault is recorded as a Problem with its file and field path;
the `load_*` functions raise them as one DataError, `validate` (validate.py) walks the same
readers over the whole root and keeps them all. Only the selected users' files are opened.

Two quirks of the public release are warnings, read the way the released code reads them: a
user's copy of a task that differs from its definition (the copy is used, as the released code
uses it), and a per-domain key with stray punctuation (`"Buses**"`, read as `"Buses"`).

The domains of a root are the release's 20 and any other `task/<Domain>/` folder that holds a task
file (a domain a lab added, `domains_of`); every profile holds every domain of its root. A folder
whose name is not UTF-8 (`task/Caf\xe9/`, Latin-1) names no domain, since profiles (JSON, UTF-8)
could not name it: it is an error that names the folder, escaped so that it can be printed.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable
from pathlib import Path

from personalens.data import files
from personalens.data.errors import DataError, Problems, summarize_warnings
from personalens.data.parsing import (  # the layout's names stay importable from here
    ASSIGNMENT_FILES as ASSIGNMENT_FILES,
)
from personalens.data.parsing import (
    DEMOGRAPHIC_KEYS as DEMOGRAPHIC_KEYS,
)
from personalens.data.parsing import (
    DOMAIN_KEY_NORMALISED as DOMAIN_KEY_NORMALISED,
)
from personalens.data.parsing import (
    MULTI_DOMAIN,
    PROFILE_DIR,
    PROFILE_FILE,
    TASK_DIR,
    TASK_FILE,
    UNREADABLE,
    At,
    parse_assignments,
    parse_definition,
    parse_profile,
    read_json,
    read_jsonl,
)
from personalens.data.parsing import (
    TASK_COPY_DIFFERS as TASK_COPY_DIFFERS,
)
from personalens.data.records import (
    DOMAINS,
    Kind,
    Scenario,
    Situation,
    Task,
    UserProfile,
    with_domains,
)
from personalens.data.selection import task_kinds, user_indices

_USER_DIR = re.compile(r"user(0|[1-9][0-9]*)", re.ASCII)
IGNORED_ENTRY = "an entry of profile/ that is not a user directory is ignored"
NOT_UTF8 = (
    "the folder name is not UTF-8 (undecodable bytes shown escaped): no profile can name it as a domain; "
    "rename it to UTF-8 text"
)
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


def domains_of(root: str | Path, problems: Problems | None = None) -> tuple[str, ...]:
    """The domains of a data root: the release's, then each other `task/<Domain>/` folder with a
    task file, by name. A folder without one (or a misspelt one) declares nothing: the files that
    name it are reported as naming an unknown domain. A folder whose name is not UTF-8 declares
    nothing either, and is an error in `problems`."""
    task_dir = Path(root) / TASK_DIR
    if not task_dir.is_dir():
        return DOMAINS
    with os.scandir(task_dir) as entries:
        folders = sorted(e.name for e in entries if e.is_dir() and not e.name.startswith("."))
    named = []
    for name in folders:
        shown = files.printable(name)
        if shown != name:
            if problems is not None:
                problems.add(f"{TASK_DIR}/{shown}/", "", NOT_UTF8)
        elif name != MULTI_DOMAIN and (task_dir / name / TASK_FILE).is_file():
            named.append(name)
    return with_domains(named)


def load_task_definitions(root: str | Path) -> dict[str, Task]:
    """task_id -> Task for every line of every `task/<Domain>/task.jsonl` (SD ids first, MD last)."""
    problems = Problems()
    definitions = read_task_definitions(_existing_root(root), domains_of(root, problems), problems)
    problems.raise_if_any(files.printable(str(root)))
    return definitions


def load_user(root: str | Path, index: int) -> UserProfile:
    """The profile of user `index` (reads only `profile/user<index>/profile.json`)."""
    path = _existing_root(root)
    _require_user_dirs(path, (index,))
    problems = Problems()
    profile, _ = read_user_files(path, index, (), domains_of(path, problems), {}, problems)
    problems.raise_if_any(files.printable(str(root)))
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
    domains = domains_of(path, problems)
    definitions = read_task_definitions(path, domains, problems)
    scenarios: list[Scenario] = []
    for index in selected:
        profile, assigned = read_user_files(path, index, kind_list, domains, definitions, problems)
        if profile is not None:
            scenarios.extend(
                Scenario(profile, task, situation) for kind in kind_list for task, situation in assigned[kind]
            )
    problems.raise_if_any(files.printable(str(root)), strict)
    for line in summarize_warnings(problems.warnings):
        log.warning("%s: %s", files.printable(str(root)), line)
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
        if files.printable(folder) != folder:
            continue  # not UTF-8: reported by domains_of
        if folder not in order:
            problems.add(f"{TASK_DIR}/{folder}/", "", f"unknown domain {folder!r}")
            continue
        rel = f"{TASK_DIR}/{folder}/{TASK_FILE}"
        for at, obj in read_jsonl(root, rel, problems):
            task = parse_definition(obj, folder, domains, at)
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
    obj = read_json(root, rel, problems)
    profile = None if obj is UNREADABLE else parse_profile(obj, index, domains, At(problems, rel))
    seen: dict[str, str] = {}  # task_id -> where it was first assigned, across both files
    assigned: dict[Kind, list[tuple[Task, Situation]]] = {}
    for kind in kinds:
        rel = f"{user_dir}/{ASSIGNMENT_FILES[kind]}"
        obj = read_json(root, rel, problems)
        assigned[kind] = (
            []
            if obj is UNREADABLE
            else parse_assignments(obj, kind, domains, definitions, profile, seen, At(problems, rel))
        )
    return profile, assigned


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
