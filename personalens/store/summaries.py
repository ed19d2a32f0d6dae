"""What each `generate` or `judge` invocation did (its counts, tokens and seconds), one JSON line per
invocation in `<out_dir>/logs/summaries/<command>[.shard-KKK-of-NNN].jsonl`. The Parquet tables hold
per-turn token counts but not the prefix cache's share nor the wall time, which `personalens plan
plan.calibrate=<run>` reads here to estimate a larger run. Beside them, `spec_decode` holds one line per
speculative model and invocation: vLLM's spec-decode counters over it (`spec_decode_recorded`)."""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from personalens.engines.spec_decode import SpecDecodeWatch

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


@contextmanager
def spec_decode_recorded(out_dir: Path, command: str, index: int, count: int) -> Iterator[SpecDecodeWatch]:
    """A watch that the block shows the engines it gets (engines/spec_decode.py); when the block ends,
    however it ends (a stopped invocation records what it did), one `spec_decode` line per speculative
    model it saw: its counters over the block."""
    watch = SpecDecodeWatch(command)
    try:
        yield watch
    finally:
        for record in watch.records():
            append_summary(out_dir, "spec_decode", index, count, record)
