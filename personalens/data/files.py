"""The one safe reader of data files (JSON, JSON Lines, text, Parquet inputs).

Every failure becomes a DataError whose Problem names the file (as the caller labels it), the
position where known, and what is wrong; quirks that can be read through are returned as warnings:
- only regular files: a FIFO, socket, device or directory is refused before it is opened (a FIFO
  would block the reader forever), and the file is opened non-blocking in case it was swapped since;
- a size limit (MAX_BYTES), so a huge file is refused at once instead of stalling the run;
- UTF-8 only (the first bad byte is named); a leading byte-order mark is dropped with a warning;
- JSON: duplicate keys are warnings naming the key and that the last value is kept (errors under
  --strict, as every warning); too deep nesting, numbers past Python's digit limit, and lone
  surrogate escapes ("\\ud800", which cannot be written back out as UTF-8) are errors;
- JSON Lines are split on "\\n" only (U+2028 inside a string is text, not a line break), a
  trailing "\\r" is dropped (CRLF files) and blank lines are skipped."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from personalens.data.errors import DataError, Problem

MAX_BYTES = 256 * 1024 * 1024  # far above any release file (the largest is a few MB)

BOM = "\ufeff"
BOM_SKIPPED = "a UTF-8 byte-order mark at the start of the file is skipped"
DUPLICATE_KEY = "a key repeated in one JSON object: the last value is kept, as Python's json does"

_KINDS = {
    stat.S_IFDIR: "a directory",
    stat.S_IFIFO: "a named pipe (FIFO)",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
}


def fault(file: str, location: str, message: str) -> DataError:
    problem = Problem(file, location, message)
    return DataError(str(problem), (problem,))


def check_regular(path: Path, file: str, limit: int = MAX_BYTES) -> os.stat_result:
    """The stat of `path` when it is a regular file within `limit` bytes; a DataError otherwise."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise fault(file, "", "missing") from None
    except OSError as e:
        raise fault(file, "", _os_reason(e)) from None
    if not stat.S_ISREG(info.st_mode):
        kind = _KINDS.get(stat.S_IFMT(info.st_mode), "not a regular file")
        raise fault(file, "", f"is {kind}, not a regular file")
    if info.st_size > limit:
        raise fault(file, "", f"{info.st_size:,} bytes, over the limit of {limit:,} bytes for one data file")
    return info


def read_bytes(path: Path, file: str, limit: int = MAX_BYTES) -> bytes:
    check_regular(path, file, limit)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as e:
        raise fault(file, "", _os_reason(e)) from None
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):  # replaced between stat and open
            raise fault(file, "", "is not a regular file")
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise fault(file, "", f"over the limit of {limit:,} bytes for one data file")
    return data


def read_text(path: Path, file: str, limit: int = MAX_BYTES) -> tuple[str, list[Problem]]:
    """The file's UTF-8 text (without a byte-order mark) and its warnings."""
    data = read_bytes(path, file, limit)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise fault(file, f"byte {e.start}", f"not UTF-8 text (byte 0x{data[e.start]:02x})") from None
    if text.startswith(BOM):
        return text[1:], [Problem(file, "", "byte-order mark skipped", BOM_SKIPPED)]
    return text, []


def loads(text: str, file: str, line: int | None = None) -> tuple[Any, list[Problem]]:
    """One JSON document (a whole file, or one line of a JSON Lines file) and its warnings."""
    where = f"line {line}" if line is not None else ""
    duplicates: list[str] = []

    def pairs(items: list[tuple[str, Any]]) -> dict:
        obj: dict = {}
        for key, value in items:
            if key in obj:
                duplicates.append(key)
            obj[key] = value
        return obj

    try:
        value = json.loads(text, object_pairs_hook=pairs)
    except json.JSONDecodeError as e:
        row = line if line is not None else e.lineno
        raise fault(file, f"line {row} column {e.colno}", f"malformed JSON: {e.msg}") from None
    except RecursionError:
        raise fault(file, where, "JSON nested too deeply to read") from None
    except ValueError as e:  # Python's limit on the digits of an integer
        raise fault(file, where, f"a JSON number too long to read ({e})") from None
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as e:
        raise fault(file, where, f"a lone surrogate escape (\\u{ord(e.object[e.start]):04x}) is not text") from None
    except RecursionError:
        raise fault(file, where, "JSON nested too deeply to read") from None
    warnings = [
        Problem(
            file, where, f"duplicate key {json.dumps(key, ensure_ascii=False)}: the last value is kept", DUPLICATE_KEY
        )
        for key in duplicates
    ]
    return value, warnings


def read_json(path: Path, file: str, limit: int = MAX_BYTES) -> tuple[Any, list[Problem]]:
    text, warnings = read_text(path, file, limit)
    value, more = loads(text, file)
    return value, warnings + more


def json_lines(text: str) -> Iterator[tuple[int, str]]:
    """(line number, line) of each non-blank line, split on "\\n" only."""
    for number, line in enumerate(text.split("\n"), start=1):
        line = line.removesuffix("\r")
        if line.strip():
            yield number, line


def printable(name: str | bytes) -> str:
    """A file name as it can always be printed: bytes that are not UTF-8 as escapes (`Caf\\xe9`),
    not a crash."""
    text = os.fsdecode(name)
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        pass
    try:
        return os.fsencode(text).decode("utf-8", "backslashreplace")  # the bytes the OS gave
    except UnicodeEncodeError:  # a lone surrogate that stands for no byte
        return ascii(text)[1:-1]


def _os_reason(e: OSError) -> str:
    if e.errno is not None and e.errno == getattr(os, "ELOOP", None):
        return "a symbolic link loop"
    return f"cannot read: {e.strerror or e}"
