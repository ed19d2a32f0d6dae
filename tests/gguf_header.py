"""The metadata of a GGUF file (version 3) read from its header alone, so that a file cut after its
header (a split package's first part) still gives its tokenizer and chat template."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import BinaryIO

# GGUF's value types: id -> struct format of a scalar (8: string, 9: array)
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


def _read(f: BinaryIO, fmt: str):
    return struct.unpack("<" + fmt, f.read(struct.calcsize(fmt)))[0]


def _value(f: BinaryIO, kind: int):
    if kind == 8:
        return f.read(_read(f, "Q")).decode("utf-8")
    if kind == 9:
        inner, count = _read(f, "I"), _read(f, "Q")
        return [_value(f, inner) for _ in range(count)]
    return _read(f, _SCALARS[kind])


def gguf_metadata(path: Path) -> dict:
    """Every metadata key of the file, with its value."""
    with path.open("rb") as f:
        if f.read(4) != b"GGUF" or _read(f, "I") != 3:
            raise ValueError(f"{path}: not a GGUF version 3 file")
        _read(f, "Q")  # tensor count: the tensors' descriptions follow the metadata
        return {f.read(_read(f, "Q")).decode("utf-8"): _value(f, _read(f, "I")) for _ in range(_read(f, "Q"))}
