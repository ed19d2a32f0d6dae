"""Parquet part-file datasets: results stream to disk as they finish, and a re-run resumes.

A table is a folder `<name>/shard-KKK-of-NNN/` of part files. Each write is one whole file,
written under a temporary name and renamed, so a killed run leaves only complete files."""

from __future__ import annotations

import os
import uuid
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq


def shard_dir(out_dir: Path, table: str, index: int, count: int) -> Path:
    return Path(out_dir) / table / f"shard-{index:03d}-of-{count:03d}"


class PartWriter:
    """Appends rows to a shard folder, one part file per `write` call."""

    def __init__(self, folder: Path, schema: pa.Schema):
        self.folder = Path(folder)
        self.schema = schema
        self.folder.mkdir(parents=True, exist_ok=True)

    def write(self, rows: Sequence[dict]) -> Path | None:
        if not rows:
            return None
        table = pa.Table.from_pylist(list(rows), schema=self.schema)
        # a unique name, so concurrent writers (a re-submitted job next to a stale one) never clash
        name = f"part-{_next_index(self.folder):05d}-{uuid.uuid4().hex[:8]}.parquet"
        tmp = self.folder / f".{name}.tmp"
        pq.write_table(table, tmp)
        os.replace(tmp, self.folder / name)
        return self.folder / name


def _next_index(folder: Path) -> int:
    return sum(1 for p in folder.glob("part-*.parquet"))


def read_table(folder: Path, columns: Sequence[str] | None = None) -> pa.Table | None:
    """All part files under `folder` (recursively); None when there are none."""
    folder = Path(folder)
    files = sorted(folder.rglob("part-*.parquet")) if folder.exists() else []
    if not files:
        return None
    return ds.dataset([str(f) for f in files], format="parquet").to_table(columns=columns)


def existing_values(folder: Path, columns: Sequence[str]) -> set[tuple]:
    """The distinct tuples of `columns` already written under `folder`."""
    table = read_table(folder, columns)
    if table is None:
        return set()
    return set(zip(*(table.column(c).to_pylist() for c in columns)))
