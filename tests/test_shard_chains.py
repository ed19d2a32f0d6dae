"""One chain per dialogue (store/turns.py): stored turns of two invocations of one shard, written by
hand as a stale job and its resubmitted copy leave them, are read back as one invocation's turns and
then only those of an invocation that resumed from exactly that prefix."""

from __future__ import annotations

from pathlib import Path

from personalens.store import TURNS_SCHEMA, PartWriter, partial_dialogues, stored_turns
from personalens.store.turns import continued_dialogues

KEY = ("user0", "task0", "base", 0)
A, B, C = 100.0, 200.0, 300.0  # three invocations' session_started


def turns(session: float, indices: range, resumed_from: float | None = None, terminate_at: int = -1) -> list[dict]:
    """Rows of one invocation's turns at `indices` of the dialogue; its first answers the turn that
    `resumed_from` stored (None: it starts at the opening, or the column is absent: older runs)."""
    rows = []
    for i in indices:
        follows = (resumed_from if i == indices[0] else session) if i else None
        rows.append(
            {
                "run_id": "r",
                **dict(zip(("user_id", "task_id", "setting", "trial"), KEY)),
                "index": i,
                "role": "user" if i % 2 == 0 else "assistant",
                "text": f"{session:g}-{i}",
                "prompt_tokens": 1,
                "completion_tokens": 1,
                "said_terminate": i == terminate_at,
                "session_started": session,
                "follows_session": follows,
            }
        )
    return rows


def write(folder: Path, *parts: list[dict]) -> None:
    writer = PartWriter(folder, TURNS_SCHEMA)
    for rows in parts:
        writer.write(rows)


def texts(folder: Path) -> list[str]:
    return [t["text"] for t in stored_turns(folder)[KEY]]


def test_an_invocation_resumed_from_a_shorter_prefix_is_left_out_of_the_earlier_chain(tmp_path):
    # A stored 0-4; B, a stale copy, resumed from A's 0-2 and stored 3-6: B5 answered B4, not A4
    write(tmp_path, turns(A, range(0, 5)), turns(B, range(3, 7), resumed_from=A))
    assert texts(tmp_path) == ["100-0", "100-1", "100-2", "100-3", "100-4"]
    assert partial_dialogues(tmp_path, ()) == {KEY: 5} and continued_dialogues(tmp_path) == 0


def test_the_same_parts_in_another_order_give_the_same_chain(tmp_path):
    write(tmp_path, turns(B, range(3, 7), resumed_from=A), turns(A, range(0, 5)))
    assert texts(tmp_path) == [f"100-{i}" for i in range(5)]


def test_an_invocation_that_resumed_from_the_whole_prefix_continues_the_chain(tmp_path):
    # A stored 0-2 and stopped; B resumed from all of it (3-6); C, stale, had resumed from A's 0-1
    write(tmp_path, turns(A, range(0, 3)), turns(B, range(3, 7), resumed_from=A), turns(C, range(2, 5), resumed_from=A))
    assert texts(tmp_path) == ["100-0", "100-1", "100-2", "200-3", "200-4", "200-5", "200-6"]
    assert continued_dialogues(tmp_path) == 1


def test_a_chain_goes_on_through_several_resumes(tmp_path):
    write(tmp_path, turns(A, range(0, 2)), turns(B, range(2, 4), resumed_from=A), turns(C, range(4, 6), resumed_from=B))
    assert texts(tmp_path) == ["100-0", "100-1", "200-2", "200-3", "300-4", "300-5"]


def test_a_terminate_in_the_earlier_chain_is_not_followed_by_the_other_invocations_turns(tmp_path):
    # A's user turn 4 said TERMINATE and A stored the assistant's last reply; B resumed from A's 0-2
    # and its user turn 4 went on: the old reading (A0-A5, then B6) broke the dialogue's end
    write(tmp_path, turns(A, range(0, 6), terminate_at=4), turns(B, range(3, 9), resumed_from=A))
    chain = stored_turns(tmp_path)[KEY]
    assert [t["text"] for t in chain] == [f"100-{i}" for i in range(6)]
    assert [t["said_terminate"] for t in chain] == [False] * 4 + [True, False]


def test_two_openings_give_the_earliest_invocations_chain(tmp_path):
    write(tmp_path, turns(B, range(0, 4)), turns(A, range(0, 2)))
    assert texts(tmp_path) == ["100-0", "100-1"]


def test_turns_stored_before_the_column_existed_read_as_before(tmp_path):
    old = [{k: v for k, v in row.items() if k != "follows_session"} for row in turns(A, range(0, 3))]
    schema = TURNS_SCHEMA.remove(TURNS_SCHEMA.get_field_index("follows_session"))
    PartWriter(tmp_path, schema).write(old)
    write(tmp_path, turns(B, range(3, 5), resumed_from=A))
    assert texts(tmp_path) == ["100-0", "100-1", "100-2", "200-3", "200-4"]
