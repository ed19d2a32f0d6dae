"""`merge`: check that the shard folders of a run together hold every dialogue of the selection
exactly once, with all its whole-dialogue judgments, and only then write the merged tables. Every
merge writes what it found to `<run>/merge.json`, complete or not, which the report names.

Problems are grouped by shard so that a user knows which array task to re-run: missing items by
the shard that should hold them, duplicated and unexpected ones by the folder they were found in;
an incomplete shard also says how its steps last ended (why.py). A dialogue or judgment stored more
than once is no problem: the merged tables keep the copy every reader keeps (store/duplicates.py),
and merge.json and the output name the copies.
A missing dialogue with turns stored in its shard's `turns/` table was partly simulated by a run
that stopped (store/turns.py): re-running the shard resumes it from those turns."""

from __future__ import annotations

import os
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from personalens.config.saved import read_judges
from personalens.merge.why import shard_story
from personalens.prompts.render import SPEAKERS
from personalens.store import JUDGMENT_KEY, KEY_COLUMNS, partial_dialogues, read_table, shard_dir
from personalens.store.duplicates import Copies, keep_first, warning
from personalens.store.merge_status import write_merge_status

DialogueKey = tuple[str, str, str, int]  # user_id, task_id, setting, trial
JudgmentKey = tuple  # DialogueKey + dimension, speaker, turn (+ the judge's key under a judge panel)
Shard = tuple[int, int]  # (index, count)

_SHARD_FOLDER = re.compile(r"shard-(\d+)-of-(\d+)")
_EXAMPLES = 4  # items named per problem; the counts are always complete


@dataclass(frozen=True)
class ShardProblems:
    """What is wrong in one shard; only built for shards with at least one problem."""

    index: int
    count: int
    no_dialogue_files: bool = False  # its dialogues folder is absent or empty
    missing_dialogues: tuple[DialogueKey, ...] = ()
    partial_dialogues: int = 0  # of the missing dialogues, those with turns stored (a stopped run's)
    stored_turns: int = 0  # the turns stored for them
    unexpected_dialogues: tuple[DialogueKey, ...] = ()
    missing_judgments: tuple[JudgmentKey, ...] = ()
    unexpected_judgments: tuple[JudgmentKey, ...] = ()
    why: str = ""  # for an incomplete shard, how its steps' last starts ended (why.py)

    @property
    def incomplete(self) -> bool:
        """Something is missing, which re-running the shard fills in (runs resume)."""
        return bool(self.missing_dialogues or self.missing_judgments)

    def format(self) -> str:
        partly = (
            f", {self.partial_dialogues} of them partly simulated ({self.stored_turns} turns stored, which "
            "re-running the shard resumes from)"
            if self.partial_dialogues
            else ""
        )
        parts = [
            f"{len(items)} {what} ({_examples(items)}){partly if what == 'dialogues missing' else ''}"
            for what, items in (
                ("dialogues missing", self.missing_dialogues),
                ("dialogues not in the selection", self.unexpected_dialogues),
                ("judgments missing", self.missing_judgments),
                ("judgments of dialogues not in the selection", self.unexpected_judgments),
            )
            if items
        ]
        if self.no_dialogue_files:
            parts.insert(0, f"no dialogue files in {shard_dir(Path(), 'dialogues', self.index, self.count)}")
        why = f"; why: {self.why}" if self.why else ""
        return f"shard {self.index} of {self.count}: " + ", ".join(parts) + why


