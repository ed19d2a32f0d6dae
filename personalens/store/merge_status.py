"""`<run>/merge.json`: what the last `personalens merge` found (complete or not, the rows it counted,
one line per shard problem), written by merge and named by the report, so that a report over the
shards that finished says which did not and why."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

STATUS_FILE = "merge.json"


def write_merge_status(run_dir: Path, status: dict[str, Any]) -> Path:
    """Write `status` as the run's merge.json, atomically (readers never see half a file)."""
    path = Path(run_dir) / STATUS_FILE
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(status, indent=1) + "\n")
    os.replace(tmp, path)
    return path


def read_merge_status(run_dir: Path) -> dict[str, Any] | None:
    """The run's merge.json, or None when no merge ran there (or it is unreadable)."""
    try:
        value = json.loads((Path(run_dir) / STATUS_FILE).read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None
