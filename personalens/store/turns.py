"""The `turns/` table of a shard: every turn `generate` simulated, appended as each step ends, read
back to resume the dialogues a stopped run left unfinished (simulate/generate.py), to count a
shard's partly simulated dialogues (`merge`, `plan`) and to tell which turns came from which
invocation (the report's provenance note).

A turn is stored once per invocation that simulated it; where two invocations stored the same turn
of a dialogue (a stale job beside its resubmitted copy), the earlier one's rows are the dialogue's."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Sequence
from pathlib import Path

import pyarrow as pa

from personalens.store.parts import read_table
from personalens.store.schema import KEY_COLUMNS

DialogueKey = tuple[str, str, str, int]  # user_id, task_id, setting, trial

_ORDER = ["index", "session_started"]


def stored_turns(
    folder: Path, skip: Collection[DialogueKey] = (), columns: Sequence[str] | None = None
) -> dict[DialogueKey, list[dict]]:
    """Each dialogue's stored turns under `folder` (a `turns/shard-KKK-of-NNN`), in order from its
    opening, but for the dialogues in `skip` (written whole already). `columns`: the fields read
    besides the key, the index and the session (None: all). A dialogue's turns stop at the first
    index missing (none is, unless a part file was deleted by hand)."""
    wanted = None if columns is None else list(dict.fromkeys([*KEY_COLUMNS, *_ORDER, *columns]))
    table = read_table(folder, wanted)
    if table is None:
        return {}
    if skip:  # kept out while still in Arrow: the finished dialogues' text never becomes Python objects
        keys = zip(*(table.column(c).to_pylist() for c in KEY_COLUMNS))
        table = table.filter(pa.array([key not in skip for key in keys], pa.bool_()))
    rows: dict[DialogueKey, dict[int, dict]] = defaultdict(dict)
    for row in table.sort_by([(c, "ascending") for c in _ORDER]).to_pylist():
        key = tuple(row[c] for c in KEY_COLUMNS)
        rows[key].setdefault(row["index"], row)  # the earliest invocation's copy of the turn
    turns = {}
    for key, by_index in rows.items():
        chain = []
        while len(chain) in by_index:
            chain.append(by_index[len(chain)])
        if chain:
            turns[key] = chain
    return turns


def partial_dialogues(folder: Path, done: Collection[DialogueKey]) -> dict[DialogueKey, int]:
    """The dialogues with stored turns but no dialogue row (a stopped run's unfinished ones), and how
    many turns each has stored: what running the shard again resumes."""
    return {key: len(chain) for key, chain in stored_turns(folder, done, columns=()).items()}


def continued_dialogues(folder: Path) -> int:
    """How many dialogues under `folder` hold turns from more than one `generate` invocation."""
    return sum(len({t["session_started"] for t in chain}) > 1 for chain in stored_turns(folder, columns=()).values())
