"""A Hugging Face hub cache built on disk the way `hf download` leaves it, for tests: under
`<cache>/models--ORG--NAME/`, the files as content-named `blobs/`, `snapshots/<commit>/` holding
relative symbolic links to them, and `refs/<branch>` holding the commit. The blobs are hard links to
the source files where the file system allows (a 270 MB model costs nothing), else copies."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path


def _blob(source: Path, blobs: Path) -> Path:
    digest = hashlib.sha256()
    with open(source, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    blob = blobs / digest.hexdigest()
    if not blob.exists():
        try:
            os.link(source, blob)
        except OSError:
            shutil.copyfile(source, blob)
    return blob


def add_snapshot(cache: Path, repo_id: str, source: Path, commit: str, refs: tuple[str, ...] = ("main",)) -> Path:
    """Puts the files of `source` into `cache` as `repo_id` at `commit`, with `refs` pointing at it;
    returns the snapshot folder."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    blobs, snapshot = repo / "blobs", repo / "snapshots" / commit
    blobs.mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True, exist_ok=True)
    for file in sorted(source.iterdir()):
        if file.is_file():
            link = snapshot / file.name
            link.unlink(missing_ok=True)
            link.symlink_to(os.path.relpath(_blob(file, blobs), snapshot))
    (repo / "refs").mkdir(exist_ok=True)
    for ref in refs:
        (repo / "refs" / ref).write_text(commit)  # no newline, as huggingface_hub writes it
    return snapshot
