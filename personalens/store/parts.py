"""Parquet part-file datasets: results stream to disk as they finish, and a re-run resumes.

A table is a folder `<name>/shard-KKK-of-NNN/` of part files. Each write is one whole file,
written under a temporary name and renamed, so a killed run leaves only complete files; a writer
given a `guard` (the shard lease's `confirm`, store/lease.py) calls it just before the rename, so a
part whose writer lost its lease never becomes visible; a write that fails (full disk, read-only folder) removes its temporary file and stops with a message, and a
part file damaged by hand is named when the table is read."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from personalens.errors import PersonalensError


def shard_dir(out_dir: Path, table: str, index: int, count: int) -> Path:
    return Path(out_dir) / table / f"shard-{index:03d}-of-{count:03d}"


class PartWriter:
    """Appends rows to a shard folder, one part file per `write` call; `guard` raises where the part
    may no longer be written (it is then removed unseen)."""

    def __init__(self, folder: Path, schema: pa.Schema, guard: Callable[[], None] | None = None):
        self.folder = Path(folder)
        self.schema = schema
        self.guard = guard
        self._next: int | None = None  # the next part's number: the folder's parts counted once, then ours
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise PersonalensError(f"cannot create the output folder {self.folder}: {err.strerror or err}") from None

    def write(self, rows: Sequence[dict]) -> Path | None:
        if not rows:
            return None
        table = pa.Table.from_pylist(list(rows), schema=self.schema)
        # a unique name, so concurrent writers (a re-submitted job next to a stale one) never clash
        if self._next is None:
            self._next = _next_index(self.folder)
        name = f"part-{self._next:05d}-{uuid.uuid4().hex[:8]}.parquet"
        tmp = self.folder / f".{name}.tmp"
        try:
            pq.write_table(table, tmp)
            if self.guard is not None:
                self.guard()
            os.replace(tmp, self.folder / name)
        except PersonalensError:
            tmp.unlink(missing_ok=True)
            raise
        except OSError as err:
            tmp.unlink(missing_ok=True)
            raise PersonalensError(
                f"cannot write {self.folder / name}: {err.strerror or err}; nothing partial was left, the parts "
                "written before are kept: free space or fix the folder's permissions, then run again to resume"
            ) from None
        self._next += 1
        return self.folder / name


def _next_index(folder: Path) -> int:
    return sum(1 for p in folder.glob("part-*.parquet"))


def read_table(folder: Path, columns: Sequence[str] | None = None, optional: Sequence[str] = ()) -> pa.Table | None:
    """All part files under `folder` (recursively); None when there are none. Parts written before a
    column was added read as null in it (a run resumed across a version of personalens); `optional`
    columns are read too where any part has them (a run written before them has none)."""
    folder = Path(folder)
    files = sorted(folder.rglob("part-*.parquet")) if folder.exists() else []
    if not files:
        return None
    try:
        schema = pa.unify_schemas([pq.read_schema(f) for f in files], promote_options="permissive")
        if columns is not None:
            columns = [*columns, *(c for c in optional if c in schema.names)]
        return ds.dataset([str(f) for f in files], schema=schema, format="parquet").to_table(columns=columns)
    except (pa.ArrowException, OSError):
        for f in files:  # name the damaged part
            try:
                pq.ParquetFile(f).read(columns=columns)
            except (pa.ArrowException, OSError) as err:
                raise PersonalensError(
                    f"{f}: not a readable Parquet part ({err}); it was cut off or damaged: delete it and run "
                    "again to regenerate its rows"
                ) from None
        raise


def existing_values(folder: Path, columns: Sequence[str]) -> set[tuple]:
    """The distinct tuples of `columns` already written under `folder`."""
    table = read_table(folder, columns)
    if table is None:
        return set()
    return set(zip(*(table.column(c).to_pylist() for c in columns)))
