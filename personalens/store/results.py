"""Read the `dialogues/` and `judgments/` Parquet datasets of run output directories (docs/outputs.md)
back as records: what `report` and `compare` compute from.

Only the columns the tables need are read (dialogue text stays on disk), and every row becomes a
small typed record so that the arithmetic in `tables` never touches pyarrow.

A row stored more than once (two invocations of one shard that both wrote it, store/duplicates.py)
is read once, the same copy by every reader, and named in one warning.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from personalens.engines.chat.reasoning import leaks
from personalens.engines.chat.spans import repeated_share, thinking_found
from personalens.errors import PersonalensError
from personalens.store.duplicates import Copies, keep_first, warning
from personalens.store.schema import ENDINGS, SCORE_RANGES

log = logging.getLogger(__name__)

KINDS = ("SD", "MD")
DIMENSIONS = ("task_completion", "personalization", "naturalness", "coherence")

# Columns that identify one dialogue across runs; a repeat is a row stored twice (store/duplicates.py).
_DIALOGUE_KEY = ("run_id", "user_id", "task_id", "setting", "trial", "assistant_model", "user_model")
_JUDGMENT_KEY = _DIALOGUE_KEY + ("dimension", "speaker", "turn", "judge_key")


@dataclass(frozen=True)
class Scenario:
    """Where a row comes from: the user (the unit intervals resample), the task and the trial."""

    user_id: str
    task_id: str
    trial: int

    @property
    def key(self) -> tuple[str, str]:
        """The scenario, whose trials are averaged before anything else."""
        return (self.user_id, self.task_id)


@dataclass(frozen=True)
class Judgment:
    scenario: Scenario
    assistant_model: str
    setting: str
    kind: str  # "SD" | "MD"
    domains: tuple[str, ...]
    dimension: str
    speaker: str  # "assistant" | "user" for naturalness/coherence, "" otherwise
    turn: int  # -1: whole dialogue; k >= 1: dialogue cut after the k-th assistant reply
    score: float | None  # None exactly when the judge output did not parse
    parsed: bool
    failure: str | None = None  # why it has no valid score (null in runs written before the column)
    finish_reason: str | None = None  # "stop" | "length" | "thinking"; None when refused or not recorded
    run: str = ""  # the run directory it was read from
    shard: str = ""  # the folder of its part file, "shard-KKK-of-NNN"
    session: float | None = None  # session_started of the `judge` that wrote it; None before it was kept
    reasoning_tokens: int | None = None  # a reasoning judge's thinking tokens; None where not counted
    judge: str = ""  # the judge's key (a panel's judges each have one); "" in runs written before keys

    @property
    def out_of_range(self) -> bool:
        """A parsed score off the dimension's scale: kept only under fidelity=official, as the
        released code keeps it (docs/fidelity.md)."""
        lo, hi = SCORE_RANGES[self.dimension]
        return self.score is not None and not lo <= self.score <= hi


@dataclass(frozen=True)
class Stopped:
    """A reply that stopped inside its thinking (a dialogue that ended "thinking"), as its row keeps it."""

    role: str
    model: str  # the model of its role in the dialogue
    prompt_tokens: int | None
    thinking_tokens: int | None
    repeated: float | None  # the share of its thinking's runs (engines/chat/spans.py) that it wrote more than once


@dataclass(frozen=True)
class Dialogue:
    scenario: Scenario
    assistant_model: str
    setting: str
    kind: str
    domains: tuple[str, ...]
    rounds: int
    completion_tokens: tuple[int, ...]  # one per turn that reported a count
    run: str = ""  # the run directory it was read from
    ended: str | None = None  # terminated | max_rounds | context | thinking | failed (store.ENDINGS)
    opening_terminate: bool = False
    # per turn: (role, finish_reason); the reason is None in runs written before it was recorded
    finishes: tuple[tuple[str, str | None], ...] = ()
    shard: str = ""  # the folder of its part file, "shard-KKK-of-NNN"
    session: float | None = None  # session_started of the `generate` that wrote it; None before it was kept
    # per turn, as `finishes`: its thinking tokens (None where not counted or not recorded), and the
    # thinking markers its text holds (a text every other party reads: 0 unless thinking leaked)
    reasoning_tokens: tuple[int | None, ...] = ()
    leaks: tuple[int, ...] = ()
    # per turn: whether a run of its thinking was found in a later turn's text, which prompts to the
    # other party and judge transcripts are made of (engines/chat/spans.py; False for every turn otherwise)
    thinking_found: tuple[bool, ...] = ()
    stopped: Stopped | None = None  # its reply that stopped inside its thinking; None otherwise and in older runs

    @property
    def stopped_role(self) -> str | None:
        """The role whose reply stopped inside its thinking (ended "thinking"): the one it waited on."""
        if self.ended != "thinking":
            return None
        return "user" if not self.finishes or self.finishes[-1][0] == "assistant" else "assistant"


@dataclass(frozen=True)
class RunData:
    dialogues: tuple[Dialogue, ...]
    judgments: tuple[Judgment, ...]


def load_runs(
    run_dirs: Sequence[Path],
    *,
    dialogues: bool = True,
    given: Mapping[str, Mapping[tuple[str, str], str]] | None = None,
) -> RunData:
    """All dialogues (none with `dialogues=False`) and judgments of `run_dirs`, checked for the
    fields the tables rely on. `given`: per run directory and scenario (user id, task id), the text its
    prompts are made of besides the dialogue (instructions, the user's data), which the content leak
    check does not count (engines/chat/spans.py; none where not given)."""
    if not run_dirs:
        raise PersonalensError("no run directories given")
    resolved = [Path(d).resolve() for d in run_dirs]
    twice = sorted({str(d) for d in resolved if resolved.count(d) > 1})
    if twice:
        raise PersonalensError(f"run directory {twice[0]} is given more than once")
    dialogue_rows: list[tuple[Path, dict[str, Any]]] = []
    judgment_rows: list[tuple[Path, dict[str, Any]]] = []
    for run_dir in map(Path, run_dirs):
        if not run_dir.is_dir():
            raise PersonalensError(f"run directory {run_dir} does not exist")
        if dialogues:
            dialogue_rows += _read_dataset(
                run_dir / "dialogues",
                _DIALOGUE_KEY + ("kind", "domains", "rounds"),
                optional=("ended", "opening_terminate", "session_started", "stopped_turn"),
                turns=("role", "text", "completion_tokens", "finish_reason", "reasoning", "reasoning_tokens"),
                run=str(run_dir),
                given=(given or {}).get(str(run_dir), {}),
            )
        judgment_rows += _read_dataset(
            run_dir / "judgments",
            _JUDGMENT_KEY[:-1] + ("kind", "domains", "score", "parsed"),
            optional=("failure", "finish_reason", "session_started", "reasoning_tokens", "judge_key"),
            run=str(run_dir),
        )
    dialogue_rows, dialogue_copies = _keep_one(dialogue_rows, _DIALOGUE_KEY)
    judgment_rows, judgment_copies = _keep_one(judgment_rows, _JUDGMENT_KEY)
    if dialogue_copies or judgment_copies:
        log.warning(warning(dialogue_copies, judgment_copies))
    return RunData(
        dialogues=tuple(_dialogue(path, row) for path, row in dialogue_rows),
        judgments=tuple(_judgment(path, row) for path, row in judgment_rows),
    )


def part_files(folder: Path) -> list[Path]:
    if not folder.is_dir():
        raise PersonalensError(f"{folder} does not exist (was this step of the run done?)")
    # Hidden or underscore names are temporary files of an unfinished atomic write.
    files = sorted(p for p in folder.rglob("*.parquet") if not p.name.startswith((".", "_")))
    if not files:
        raise PersonalensError(f"{folder} holds no Parquet part files")
    return files


def _read_dataset(
    folder: Path,
    columns: Iterable[str],
    *,
    optional: Iterable[str] = (),
    turns: Iterable[str] = (),
    run: str = "",
    given: Mapping[tuple[str, str], str] | None = None,
) -> list[tuple[Path, dict[str, Any]]]:
    """The rows of a table's part files with `columns` (required) and `optional` ones (None where a
    part was written before they existed); `turns`: fields of the turns (completion_tokens required;
    the others None where a part has none)."""
    rows: list[tuple[Path, dict[str, Any]]] = []
    for path in part_files(folder):
        try:
            file = pq.ParquetFile(path)
        except Exception as err:  # pyarrow raises several types for a damaged file
            raise PersonalensError(f"{path}: not a readable Parquet file ({err})") from err
        wanted = list(columns)
        missing = [c for c in wanted if c not in file.schema_arrow.names]
        if missing:
            raise PersonalensError(f"{path}: missing column(s) {', '.join(missing)} (see docs/outputs.md)")
        present = [c for c in optional if c in file.schema_arrow.names]
        leaves = _turn_leaves(file, path, turns) if turns else {}
        for row in file.read(columns=wanted + present + list(leaves.values())).to_pylist():
            row.update({c: None for c in optional if c not in present})
            if turns:
                row["turns"] = [{f: t.get(f) for f in turns} for t in row["turns"] or ()]
                if "reasoning" in turns:  # searched here and dropped: thinking can be far longer than answers
                    row["thinking_found"] = thinking_found(
                        [(t.get("text") or "", t.pop("reasoning") or "") for t in row["turns"]],
                        (given or {}).get((row.get("user_id"), row.get("task_id")), ""),
                    )
            row["run"] = run
            rows.append((path, row))
    return rows


def _turn_leaves(file: pq.ParquetFile, path: Path, fields: Iterable[str]) -> dict[str, str]:
    """The column paths of the turns' `fields` that the file has (completion_tokens required): the
    list's inner names ("list.element" or "list.item") depend on the writer, so they are looked up."""
    leaves = {}
    for i in range(file.metadata.num_columns):
        leaf = file.schema.column(i).path
        field = leaf.rsplit(".", 1)[-1]
        if leaf.startswith("turns.") and field in fields:
            leaves[field] = leaf
    if "completion_tokens" not in leaves:
        raise PersonalensError(f"{path}: column turns has no completion_tokens field (see docs/outputs.md)")
    return leaves


