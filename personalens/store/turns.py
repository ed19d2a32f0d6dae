"""The `turns/` table of a shard: every turn `generate` simulated, appended as each step ends, read
back to resume the dialogues a stopped run left unfinished (simulate/generate.py), to count a
shard's partly simulated dialogues (`merge`, `plan`) and to tell which turns came from which
invocation (the report's provenance note).

A turn is stored once per invocation that simulated it, with the invocation whose turn it answers
(`follows_session`). Where two invocations stored turns of one dialogue (a stale job beside its
resubmitted copy, whose lease store/lease.py took over), the dialogue is read back as one chain: the
earliest invocation's opening, then at each turn the earliest invocation's copy that answers the turn
before it in the chain. So a chain holds one invocation's turns, then those of an invocation that
resumed from exactly that prefix, and so on; it never stitches a turn to one it did not answer.
Turns stored before `follows_session` existed (null) answer whichever turn is before them."""

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
    besides the key, the index and the sessions (None: all). A dialogue's chain (the module's
    docstring) stops where no stored turn answers its last one."""
    wanted = None if columns is None else list(dict.fromkeys([*KEY_COLUMNS, *_ORDER, *columns]))
    table = read_table(folder, wanted, optional=["follows_session"])
    if table is None:
        return {}
    if skip:  # kept out while still in Arrow: the finished dialogues' text never becomes Python objects
        keys = zip(*(table.column(c).to_pylist() for c in KEY_COLUMNS))
        table = table.filter(pa.array([key not in skip for key in keys], pa.bool_()))
    rows: dict[DialogueKey, dict[int, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for row in table.sort_by([(c, "ascending") for c in _ORDER]).to_pylist():
        rows[tuple(row[c] for c in KEY_COLUMNS)][row["index"]].append(row)  # earliest invocation first
    turns = {}
    for key, by_index in rows.items():
        if chain := _chain(by_index):
            turns[key] = chain
    return turns


def _chain(by_index: dict[int, list[dict]]) -> list[dict]:
    """One dialogue's chain from its stored copies of each turn, each index's earliest first."""
    chain: list[dict] = []
    while copies := by_index.get(len(chain)):
        if chain:
            before = chain[-1]["session_started"]
            copies = [r for r in copies if r.get("follows_session") in (before, None)]
            if not copies:
                break
        chain.append(copies[0])
    return chain


def partial_dialogues(folder: Path, done: Collection[DialogueKey]) -> dict[DialogueKey, int]:
    """The dialogues with stored turns but no dialogue row (a stopped run's unfinished ones), and how
    many turns each has stored: what running the shard again resumes."""
    return {key: len(chain) for key, chain in stored_turns(folder, done, columns=()).items()}


def continued_dialogues(folder: Path) -> int:
    """How many dialogues under `folder` hold turns from more than one `generate` invocation."""
    return sum(len({t["session_started"] for t in chain}) > 1 for chain in stored_turns(folder, columns=()).values())
