"""merge: completeness across shard folders, judged on hand-built Parquet part files."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from run_rows import dialogue_row, judgment_row

from personalens.merge.check import merge
from personalens.store import DIALOGUE_SCHEMA, JUDGMENT_SCHEMA, TURNS_SCHEMA, PartWriter

DIMENSIONS = ["task_completion", "personalization", "naturalness", "coherence"]
# naturalness and coherence are scored once per speaker
JUDGMENTS_PER_DIALOGUE = 6
# two shards: users 0 and 1 in shard 0, user 2 in shard 1; two tasks each, one setting, two trials
USERS = {"user0": 0, "user1": 0, "user2": 1}
TASKS = ["SD-Alarm-task-1", "MD-task-3"]
TRIALS = 2
EXPECTED = {
    (user, task, "base", trial): shard for user, shard in USERS.items() for task in TASKS for trial in range(TRIALS)
}


def dialogue_of(key: tuple) -> dict:
    user, task, setting, trial = key
    turns = [{"role": "user", "text": "hi", "prompt_tokens": 3, "completion_tokens": 1}]
    return dialogue_row(user, task, task[:2], ["Alarm"], setting=setting, trial=trial, seed=trial, turns=turns)


def judgment_rows(key: tuple) -> list[dict]:
    speakers = {"naturalness": ["assistant", "user"], "coherence": ["assistant", "user"]}
    dialogue = dialogue_of(key)
    return [
        judgment_row(dialogue, dim, 1.0, speaker=speaker) for dim in DIMENSIONS for speaker in speakers.get(dim, [""])
    ]


def write_part(out_dir: Path, table: str, shard: int, rows: list[dict], part: int = 0, count: int = 2) -> None:
    schema = DIALOGUE_SCHEMA if table == "dialogues" else JUDGMENT_SCHEMA
    folder = out_dir / table / f"shard-{shard:03d}-of-{count:03d}"
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), folder / f"part-{part:05d}-x.parquet")


def write_run(out_dir: Path, keys=EXPECTED) -> None:
    """Every shard's dialogues and judgments, each shard split over two part files."""
    for shard in (0, 1):
        mine = [key for key in keys if keys[key] == shard]
        for part, half in enumerate((mine[: len(mine) // 2], mine[len(mine) // 2 :])):
            write_part(out_dir, "dialogues", shard, [dialogue_of(k) for k in half], part)
            write_part(out_dir, "judgments", shard, [r for k in half for r in judgment_rows(k)], part)


def merged_files(out_dir: Path) -> list[Path]:
    return sorted((out_dir / "merged").glob("*")) if (out_dir / "merged").exists() else []


def test_complete_run_merges_every_row_once(tmp_path):
    write_run(tmp_path)
    result = merge(tmp_path, EXPECTED, DIMENSIONS, shard_count=2)
    assert result.ok, result.format()
    assert "complete" in result.format()

    dialogues = pq.read_table(tmp_path / "merged" / "dialogues.parquet")
    keys = list(zip(*(dialogues.column(c).to_pylist() for c in ("user_id", "task_id", "setting", "trial"))))
    assert sorted(keys) == sorted(EXPECTED)
    judgments = pq.read_table(tmp_path / "merged" / "judgments.parquet")
    assert judgments.num_rows == len(EXPECTED) * JUDGMENTS_PER_DIALOGUE
    judged = set(
        zip(*(judgments.column(c).to_pylist() for c in ("user_id", "task_id", "trial", "dimension", "speaker")))
    )
    assert len(judged) == judgments.num_rows
    assert set(result.written) == {tmp_path / "merged" / "dialogues.parquet", tmp_path / "merged" / "judgments.parquet"}
    # only the two tables: no temporary files left behind
    assert [p.name for p in merged_files(tmp_path)] == ["dialogues.parquet", "judgments.parquet"]


def test_a_run_merged_before_judging_writes_its_dialogues_alone(tmp_path):
    for shard in (0, 1):
        write_part(tmp_path, "dialogues", shard, [dialogue_of(k) for k in EXPECTED if EXPECTED[k] == shard])
    result = merge(tmp_path, EXPECTED, [], shard_count=2)
    assert result.ok, result.format()
    assert [p.name for p in merged_files(tmp_path)] == ["dialogues.parquet"]


def test_missing_shard_folder_names_that_shard_and_writes_nothing(tmp_path):
    write_run(tmp_path)
    for table in ("dialogues", "judgments"):
        for part in (tmp_path / table / "shard-001-of-002").iterdir():
            part.unlink()
        (tmp_path / table / "shard-001-of-002").rmdir()

    result = merge(tmp_path, EXPECTED, DIMENSIONS, shard_count=2)
    assert not result.ok
    assert [(p.index, p.count) for p in result.problems] == [(1, 2)]
    shard = result.problems[0]
    assert shard.no_dialogue_files
    assert sorted(shard.missing_dialogues) == sorted(k for k, s in EXPECTED.items() if s == 1)
    assert len(shard.missing_judgments) == 4 * JUDGMENTS_PER_DIALOGUE
    text = result.format()
    assert "shard 1 of 2" in text and "shard 0 of 2" not in text
    assert "4 dialogues missing (user2: SD-Alarm-task-1, MD-task-3" in text
    assert "--array=1" in text
    assert merged_files(tmp_path) == []


def turn_rows(key: tuple, turns: int, session: float) -> list[dict]:
    user, task, setting, trial = key
    return [
        {"run_id": "r", "user_id": user, "task_id": task, "setting": setting, "trial": trial, "index": i,
         "role": ("user", "assistant")[i % 2], "text": "t", "prompt_tokens": 3, "completion_tokens": 1,
         "said_terminate": False, "session_started": session}
        for i in range(turns)
    ]  # fmt: skip


def test_a_partly_simulated_shard_says_how_many_of_its_missing_dialogues_resume_from_stored_turns(tmp_path):
    write_run(tmp_path)
    missing = sorted(k for k, s in EXPECTED.items() if s == 1)
    for part in (tmp_path / "dialogues" / "shard-001-of-002").iterdir():
        part.unlink()
    turns = PartWriter(tmp_path / "turns" / "shard-001-of-002", TURNS_SCHEMA)
    turns.write(turn_rows(missing[0], 3, 1.0) + turn_rows(missing[1], 2, 1.0))
    turns.write(turn_rows(missing[0], 2, 2.0))  # the same turns again, by a stale copy of the job: counted once
    # a finished dialogue's turns (shard 0): not partial, not counted
    PartWriter(tmp_path / "turns" / "shard-000-of-002", TURNS_SCHEMA).write(turn_rows(sorted(EXPECTED)[0], 4, 1.0))

    result = merge(tmp_path, EXPECTED, DIMENSIONS, shard_count=2)
    (shard,) = result.problems
    assert (shard.index, shard.partial_dialogues, shard.stored_turns) == (1, 2, 5)
    assert "4 dialogues missing (user2: SD-Alarm-task-1, MD-task-3), 2 of them partly simulated (5 turns stored" in (
        result.format()
    )
    assert merged_files(tmp_path) == []


def test_a_dialogue_stored_twice_is_merged_once_and_named_in_merge_json(tmp_path):
    write_run(tmp_path)
    again = ("user0", "MD-task-3", "base", 1)
    # a job that wrote the same dialogue again beside its resubmitted copy, with its judgments
    write_part(tmp_path, "dialogues", 0, [{**dialogue_of(again), "seconds": 99.0}], part=7)
    write_part(tmp_path, "judgments", 0, judgment_rows(again), part=7)

    result = merge(tmp_path, EXPECTED, DIMENSIONS, shard_count=2)
    assert result.ok, result.format()
    assert (result.dialogues, result.judgments) == (len(EXPECTED), len(EXPECTED) * JUDGMENTS_PER_DIALOGUE)
    assert [c.key for c in result.duplicated_dialogues] == [again]
    assert len(result.duplicated_judgments) == JUDGMENTS_PER_DIALOGUE
    assert "1 dialogue(s) and 6 judgment(s) are stored more than once (user0 MD-task-3 base 1 in " in result.format()
    merged = pq.read_table(tmp_path / "merged" / "dialogues.parquet").to_pylist()
    copies = [d for d in merged if (d["user_id"], d["task_id"], d["setting"], d["trial"]) == again]
    assert [d["seconds"] for d in copies] == [dialogue_of(again)["seconds"]]  # the first part's copy, kept
    assert pq.read_table(tmp_path / "merged" / "judgments.parquet").num_rows == len(EXPECTED) * JUDGMENTS_PER_DIALOGUE
    status = json.loads((tmp_path / "merge.json").read_text())
    assert status["complete"] and status["dialogues"] == len(EXPECTED)
    assert status["duplicates"]["dialogues"] == ["user0 MD-task-3 base 1 in dialogues/shard-000-of-002 (2 copies)"]
    assert len(status["duplicates"]["judgments"]) == JUDGMENTS_PER_DIALOGUE
    assert "the copy of the earliest invocation kept" in status["duplicates"]["note"]


def test_a_dialogue_in_two_shard_folders_keeps_the_earliest_invocations_copy(tmp_path):
    write_run(tmp_path)
    moved = ("user2", "SD-Alarm-task-1", "base", 0)
    write_part(tmp_path, "dialogues", 0, [{**dialogue_of(moved), "session_started": 5.0, "seconds": 7.0}], part=7)

    result = merge(tmp_path, EXPECTED, DIMENSIONS, shard_count=2)
    assert result.ok, result.format()
    assert result.duplicated_dialogues[0].places == ("dialogues/shard-000-of-002", "dialogues/shard-001-of-002")
    merged = pq.read_table(tmp_path / "merged" / "dialogues.parquet").to_pylist()
    assert [
        d["seconds"] for d in merged if d["user_id"] == "user2" and d["trial"] == 0 and d["task_id"] == moved[1]
    ] == [7.0]  # a recorded session_started before the copy written without one


def test_missing_judgments_are_refused(tmp_path):
    write_run(tmp_path)
    folder = tmp_path / "judgments" / "shard-000-of-002"
    table = pq.read_table(folder / "part-00000-x.parquet")
    # drop the user-side naturalness score of one dialogue
    rows = table.to_pylist()
    dropped = next(r for r in rows if r["dimension"] == "naturalness" and r["speaker"] == "user")
    rows.remove(dropped)
    pq.write_table(pa.Table.from_pylist(rows, schema=JUDGMENT_SCHEMA), folder / "part-00000-x.parquet")

    result = merge(tmp_path, EXPECTED, DIMENSIONS, shard_count=2)
    assert not result.ok
    [shard] = result.problems
    assert (shard.index, shard.missing_dialogues) == (0, ())
    assert shard.missing_judgments == (
        (dropped["user_id"], dropped["task_id"], dropped["setting"], dropped["trial"], "naturalness", "user", -1),
    )
    assert "1 judgments missing" in result.format()
    assert merged_files(tmp_path) == []


def test_dialogue_outside_the_selection_is_refused(tmp_path):
    write_run(tmp_path)
    stray = ("user9", "SD-Alarm-task-1", "base", 0)
    write_part(tmp_path, "dialogues", 1, [dialogue_of(stray)], part=7)

    result = merge(tmp_path, EXPECTED, DIMENSIONS, shard_count=2)
    assert [(p.index, p.unexpected_dialogues) for p in result.problems] == [(1, (stray,))]


def test_only_whole_part_files_are_read(tmp_path):
    """A temporary file of a killed writer is not part of the data."""
    write_run(tmp_path)
    (tmp_path / "dialogues" / "shard-000-of-002" / ".part-00009-y.parquet.tmp").write_bytes(b"half")
    assert merge(tmp_path, EXPECTED, DIMENSIONS, shard_count=2).ok


@pytest.mark.parametrize("dimensions, per_dialogue", [(["task_completion"], 1), (["coherence"], 2)])
def test_only_the_requested_dimensions_are_required(tmp_path, dimensions, per_dialogue):
    for shard in (0, 1):
        keys = [k for k, s in EXPECTED.items() if s == shard]
        write_part(tmp_path, "dialogues", shard, [dialogue_of(k) for k in keys])
        write_part(
            tmp_path, "judgments", shard, [r for k in keys for r in judgment_rows(k) if r["dimension"] in dimensions]
        )
    result = merge(tmp_path, EXPECTED, dimensions, shard_count=2)
    assert result.ok, result.format()
    assert result.judgments == len(EXPECTED) * per_dialogue
    assert not merge(tmp_path, EXPECTED, DIMENSIONS, shard_count=2).ok


def test_incomplete_run_is_reported_over_what_finished_naming_the_missing_shard_and_why(tmp_path):
    """A failed shard leaves merge.json naming it with its log's closing line; the report over the
    shards that finished names it; once the shard is done, a merge again clears the note."""
    from personalens.report import build_report

    run = tmp_path / "run"
    shard0 = {k: s for k, s in EXPECTED.items() if s == 0}
    write_run(run, shard0)
    logs = run / "logs"
    logs.mkdir()
    (logs / "generate.shard-001-of-002.log").write_text(
        "\n===== personalens generate shard.index=1 at 2026-11-27 10:00:00\nvLLM noise\n"
        "personalens generate: error: dialogues/shard-001-of-002: not a folder\n"
    )
    (logs / "judge.shard-000-of-002.log").write_text("\n===== personalens judge at 2026-11-27 11:00:00\n")

    result = merge(run, EXPECTED, DIMENSIONS, shard_count=2)
    assert not result.ok and result.rerun == "1"
    line = result.format()
    assert "shard 1 of 2: no dialogue files" in line
    assert "why: generate: error: dialogues/shard-001-of-002: not a folder" in line
    assert "shard 0 of 2" not in line and merged_files(run) == []

    report = build_report([run], tmp_path / "out", bootstrap=50)
    (note,) = report.incomplete
    assert "INCOMPLETE, 8 of 12 dialogues" in note and "generate: error:" in note and "ARRAY=1" in note
    text = (tmp_path / "out" / "report.md").read_text()
    assert "cover only the shards that finished" in text and "shard 1 of 2" in text
    assert "shard 1 of 2" in report.table3_markdown()  # what `report` and `run` print

    write_run(run)  # shard 1 done since: the old merge.json no longer describes the rows
    (stale,) = build_report([run], tmp_path / "out", bootstrap=50).incomplete
    assert "run `personalens merge` again" in stale
    assert merge(run, EXPECTED, DIMENSIONS, shard_count=2).ok
    assert build_report([run], tmp_path / "out", bootstrap=50).incomplete == ()


def test_a_killed_step_is_told_apart_from_one_that_never_ran(tmp_path):
    from personalens.merge.why import shard_story

    assert "no log of its generate or judge (never started" in shard_story(tmp_path, 1, 2)
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "generate.shard-001-of-002.log").write_text(
        "===== personalens generate at 2026-11-27 10:00:00\npersonalens generate: finished\n"
        "===== personalens generate at 2026-11-27 12:00:00\nloading weights\n"
    )
    story = shard_story(tmp_path, 1, 2)
    assert "generate: started at 2026-11-27 12:00:00 and never ended by itself" in story
    assert "finished" not in story
