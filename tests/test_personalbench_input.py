"""PersonalBench stage 1 without a model: the WildChat reader on the bundled sample and on malformed
records, grouping into users, the filters, and the evidence check of extracted attributes."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from personalens.errors import PersonalensError
from personalens.personalbench.extraction import Rules, evidence_ok, review
from personalens.personalbench.formats import Attribute
from personalens.personalbench.histories import Filters, duplicate_share, group, histories, user_id
from personalens.personalbench.wildchat import ReadStats, read_conversations, shard_paths

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "personalbench" / "wildchat-sample" / "data"


def _read(paths, batch_size=1024):
    stats = ReadStats()
    return list(read_conversations(paths, stats, batch_size)), stats


def test_sample_is_read_in_batches_and_every_record_is_accounted_for():
    paths = shard_paths([str(SAMPLE / "train-*.parquet")])
    rows = sum(pq.ParquetFile(p).metadata.num_rows for p in paths)
    conversations, stats = _read(paths, batch_size=3)
    assert stats.files == 2 and stats.rows == rows
    assert stats.conversations == len(conversations) == rows - sum(stats.bad.values())
    assert stats.bad == Counter(
        {
            "empty conversation": 1,
            "missing field: hashed_ip": 1,
            "missing field: conversation.content": 1,
            "wrong type: turn": 1,
        }
    )
    assert set(_read(paths, batch_size=1000)[0]) == set(conversations)  # batching changes nothing
    flagged = [c for c in conversations if c.toxic or c.flagged]
    assert {cat for c in flagged for cat in c.flagged_categories} == {"harassment", "self-harm"}
    assert all(t.role in ("user", "assistant") and t.content for c in conversations for t in c.turns)


def _write(tmp_path: Path, name: str, rows: list[dict]) -> Path:
    path = tmp_path / name
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def _message(role="user", content="hello", turn_identifier=1):
    return {"role": role, "content": content, "turn_identifier": turn_identifier}


def _record(**changes):
    record = {
        "conversation_hash": "h",
        "timestamp": None,
        "turn": 1,
        "language": "English",
        "conversation": [_message(), _message("assistant", "hi")],
        "openai_moderation": [],
        "toxic": False,
        "hashed_ip": "ip",
        "header": {"accept-language": "en", "user-agent": "ua"},
    }
    return {**record, **changes}


@pytest.mark.parametrize(
    "record, reason",
    [
        (_record(conversation=[]), "empty conversation"),
        (_record(hashed_ip=None), "missing field: hashed_ip"),
        (_record(header={"accept-language": "en", "user-agent": None}), "missing field: header.user-agent"),
        (_record(conversation=[_message(role="system")]), "unknown role in conversation"),
        (_record(conversation=[_message("assistant", "only the assistant")]), "no user message"),
    ],
)
def test_malformed_records_are_counted_not_fatal(tmp_path, record, reason):
    path = _write(tmp_path, "train-0.parquet", [_record(conversation_hash="good"), record])
    conversations, stats = _read([path])
    assert [c.conversation_hash for c in conversations] == ["good"]
    assert stats.bad == Counter({reason: 1}) and stats.rows == 2


def test_wrong_types_and_unreadable_files_are_counted(tmp_path):
    typed = _write(tmp_path, "train-1.parquet", [_record(turn="one")])
    other = _write(tmp_path, "train-2.parquet", [_record(conversation_hash=7)])
    broken = tmp_path / "train-3.parquet"
    broken.write_bytes(b"not parquet at all")
    conversations, stats = _read([typed, other, broken])
    assert conversations == []
    assert stats.bad == Counter({"wrong type: turn": 1, "wrong type: conversation_hash": 1, "unreadable file": 1})
    assert str(broken) in stats.format()


def test_no_matching_shards_is_a_clear_error(tmp_path):
    with pytest.raises(PersonalensError, match="no WildChat shards"):
        shard_paths([str(tmp_path / "train-*.parquet")])


def test_grouping_and_filters_on_the_sample():
    conversations, _ = _read(shard_paths([str(SAMPLE / "*.parquet")]))
    users = group(conversations)
    by_key = Counter(c.user for c in conversations)
    assert {k: len(v) for k, v in users.items()} == dict(by_key)
    kept, dropped = histories(users, Filters())
    assert dropped == Counter(
        {"near-identical prompts (scripted or bulk user)": 1, "too few conversations": 1, "language": 1}
    )
    assert len(kept) == len(users) - 3 == 3
    for h in kept:
        assert h.user_id == user_id(h.user)
        assert list(h.conversations) == sorted(users[h.user], key=lambda c: (c.timestamp, c.conversation_hash))
    # looser rules keep the bulk user; holding out a conversation moves it out of the history
    loose, dropped = histories(users, Filters(max_duplicate_share=1.0, languages=()))
    assert len(loose) == 3 + 1  # the Spanish user now fails on user turns (2 < 3)
    assert dropped == Counter({"too few conversations": 1, "too few user turns": 1})
    held, _ = histories(users, Filters(holdout=1))
    assert all(len(h.held_out) == 1 and h.held_out[0] not in h.conversations for h in held)
    assert [len(h.conversations) + 1 for h in held] == [len(h.conversations) for h in kept]


def test_duplicate_share_counts_prompts_that_nearly_repeat_another():
    prompts = [
        "Write an SEO article about air fryers",
        "write an SEO article about air fryer",
        "Plan my trip to Rome",
        "What is 2+2?",
    ]
    assert duplicate_share(prompts, 0.8) == pytest.approx(2 / 4)
    assert duplicate_share(prompts, 1.0) == 0.0


def _history():
    conversations, _ = _read(shard_paths([str(SAMPLE / "*.parquet")]))
    kept, _ = histories(group(conversations), Filters())
    return next(h for h in kept if any("Portland" in t.content for t in h.user_turns))


def test_evidence_check_requires_the_quote_in_the_cited_user_turn():
    history = _history()
    turn = next(t for t in history.user_turns if "Portland" in t.content)
    other = next(t for t in history.user_turns if t.turn_identifier != turn.turn_identifier)

    def attribute(quote, turn_id):
        return Attribute("The user teaches chemistry.", "background", 0.9, turn_id, quote)

    assert evidence_ok(history, attribute("teach  HIGH-SCHOOL chemistry", turn.turn_identifier))  # case, spacing
    assert not evidence_ok(history, attribute("teach high-school chemistry", other.turn_identifier))
    assert not evidence_ok(history, attribute("teaches biology", turn.turn_identifier))
    assert not evidence_ok(history, attribute("Portland", 12345))  # not a turn of this user
    assert not evidence_ok(history, attribute("  ", turn.turn_identifier))


def test_review_drops_low_confidence_and_near_duplicates_and_marks_sensitive():
    history = _history()
    turn = history.user_turns[0]
    rules = Rules(
        categories=("background", "relationships"),
        min_confidence=0.5,
        duplicate_similarity=0.85,
        sensitive_categories=("relationships",),
    )
    attrs = [
        Attribute("The user is a chemistry teacher.", "background", 0.9, turn.turn_identifier, "chemistry"),
        Attribute("The user is a chemistry teacher", "background", 0.8, turn.turn_identifier, "chemistry"),
        Attribute("The user has a dog.", "relationships", 0.3, turn.turn_identifier, "dog"),
        Attribute("The user lives in Portland.", "background", 0.7, turn.turn_identifier, "in Portland"),
    ]
    rows = review(history, attrs, rules)
    assert [r["drop_reason"] for r in rows] == ["", "near-duplicate", "low confidence", ""]
    assert [r["kept"] for r in rows] == [True, False, False, True]
    assert [r["evidence_ok"] for r in rows] == [True, True, False, True]
    assert [r["sensitive"] for r in rows] == [False, False, True, False]
    assert [r["attribute_id"] for r in rows] == [f"{history.user_id}-a{k}" for k in range(4)]
    strict = review(history, attrs, Rules(categories=rules.categories, drop_failed_evidence=True, min_confidence=0.0))
    assert strict[2]["drop_reason"] == "evidence not found"


def test_rows_arrow_cannot_convert_and_map_categories_are_counted_not_crashed(tmp_path):
    good = pa.Table.from_pylist([_record(conversation_hash=f"h{i}") for i in range(3)])
    # row 1: a timestamp past Python's datetime range; row 2: a hashed_ip that is not UTF-8
    stamps = pa.array([None, 2**62, None], pa.timestamp("us"))
    ip = good.column("hashed_ip").combine_chunks()
    data = b"ipip\xff"
    ips = pa.Array.from_buffers(
        pa.string(), 3, [None, pa.py_buffer(pa.array([0, 2, 4, 5], pa.int32()).buffers()[1]), pa.py_buffer(data)]
    )
    assert ip.type == ips.type
    table = good.set_column(good.schema.get_field_index("timestamp"), "timestamp", stamps)
    table = table.set_column(table.schema.get_field_index("hashed_ip"), "hashed_ip", ips)
    bad = tmp_path / "bad.parquet"
    pq.write_table(table, bad)
    moderation = pa.array(
        [[{"flagged": True, "categories": [("harassment", True), ("violence", False)]}]],
        pa.list_(pa.struct([("flagged", pa.bool_()), ("categories", pa.map_(pa.string(), pa.bool_()))])),
    )
    one = pa.Table.from_pylist([_record()])
    mapped = tmp_path / "map.parquet"
    pq.write_table(
        one.set_column(one.schema.get_field_index("openai_moderation"), "openai_moderation", moderation), mapped
    )
    conversations, stats = _read([bad, mapped])
    assert stats.rows == 4 and stats.conversations == 2
    assert stats.bad == Counter({"a value out of range (e.g. a timestamp)": 1, "a string field that is not UTF-8": 1})
    assert conversations[-1].flagged_categories == ("harassment",)


def test_the_prompts_file_is_read_by_the_safe_reader(tmp_path):
    from personalens.data import DataError
    from personalens.personalbench.pipeline import load_prompts

    path = tmp_path / "prompts.jsonl"
    path.write_bytes(b'{"prompt_id": 1, "text": "a\xe2\x80\xa8b"}\r\n\n{"prompt_id": 2, "text": "\xff"}\n')
    with pytest.raises(DataError, match=r"prompts.jsonl: byte \d+: not UTF-8 text"):
        load_prompts(str(path))
    path.write_bytes(b'{"prompt_id": 1, "text": "a\xe2\x80\xa8b"}\r\n\n')
    assert load_prompts(str(path)) == [{"prompt_id": "1", "prompt": "a\u2028b", "sensitive": False}]
    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(DataError, match="is a named pipe"):
        load_prompts(str(fifo))


def test_a_fifo_or_directory_where_a_shard_should_be_is_counted_without_blocking(tmp_path):
    fifo = tmp_path / "train-0.parquet"
    os.mkfifo(fifo)
    folder = tmp_path / "train-1.parquet"
    folder.mkdir()
    good = _write(tmp_path, "train-2.parquet", [_record()])
    conversations, stats = _read(shard_paths([str(tmp_path / "train-*.parquet")]))
    assert len(conversations) == 1 and stats.files == 3
    assert stats.bad == Counter({"unreadable file": 2})
    assert "is a named pipe (FIFO), not a regular file" in stats.format() and str(fifo) in stats.format()
    assert str(good) not in stats.format()


@pytest.mark.parametrize(
    "lines, message",
    [
        (b"", "no prompts"),
        (b"\n  \n", "no prompts"),
        (b"[1, 2]\n", "expected a JSON object .* not list"),
        (b'{"prompt_id": "a"}\n', "no text"),
        (b'{"text": "hi"}\n', "no prompt_id"),
        (b'{"prompt_id": null, "text": "hi"}\n', "prompt_id is null"),
        (b'{"prompt_id": true, "text": "hi"}\n', "prompt_id is true"),
        (b'{"prompt_id": "a", "text": null}\n', "text is null"),
        (b'{"prompt_id": "a", "text": " "}\n', 'text is " "'),
        (b'{"prompt_id": "a", "text": "hi", "sensitive": "false"}\n', 'sensitive is "false"'),
        (
            b'{"prompt_id": "a", "text": "hi"}\n{"prompt_id": "a", "text": "ho"}\n',
            "line 2: prompt_id 'a' is also on line 1",
        ),
    ],
)
def test_a_prompts_file_with_bad_fields_or_no_prompts_is_an_error_naming_it(tmp_path, lines, message):
    from personalens.personalbench.pipeline import load_prompts

    path = tmp_path / "prompts.jsonl"
    path.write_bytes(lines)
    with pytest.raises(PersonalensError, match=rf"prompts.jsonl.*{message}"):
        load_prompts(str(path))


def test_until_read_reads_counts_and_pairs_without_loading_a_model(tmp_path):
    import json

    from personalbench_helpers import config

    from personalens.personalbench import command
    from personalens.store import read_table

    def no_model():
        raise AssertionError("until=read must not load a model")

    cfg = config(f"run.out_dir={tmp_path}", "personalbench.until=read", "personalbench.embedding.path=null")
    assert command.run(cfg, no_model, no_model) == 0
    out = tmp_path / "personalbench"
    summary = json.loads((out / "input" / "shard-000-of-001.json").read_text())
    assert summary["input"]["rows"] == 24 and summary["histories"]["kept"] == 3
    pairs = read_table(out / "pairs")
    assert pairs is not None and pairs.num_rows == 3 * 3  # 3 users, prompts_per_user 3
    assert not (out / "extractions").exists()
    with pytest.raises(PersonalensError, match=r"personalbench.until: 'reading', expected one of \['read', 'extract'"):
        command.run(config(f"run.out_dir={tmp_path}", "personalbench.until=reading"), no_model)