def _keep_one(
    rows: list[tuple[Path, dict[str, Any]]], key: tuple[str, ...]
) -> tuple[list[tuple[Path, dict[str, Any]]], list[Copies]]:
    """`rows` with one copy of each key (store/duplicates.py's choice), and the keys stored twice."""
    return keep_first(
        rows, key=lambda r: tuple(r[1][c] for c in key), where=lambda r: (r[1]["session_started"], str(r[0]))
    )


def _scenario(row: dict[str, Any]) -> Scenario:
    return Scenario(row["user_id"], row["task_id"], int(row["trial"]))


def _kind(path: Path, row: dict[str, Any]) -> str:
    if row["kind"] not in KINDS:
        raise PersonalensError(f"{path}: kind is {row['kind']!r}, expected one of {KINDS}")
    return row["kind"]


def _domains(path: Path, row: dict[str, Any]) -> tuple[str, ...]:
    if not row["domains"]:
        raise PersonalensError(f"{path}: task {row['task_id']} of {row['user_id']} has no domains")
    return tuple(row["domains"])


def _dialogue(path: Path, row: dict[str, Any]) -> Dialogue:
    if row["rounds"] is None or row["rounds"] < 0:
        raise PersonalensError(f"{path}: rounds is {row['rounds']!r} for {row['user_id']}/{row['task_id']}")
    if row["ended"] is not None and row["ended"] not in ENDINGS:
        raise PersonalensError(
            f"{path}: ended is {row['ended']!r} for {row['user_id']}/{row['task_id']}, expected one of {ENDINGS}"
        )
    tokens = tuple(t["completion_tokens"] for t in row["turns"] if t["completion_tokens"] is not None)
    return Dialogue(
        _scenario(row),
        row["assistant_model"],
        row["setting"],
        _kind(path, row),
        _domains(path, row),
        row["rounds"],
        tokens,
        run=row["run"],
        ended=row["ended"],
        opening_terminate=bool(row["opening_terminate"]),
        finishes=tuple((t.get("role"), t.get("finish_reason")) for t in row["turns"]),
        shard=path.parent.name,
        session=row["session_started"],
        reasoning_tokens=tuple(t.get("reasoning_tokens") for t in row["turns"]),
        leaks=tuple(leaks(t.get("text") or "") for t in row["turns"]),
        thinking_found=row["thinking_found"],
        stopped=_stopped(row),
    )


