"""What each `generate` or `judge` invocation did (its counts, tokens and seconds), one JSON line per
invocation in `<out_dir>/logs/summaries/<command>[.shard-KKK-of-NNN].jsonl`. The Parquet tables hold
per-turn token counts but not the prefix cache's share nor the wall time, which `personalens plan
plan.calibrate=<run>` reads here to estimate a larger run."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

log = logging.getLogger(__name__)


def summaries_dir(out_dir: Path) -> Path:
    return Path(out_dir) / "logs" / "summaries"


def append_summary(out_dir: Path, command: str, index: int, count: int, summary: object) -> None:
    """One line for this invocation (`summary` a dataclass, nested ones as objects); a failed write is
    a warning, as the results are already saved."""
    shard = f".shard-{index:03d}-of-{count:03d}" if count > 1 else ""
    path = summaries_dir(out_dir) / f"{command}{shard}.jsonl"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(dataclasses.asdict(summary), sort_keys=True) + "\n")
    except OSError as err:
        log.warning(f"{command}: could not write its summary to {path}: {err.strerror or err}")


def read_summaries(out_dir: Path, command: str) -> list[dict]:
    """Every invocation's record of `command` in a run, shards together; unreadable lines are skipped."""
    records = []
    for path in sorted(summaries_dir(out_dir).glob(f"{command}*.jsonl")):
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut off by a kill
            if isinstance(record, dict):
                records.append(record)
    return records
