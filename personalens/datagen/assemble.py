"""Write built data in the official release layout (docs: ../DATA-FORMAT, personalens/data/loading.py):
`task/<Domain>/task.jsonl`, `task/Multi-Domain/task.jsonl` and `profile/userN/{profile.json,tasks.json,
tasks_md.json}`. Every profile holds every domain of the root (the loader expects them all): the
release's 20, those the build did not cover with interest 0, no affinities and no interactions, then
any the schema added. Each built domain gets its task file even when it has no task, since the task
files are what declare a data root's domains (`personalens.data.domains_of`)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from personalens.data.loading import ASSIGNMENT_FILES, MULTI_DOMAIN, PROFILE_DIR, PROFILE_FILE, TASK_DIR, TASK_FILE
from personalens.datagen.tasks import BuiltTask

TEXTS = ("Task Description", "User Intent", "Task Goal")


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _dump(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, indent=1) + "\n"


def definition(task: BuiltTask) -> dict:
    """A task.jsonl line (multi-domain definitions also name their domains)."""
    line = {"Task Number": task.number, **{k: task.fields[k] for k in TEXTS}}
    if task.task_id.startswith("MD-"):
        line["Relevant Domains"] = task.domains
    line["Relevant Affinity Types"] = task.fields["Relevant Affinity Types"]
    return line


def assignment(task: BuiltTask, situation: Mapping[str, str]) -> dict:
    """A user's copy of a task, in the key order of the release's tasks.json."""
    return {
        **{k: task.fields[k] for k in TEXTS},
        "Relevant Affinity Types": task.fields["Relevant Affinity Types"],
        "task_id": task.task_id,
        "situations": dict(situation),
        "Relevant Domains": task.domains,
    }


def write_tasks(root: Path, tasks: Sequence[BuiltTask], domains: Sequence[str]) -> list[Path]:
    """The task files of the built `domains` and of the multi-domain tasks."""
    by_folder: dict[str, list[BuiltTask]] = {domain: [] for domain in domains}
    for task in tasks:
        by_folder.setdefault(MULTI_DOMAIN if task.task_id.startswith("MD-") else task.domains[0], []).append(task)
    paths = []
    for folder, group in by_folder.items():
        path = root / TASK_DIR / folder / TASK_FILE
        _write(path, "".join(json.dumps(definition(t), ensure_ascii=False) + "\n" for t in group))
        paths.append(path)
    return paths


def profile(
    index: int,
    demographics: Mapping[str, str],
    domains: Sequence[str],
    interests: Mapping[str, int],
    affinities: Mapping[str, dict],
    interactions: Mapping[str, str],
) -> dict:
    """A profile.json over the root's `domains` (`with_domains` of the built ones)."""
    return {
        "demographics": {"user_id": f"user{index}", **demographics},
        "interests": {d: int(interests.get(d, 0)) for d in domains},
        "affinities": {d: affinities.get(d, {}) for d in domains},
        "interactions": {d: interactions.get(d, "") for d in domains},
    }


def write_user(
    root: Path, index: int, profile_obj: dict, tasks: Sequence[BuiltTask], situations: Mapping[str, Mapping[str, str]]
) -> None:
    user_dir = root / PROFILE_DIR / f"user{index}"
    _write(user_dir / PROFILE_FILE, _dump(profile_obj))
    for kind, name in ASSIGNMENT_FILES.items():
        chosen = [t for t in tasks if t.task_id.startswith(f"{kind}-")]
        _write(
            user_dir / name,
            _dump({f"Task {k}": assignment(t, situations[t.task_id]) for k, t in enumerate(chosen, start=1)}),
        )
