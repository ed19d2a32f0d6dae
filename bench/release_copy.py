"""A release-sized data root made from a small one: the benchmarks' stand-in for the complete
PersonaLens release, which is not bundled (its users are copied round-robin under new indices,
with the same files and sizes as real users)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from personalens.data import list_user_indices


def replicate(root: Path, users: int, into: Path) -> Path:
    """A copy of `root`'s tasks with `users` user directories cycling through its users."""
    shutil.copytree(root / "task", into / "task")
    sources = list_user_indices(root)
    for i in range(users):
        target = into / "profile" / f"user{i}"
        shutil.copytree(root / "profile" / f"user{sources[i % len(sources)]}", target)
        path = target / "profile.json"
        profile = json.loads(path.read_text())
        profile["demographics"]["user_id"] = f"user{i}"  # must match its directory
        path.write_text(json.dumps(profile, indent=4))
    return into
