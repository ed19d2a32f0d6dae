"""Which runs were written in more than one go: a shard resumed after a kill or a failure (its rows
come from several invocations, told apart by their `session_started`), or a run whose shard folders
were written under different shard counts. Without batch-invariant engines either one changes
dialogues and scores (docs/reproducibility.md), so the report names such runs, and the dialogues a
resumed `generate` continued from turns a stopped one stored (their turns come from more than one
invocation; the `turns/` table holds each turn's `session_started`, store/turns.py)."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Protocol

_SHARD = re.compile(r"shard-(\d+)-of-(\d+)")


class Written(Protocol):
    run: str  # the run directory
    shard: str  # its shard folder, "shard-KKK-of-NNN"
    session: float | None  # the writing invocation's start; None in rows written before it was kept


def mixed_runs(
    dialogues: Iterable[Written],
    judgments: Iterable[Written],
    continued: Mapping[str, Mapping[str, int]] | None = None,
) -> tuple[str, ...]:
    """One line per run and table that mixes invocations within a shard, or shard counts, and one
    per run with dialogues continued mid-dialogue (`continued`: run -> shard folder -> dialogues
    whose turns come from more than one invocation); none for a run written in one go per shard."""
    lines = []
    for run, shards in (continued or {}).items():
        where = ", ".join(f"{s} {n}" for s, n in sorted(shards.items()) if n)
        if where:
            lines.append(
                f"`{run}`: {sum(shards.values())} dialogue(s) continued mid-dialogue from the turns a stopped "
                f"`generate` stored, their turns from more than one invocation: {where}"
            )
    for table, step, rows in (("dialogues", "generate", dialogues), ("judgments", "judge", judgments)):
        sessions: dict[str, dict[str, set]] = defaultdict(lambda: defaultdict(set))
        for r in rows:
            sessions[r.run][r.shard].add(r.session)
        for run, shards in sessions.items():
            counts = sorted({int(m.group(2)) for s in shards if (m := _SHARD.fullmatch(s))})
            resumed = sorted((s, len(v)) for s, v in shards.items() if len(v) > 1)
            if resumed:
                where = ", ".join(f"{s} by {n}" for s, n in resumed)
                lines.append(f"`{run}`: {table} written by more than one `{step}` invocation (resumed): {where}")
            if len(counts) > 1:
                lines.append(
                    f"`{run}`: {table} written under {len(counts)} shard counts ({', '.join(map(str, counts))})"
                )
    return tuple(lines)
