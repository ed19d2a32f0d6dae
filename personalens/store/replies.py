"""The assistant's reply length in a dialogue, in words (a tokenizer-free count, alike across models):
what the report sets scores against (report/length.py) and `compare` regresses out of a difference
(compare/length.py)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from personalens.data.records import Turn
from personalens.store.parts import read_table

_WORD = re.compile(r"[a-z0-9]+")

# a dialogue's identity across runs: (run directory, user, task, setting, trial, assistant model)
DialogueKey = tuple[str, str, str, str, int, str]


def dialogue_key(run_dir: Path, row: dict) -> DialogueKey:
    """The key of a dialogue row of `run_dir`."""
    return (str(run_dir), row["user_id"], row["task_id"], row["setting"], int(row["trial"]), row["assistant_model"])


def words(text: str) -> list[str]:
    """The text's words, lower-cased, punctuation and markup dropped."""
    return _WORD.findall(text.lower())


def mean_reply_words(turns: Sequence[Turn]) -> float | None:
    """The assistant's mean reply length in words; None without a reply."""
    lengths = [len(words(t.text)) for t in turns if t.role == "assistant"]
    return sum(lengths) / len(lengths) if lengths else None


def reply_words(run_dir: Path) -> dict[DialogueKey, float]:
    """Per dialogue of the run with an assistant reply, its mean reply length in words."""
    table = read_table(
        Path(run_dir) / "dialogues", ["user_id", "task_id", "setting", "trial", "assistant_model", "turns"]
    )
    out: dict[DialogueKey, float] = {}
    for row in table.to_pylist() if table is not None else ():
        length = mean_reply_words([Turn(t["role"], t["text"] or "") for t in row["turns"] or ()])
        if length is not None:
            out[dialogue_key(run_dir, row)] = length
    return out