@dataclass(frozen=True)
class MergeResult:
    out_dir: Path
    shard_count: int
    expected_dialogues: int
    dialogues: int  # dialogues found across all shard folders, each counted once
    judgments: int  # judgments found across all shard folders, each counted once
    problems: tuple[ShardProblems, ...]  # ordered by (count, index)
    written: tuple[Path, ...] = field(default=())
    # rows stored more than once, of which one copy is kept (store/duplicates.py)
    duplicated_dialogues: tuple[Copies, ...] = ()
    duplicated_judgments: tuple[Copies, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.problems

    def status(self) -> dict:
        """What merge.json keeps for the report: whether the run was complete, the rows it found
        (the report tells by them whether the shards changed since) and one line per problem."""
        return {
            "complete": self.ok,
            "dialogues": self.dialogues,
            "judgments": self.judgments,
            "expected_dialogues": self.expected_dialogues,
            "shard_count": self.shard_count,
            "problems": [p.format() for p in self.problems],
            "rerun": self.rerun,
            "duplicates": {
                "dialogues": [c.describe() for c in self.duplicated_dialogues],
                "judgments": [c.describe() for c in self.duplicated_judgments],
                "note": self.duplicates_line,
            },
        }

    @property
    def duplicates_line(self) -> str:
        """The warning about rows stored more than once ('' if none)."""
        if not (self.duplicated_dialogues or self.duplicated_judgments):
            return ""
        return warning(self.duplicated_dialogues, self.duplicated_judgments)

    @property
    def rerun(self) -> str:
        """The shards of this shard count to run again, as sbatch --array takes them ('' if none)."""
        return ",".join(str(p.index) for p in self.problems if p.incomplete and p.count == self.shard_count)

    def format(self) -> str:
        found = (
            f"{self.dialogues} dialogues and {self.judgments} judgments found for "
            f"{self.expected_dialogues} expected dialogues in {self.out_dir}"
        )
        duplicates = [f"  warning: {self.duplicates_line}"] if self.duplicates_line else []
        if self.ok:
            return "\n".join([f"merge: complete: {found}", *duplicates, *(f"  wrote {path}" for path in self.written)])
        rerun = self.rerun
        hint = (
            [
                f"  re-run shard(s) {rerun} of {self.shard_count} (shard.index=K shard.count="
                f"{self.shard_count}; on SLURM --array={rerun}), then merge again"
            ]
            if rerun
            else []
        )
        return "\n".join(
            [
                f"merge: INCOMPLETE, nothing merged: {found}",
                *(f"  {p.format()}" for p in self.problems),
                *duplicates,
                *hint,
            ]
        )


def merge(
    out_dir: Path, expected: Mapping[DialogueKey, int], dimensions: Sequence[str], shard_count: int
) -> MergeResult:
    """Check the shards of `out_dir` against `expected` (dialogue key -> shard index that should
    hold it); when complete, write `<out_dir>/merged/{dialogues,judgments}.parquet` atomically."""
    out_dir = Path(out_dir)
    dialogues = _read_shards(out_dir, "dialogues")
    judgments = _read_shards(out_dir, "judgments")
    expected_shard = {key: (index, shard_count) for key, index in expected.items()}

    # a judge panel's judges each owe every judgment (docs/validation.md#judge-panels)
    judges = [saved.fingerprint or "" for saved in read_judges(out_dir).values()] or [""]
    dialogues, found, dialogue_copies = _once("dialogues", dialogues, lambda t: _keys(t, KEY_COLUMNS))
    judgments, judged, judgment_copies = _once("judgments", judgments, lambda t: _judged(t, judges))
    wanted_judgments = {
        (*key, dim, speaker, -1, *([judge] if len(judges) > 1 else [])): shard
        for key, shard in expected_shard.items()
        for dim in dimensions
        for speaker in SPEAKERS.get(dim, ("",))
        for judge in judges
    }

    problems: dict[Shard, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for name, by_shard, wanted, in_selection in (
        ("dialogues", found, expected_shard, lambda key: key in expected_shard),
        ("judgments", judged, wanted_judgments, lambda key: key[:4] in expected_shard),
    ):
        present = {key for keys in by_shard.values() for key in keys}
        for key, shard in wanted.items():
            if key not in present:
                problems[shard][f"missing_{name}"].append(key)
        for shard, keys in by_shard.items():
            problems[shard][f"unexpected_{name}"].extend(k for k in keys if not in_selection(k))

    report = tuple(
        ShardProblems(
            index=shard[0],
            count=shard[1],
            no_dialogue_files=shard not in dialogues,
            **{kind: tuple(items) for kind, items in kinds.items()},
            **_partly_simulated(out_dir, shard, kinds.get("missing_dialogues", ())),
            why=shard_story(out_dir, *shard)
            if kinds.get("missing_dialogues") or kinds.get("missing_judgments")
            else "",
        )
        for shard, kinds in sorted(problems.items(), key=lambda item: item[0][::-1])
        if any(kinds.values())
    )
    result = MergeResult(
        out_dir=out_dir,
        shard_count=shard_count,
        expected_dialogues=len(expected),
        dialogues=sum(map(len, found.values())),
        judgments=sum(map(len, judged.values())),
        problems=report,
        duplicated_dialogues=tuple(dialogue_copies),
        duplicated_judgments=tuple(judgment_copies),
    )
    if out_dir.is_dir():
        write_merge_status(out_dir, result.status())
    if not result.ok:
        return result
    tables = {"dialogues": _concat(dialogues.values(), ["user_index", *KEY_COLUMNS])}
    if judgments:  # none when no judge dimension is asked for (a run merged before judging)
        tables["judgments"] = _concat(judgments.values(), ["user_index", *JUDGMENT_KEY])
    written = _write_atomically(out_dir / "merged", tables)
    return replace(result, written=written)


def _read_shards(out_dir: Path, table: str) -> dict[Shard, pa.Table]:
    """Every `<table>/shard-KKK-of-NNN` folder that holds rows, whatever its shard count."""
    tables = {}
    for folder in sorted((out_dir / table).glob("shard-*-of-*")):
        match = _SHARD_FOLDER.fullmatch(folder.name)
        data = read_table(folder) if match and folder.is_dir() else None
        if data is not None and data.num_rows:
            tables[(int(match[1]), int(match[2]))] = data
    return tables


def _once(
    table: str, tables: dict[Shard, pa.Table], keys: Callable[[pa.Table], list[tuple]]
) -> tuple[dict[Shard, pa.Table], dict[Shard, list[tuple]], list[Copies]]:
    """Every shard's rows and their keys with one copy of each key across shards (the one every
    reader keeps, store/duplicates.py), and the keys stored more than once."""
    rows = [
        (shard, i, key, session)
        for shard, data in tables.items()
        for i, (key, session) in enumerate(zip(keys(data), _sessions(data)))
    ]
    kept, copies = keep_first(rows, key=lambda r: r[2], where=lambda r: (r[3], str(shard_dir(Path(), table, *r[0]))))
    by_shard: dict[Shard, list[tuple]] = defaultdict(list)
    for row in kept:
        by_shard[row[0]].append(row)
    once = {shard: tables[shard].take(pa.array([r[1] for r in mine], pa.int64())) for shard, mine in by_shard.items()}
    return once, {shard: [r[2] for r in mine] for shard, mine in by_shard.items()}, copies


def _sessions(table: pa.Table) -> list[float | None]:
    if "session_started" not in table.column_names:
        return [None] * table.num_rows
    return table.column("session_started").to_pylist()


def _partly_simulated(out_dir: Path, shard: Shard, missing: Sequence[DialogueKey]) -> dict[str, int]:
    """How many of a shard's missing dialogues have turns stored, and how many turns."""
    if not missing:
        return {}
    stored = partial_dialogues(shard_dir(out_dir, "turns", *shard), ())
    turns = [stored[key] for key in missing if key in stored]
    return {"partial_dialogues": len(turns), "stored_turns": sum(turns)}


def _keys(table: pa.Table, columns: Sequence[str]) -> list[tuple]:
    return list(zip(*(table.column(c).to_pylist() for c in columns)))


def _judged(table: pa.Table, judges: Sequence[str]) -> list[JudgmentKey]:
    """A shard's judgment keys; with a judge panel (several `judges`, model@judge's first) each with
    its judge's key last, rows written before judge keys being model@judge's."""
    keys = _keys(table, JUDGMENT_KEY)
    if len(judges) == 1:
        return keys
    rows = table.column("judge_key").to_pylist() if "judge_key" in table.column_names else [None] * table.num_rows
    return [(*key, judge or judges[0]) for key, judge in zip(keys, rows)]


def _concat(tables: Iterable[pa.Table], order: Sequence[str]) -> pa.Table:
    merged = pa.concat_tables(list(tables), promote_options="default")
    return merged.sort_by([(column, "ascending") for column in order])


def _write_atomically(folder: Path, tables: Mapping[str, pa.Table]) -> tuple[Path, ...]:
    """Write every table to a temporary file first, then rename them all, so readers never see
    a half-written file and a failed write leaves the previous merge in place."""
    folder.mkdir(parents=True, exist_ok=True)
    staged = []
    try:
        for name, table in tables.items():
            tmp = folder / f".{name}.parquet.{os.getpid()}.tmp"
            staged.append(tmp)
            pq.write_table(table, tmp)
    except BaseException:
        for tmp in staged:
            tmp.unlink(missing_ok=True)
        raise
    targets = tuple(folder / f"{name}.parquet" for name in tables)
    for tmp, target in zip(staged, targets):
        os.replace(tmp, target)
    return targets


def _examples(keys: Sequence[tuple]) -> str:
    """'user3: SD-Alarm-task-1, SD-Movies-task-2; user4: MD-task-1 ...' for the first few keys."""
    by_user: dict[str, list[str]] = defaultdict(list)
    for key in keys[:_EXAMPLES]:
        item = key[1] if len(key) == 4 else " ".join([key[1], key[4], *([key[5]] if key[5] else [])])
        if item not in by_user[key[0]]:
            by_user[key[0]].append(item)
    text = "; ".join(f"{user}: {', '.join(items)}" for user, items in by_user.items())
    return text + (" ..." if len(keys) > _EXAMPLES else "")
