"""Streaming reader of WildChat as released: Parquet shards (`data/train-*.parquet`), one row per
conversation. Shards are read batch by batch, never whole; a record that cannot be used (missing
field, wrong type, no messages) is counted under its reason and skipped, never fatal and never
silently lost."""

from __future__ import annotations

import glob
import sys
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from personalens.data import files
from personalens.data.errors import DataError
from personalens.errors import PersonalensError

# only the columns the pipeline uses are read (the moderation columns are wide)
COLUMNS = [
    "conversation_hash",
    "timestamp",
    "conversation",
    "turn",
    "language",
    "openai_moderation",
    "toxic",
    "hashed_ip",
    "header",
]


@dataclass(frozen=True)
class UserKey:
    """WildChat has no user ids: a user is one (IP hash, user agent, accept-language)."""

    hashed_ip: str
    user_agent: str
    accept_language: str


@dataclass(frozen=True)
class Turn:
    turn_identifier: int
    role: str  # "user" | "assistant"
    content: str


@dataclass(frozen=True)
class Conversation:
    conversation_hash: str
    user: UserKey
    timestamp: str  # ISO 8601
    language: str
    turns: tuple[Turn, ...]
    toxic: bool
    flagged_categories: tuple[str, ...]  # moderation categories marked on any message
    flagged: bool  # any message flagged by the moderation API

    @property
    def user_turns(self) -> tuple[Turn, ...]:
        return tuple(t for t in self.turns if t.role == "user")


@dataclass
class ReadStats:
    files: int = 0
    rows: int = 0
    conversations: int = 0
    bad: Counter = field(default_factory=Counter)  # reason -> records
    examples: dict = field(default_factory=dict)  # reason -> "file row N" of the first such record

    def note(self, reason: str, where: str) -> None:
        self.bad[reason] += 1
        self.examples.setdefault(reason, where)

    def format(self) -> str:
        lines = [
            f"wildchat: {self.files} files, {self.rows} records, {self.conversations} conversations read, "
            f"{sum(self.bad.values())} bad records skipped"
        ]
        lines += [f"  {n} x {reason} (first: {self.examples[reason]})" for reason, n in sorted(self.bad.items())]
        return "\n".join(lines)

    def as_dict(self) -> dict:
        return {
            "files": self.files,
            "rows": self.rows,
            "conversations": self.conversations,
            "bad": dict(self.bad),
            "examples": dict(self.examples),
        }


class BadRecord(ValueError):
    """A record that cannot be used; the message is the reason counted in ReadStats."""


def shard_paths(patterns: Sequence[str]) -> list[Path]:
    """The files matching `patterns` (glob; `**` allowed), sorted; an error when none match."""
    paths = sorted({Path(p) for pattern in patterns for p in glob.glob(str(pattern), recursive=True)})
    if not paths:
        raise PersonalensError(f"personalbench.input: no WildChat shards match {list(patterns)}")
    return paths


def read_conversations(paths: Sequence[Path], stats: ReadStats, batch_size: int = 1024) -> Iterator[Conversation]:
    for path in paths:
        stats.files += 1
        try:  # a FIFO would block the Parquet reader forever; a directory or device is no shard either
            files.check_regular(path, str(path), limit=sys.maxsize)
        except DataError as err:
            stats.note("unreadable file", str(err))
            continue
        try:
            reader = pq.ParquetFile(path)
            names = set(reader.schema_arrow.names)
            batches = reader.iter_batches(batch_size=batch_size, columns=[c for c in COLUMNS if c in names])
            row = 0
            for batch in batches:
                for record in _records(batch):
                    stats.rows += 1
                    try:
                        if isinstance(record, BadRecord):
                            raise record
                        conversation = parse_record(record)
                    except BadRecord as err:
                        stats.note(str(err), f"{path} row {row}")
                    else:
                        stats.conversations += 1
                        yield conversation
                    row += 1
        except (OSError, pa.ArrowException) as err:  # a truncated or non-Parquet file
            stats.note("unreadable file", f"{path}: {err}")


def _records(batch: pa.RecordBatch) -> list[dict | BadRecord]:
    """The batch's rows as dicts; a row that Arrow cannot turn into Python values (a timestamp out
    of Python's range, a string column holding bytes that are not UTF-8) becomes a BadRecord in
    its place, so one bad row costs that row only, counted and named."""
    try:
        return batch.to_pylist()
    except (OverflowError, ValueError):  # UnicodeDecodeError is a ValueError
        rows: list[dict | BadRecord] = []
        for i in range(batch.num_rows):
            try:
                rows.extend(batch.slice(i, 1).to_pylist())
            except OverflowError:
                rows.append(BadRecord("a value out of range (e.g. a timestamp)"))
            except UnicodeDecodeError:
                rows.append(BadRecord("a string field that is not UTF-8"))
            except ValueError as err:
                rows.append(BadRecord(f"an unreadable value ({err})"))
        return rows


def _categories(value: object) -> dict:
    """A moderation entry's categories: a struct (dict) or an Arrow map (a list of pairs)."""
    if value is None:
        return {}
    if isinstance(value, dict):
        return value
    if isinstance(value, list) and all(isinstance(p, tuple) and len(p) == 2 for p in value):
        return dict(value)
    raise BadRecord("wrong type: openai_moderation.categories")


def parse_record(record: dict) -> Conversation:
    header = _get(record, "header", dict)
    messages = _get(record, "conversation", list)
    if not messages:
        raise BadRecord("empty conversation")
    _get(record, "turn", int)
    turns = tuple(_turn(m) for m in messages)
    if not any(t.role == "user" for t in turns):
        raise BadRecord("no user message")
    moderation = record.get("openai_moderation") or []
    if not isinstance(moderation, list):
        raise BadRecord("wrong type: openai_moderation")
    categories = sorted(
        {name for m in moderation if isinstance(m, dict) for name, on in _categories(m.get("categories")).items() if on}
    )
    timestamp = record.get("timestamp")
    return Conversation(
        conversation_hash=_get(record, "conversation_hash", str),
        user=UserKey(
            _get(record, "hashed_ip", str),
            _get(header, "user-agent", str, "header."),
            _get(header, "accept-language", str, "header."),
        ),
        timestamp=timestamp.isoformat() if hasattr(timestamp, "isoformat") else str(timestamp or ""),
        language=_get(record, "language", str),
        turns=turns,
        toxic=bool(record.get("toxic")),
        flagged_categories=tuple(categories),
        flagged=any(isinstance(m, dict) and m.get("flagged") for m in moderation),
    )


def _turn(message: object) -> Turn:
    if not isinstance(message, dict):
        raise BadRecord("wrong type: conversation message")
    role = _get(message, "role", str, "conversation.")
    if role not in ("user", "assistant"):
        raise BadRecord("unknown role in conversation")
    return Turn(
        _get(message, "turn_identifier", int, "conversation."), role, _get(message, "content", str, "conversation.")
    )


def _get(record: dict, name: str, kind: type, prefix: str = ""):
    value = record.get(name)
    if value is None:
        raise BadRecord(f"missing field: {prefix}{name}")
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise BadRecord(f"wrong type: {prefix}{name}")
    return value
