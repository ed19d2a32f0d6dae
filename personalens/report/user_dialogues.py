"""Each stored dialogue of a run read with its text, checked by the rules of user_checks.py and
measured (the assistant's mean reply length), keeping only those results: what the flags tables and
the length table (flags.py, length.py) compute from."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from personalens.data.records import Turn
from personalens.errors import PersonalensError
from personalens.report.user_checks import RULES, check
from personalens.report.user_prompts import run_prompts
from personalens.store.replies import DialogueKey, dialogue_key, mean_reply_words
from personalens.store.results import Judgment, part_files

_COLUMNS = ("user_id", "task_id", "setting", "trial", "assistant_model", "user_model", "ended", "turns")
_OPTIONAL = ("opening_terminate",)


@dataclass(frozen=True)
class CheckedDialogue:
    key: DialogueKey
    user_model: str
    flags: frozenset[str]  # the rules it breaks (user_checks.RULES)
    leak_checked: bool  # whether its prompt could be rebuilt for the leak rule
    reply_words: float | None  # the assistant's mean reply length in words; None without a reply

    @property
    def assistant_model(self) -> str:
        return self.key[5]

    @property
    def setting(self) -> str:
        return self.key[3]

    @property
    def user_id(self) -> str:
        return self.key[1]


def judgment_key(j: Judgment) -> DialogueKey:
    return (j.run, j.scenario.user_id, j.scenario.task_id, j.setting, j.scenario.trial, j.assistant_model)


def checked_dialogues(run_dirs: Sequence[Path]) -> tuple[tuple[CheckedDialogue, ...], tuple[str, ...]]:
    """Every dialogue of `run_dirs` checked, and why the leak rule could not be checked where it
    could not (one line per run)."""
    out: list[CheckedDialogue] = []
    missing: list[str] = []
    for run_dir in map(Path, run_dirs):
        prompts = run_prompts(run_dir)
        if prompts.missing:
            missing.append(prompts.missing)
        for path in part_files(run_dir / "dialogues"):
            file = pq.ParquetFile(path)
            names = file.schema_arrow.names
            absent = [c for c in _COLUMNS if c not in names]
            if absent:
                raise PersonalensError(f"{path}: missing column(s) {', '.join(absent)} (see docs/outputs.md)")
            columns = [*_COLUMNS, *(c for c in _OPTIONAL if c in names)]
            for row in file.read(columns=columns).to_pylist():
                turns = [Turn(t["role"], t["text"] or "") for t in row["turns"] or ()]
                opening = row.get("opening_terminate")
                if opening is None:  # runs written before it was recorded: the opening keeps the word
                    opening = bool(turns) and "TERMINATE" in turns[0].text
                spans = prompts.spans.get((row["user_id"], row["task_id"]))
                out.append(
                    CheckedDialogue(
                        dialogue_key(run_dir, row),
                        row["user_model"] or "",
                        check(turns, ended=row["ended"], opening_terminate=bool(opening), prompt=spans),
                        spans is not None,
                        mean_reply_words(turns),
                    )
                )
    return tuple(out), tuple(missing)


FLAGS_FILE = "user_flags_dialogues.parquet"


def write_flags(checked: Sequence[CheckedDialogue], path: Path) -> Path:
    """One row per dialogue: its key, user agent, whether it breaks each rule (null: the leak rule
    not checked) and the assistant's mean reply length in words (docs/outputs.md)."""
    columns: dict[str, list] = {
        name: [d.key[i] for d in checked]
        for i, name in enumerate(("run", "user_id", "task_id", "setting", "trial", "assistant_model"))
    }
    columns["user_model"] = [d.user_model for d in checked]
    for rule in RULES:
        columns[rule] = [rule in d.flags if rule != "leak" or d.leak_checked else None for d in checked]
    columns["reply_words"] = [d.reply_words for d in checked]
    types = {"trial": pa.int32(), "reply_words": pa.float64(), **dict.fromkeys(RULES, pa.bool_())}
    schema = pa.schema([(name, types.get(name, pa.string())) for name in columns])
    pq.write_table(pa.table(columns, schema=schema), path)
    return path
