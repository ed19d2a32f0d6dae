"""Faults while writing and reading part files (personalens/store/parts.py): a full disk leaves no
partial part and the next run resumes; a part truncated by hand is named, not a pyarrow traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from personalens.errors import PersonalensError
from personalens.store import PartWriter, read_table

SCHEMA = pa.schema([("key", pa.string()), ("text", pa.string())])
REPO = Path(__file__).resolve().parents[1]

# a real write fault: the process's file-size limit makes the kernel refuse the write (EFBIG), as a
# full disk refuses it (ENOSPC); SIGXFSZ is ignored so the write fails instead of killing the process
FULL_DISK = """
import resource, signal, sys
from pathlib import Path
from personalens.errors import PersonalensError
from personalens.store import PartWriter
import pyarrow as pa
writer = PartWriter(Path(sys.argv[1]), pa.schema([("key", pa.string()), ("text", pa.string())]))
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
try:
    writer.write([{"key": str(i), "text": "x" * 1000 + str(i)} for i in range(200)])
except PersonalensError as err:
    print(err)
    sys.exit(2)
"""


def test_a_full_disk_while_writing_a_part_leaves_nothing_partial_and_the_next_run_resumes(tmp_path):
    folder = tmp_path / "shard"
    PartWriter(folder, SCHEMA).write([{"key": "done", "text": "kept"}])
    result = subprocess.run(
        [sys.executable, "-c", FULL_DISK, str(folder)], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert "cannot write" in result.stdout and "run again to resume" in result.stdout
    assert "Traceback" not in result.stderr
    assert sorted(p.name.startswith("part-") for p in folder.iterdir()) == [True]  # no temporary file left
    PartWriter(folder, SCHEMA).write([{"key": "next", "text": "resumed"}])
    assert sorted(read_table(folder).column("key").to_pylist()) == ["done", "next"]


def test_a_truncated_part_is_named_on_read(tmp_path):
    writer = PartWriter(tmp_path, SCHEMA)
    writer.write([{"key": "a", "text": "x"}])
    damaged = writer.write([{"key": "b", "text": "y" * 500}])
    damaged.write_bytes(damaged.read_bytes()[:100])
    with pytest.raises(PersonalensError, match=rf"{damaged.name}: not a readable Parquet part .*delete it"):
        read_table(tmp_path)


def test_parts_are_numbered_in_the_order_written_and_a_new_writer_goes_on_from_the_folder(tmp_path):
    schema = pa.schema([("n", pa.int64())])
    first = PartWriter(tmp_path, schema)
    for n in range(3):
        first.write([{"n": n}])
    PartWriter(tmp_path, schema).write([{"n": 3}])  # a resumed run's writer
    names = sorted(p.name for p in tmp_path.glob("part-*.parquet"))
    assert [name.split("-")[1] for name in names] == ["00000", "00001", "00002", "00003"]
    assert [pq.read_table(tmp_path / name)["n"][0].as_py() for name in names] == [0, 1, 2, 3]
