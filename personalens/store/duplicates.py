"""Rows stored more than once, and which copy every reader keeps.

The shard lease (store/lease.py) lets one invocation write a shard at a time, and a part lands only
while its writer still holds the lease. Two copies of a dialogue or judgment can still reach disk:
parts written by a release without that check beside its resubmitted job, a part file copied by hand,
shard folders of two shard counts that both hold a scenario. Neither `report`/`compare`
(store/results.py) nor `merge` refuses them: each keeps the copy of the earliest invocation (the
smallest `session_started`; copies written before that column existed last), then the one in the
part file whose path sorts first, so every reader counts the same copy, and names the rest in one
line (and `merge` in merge.json)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")
_EXAMPLES = 3  # keys named in a warning; the counts are always complete


@dataclass(frozen=True)
class Copies:
    """One key stored more than once: where each copy is, the kept one first."""

    key: tuple
    places: tuple[str, ...]

    def describe(self) -> str:
        counts = Counter(self.places)  # in the order of the places: the kept copy's first
        where = " and ".join(place if n == 1 else f"{place} ({n} copies)" for place, n in counts.items())
        return f"{' '.join(map(str, self.key))} in {where}"


def keep_first(
    rows: Sequence[T], key: Callable[[T], Hashable], where: Callable[[T], tuple[float | None, str]]
) -> tuple[list[T], list[Copies]]:
    """`rows` with one row per `key` (in their order) and the keys stored more than once. `where`:
    a row's invocation (session_started; None where unrecorded) and its place (its part file)."""
    by_key: dict[Hashable, list[int]] = {}
    for i, row in enumerate(rows):
        by_key.setdefault(key(row), []).append(i)
    kept, copies = set(), []
    for k, indices in by_key.items():
        if len(indices) > 1:
            indices = sorted(indices, key=lambda i: _order(where(rows[i]), i))
            copies.append(Copies(tuple(k) if isinstance(k, tuple) else (k,), tuple(where(rows[i])[1] for i in indices)))
        kept.add(indices[0])
    return [row for i, row in enumerate(rows) if i in kept], copies


def _order(where: tuple[float | None, str], index: int) -> tuple:
    session, place = where
    return (session is None, session or 0.0, place, index)


def warning(dialogues: Sequence[Copies], judgments: Sequence[Copies]) -> str:
    """One line that says what was found, what is kept and what a lab can do about it."""
    found = " and ".join(
        f"{len(items)} {what}(s)" for what, items in (("dialogue", dialogues), ("judgment", judgments)) if items
    )
    examples = [*dialogues, *judgments][:_EXAMPLES]
    more = " ..." if len(dialogues) + len(judgments) > _EXAMPLES else ""
    return (
        f"{found} are stored more than once ({'; '.join(c.describe() for c in examples)}{more}): two "
        "invocations of one shard wrote them (a job that ran on after its resubmitted copy took the shard over, "
        "a run of an older release), or parts were copied (by hand, a run directory given beside its copy). "
        "Each is counted once, the copy of the earliest invocation kept, the same in every report, compare and "
        "merge; nothing needs re-running, but check that no two jobs run the same shard (squeue; a requeue "
        "while the job still ran)"
    )