def _stopped(row: dict[str, Any]) -> Stopped | None:
    reply = row.get("stopped_turn")
    if not reply:
        return None
    model = row["assistant_model"] if reply["role"] == "assistant" else row.get("user_model") or ""
    tokens = reply.get("reasoning_tokens")
    return Stopped(
        reply["role"], model, reply.get("prompt_tokens"), tokens, repeated_share(reply.get("reasoning") or "")
    )


def _judgment(path: Path, row: dict[str, Any]) -> Judgment:
    if row["dimension"] not in DIMENSIONS:
        raise PersonalensError(f"{path}: dimension is {row['dimension']!r}, expected one of {DIMENSIONS}")
    parsed = bool(row["parsed"])
    if parsed and row["score"] is None:
        raise PersonalensError(
            f"{path}: {row['dimension']} of {row['user_id']}/{row['task_id']} is marked parsed but has no score"
        )
    return Judgment(
        _scenario(row),
        row["assistant_model"],
        row["setting"],
        _kind(path, row),
        _domains(path, row),
        row["dimension"],
        row["speaker"] or "",
        int(row["turn"]),
        float(row["score"]) if parsed else None,
        parsed,
        row["failure"],
        row["finish_reason"],
        row["run"],
        path.parent.name,
        row["session_started"],
        row["reasoning_tokens"],
        row["judge_key"] or "",
    )
