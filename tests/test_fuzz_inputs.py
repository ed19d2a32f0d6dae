"""Seeded fuzz of the data reader through the real CLI: mutated copies of data/sample, each checked
by `personalens validate` (and a few by `stats`) in its own subprocess with a timeout, and every
tenth also by `personalens run`.

Each outcome is classified: clean error (rc != 0, a message naming the file, no traceback), warning
(rc 0, a named warning), accepted (rc 0, and then the counts must equal the unmutated sample's),
traceback, hang. The test prints the table and fails on any traceback, hang or silent count change.

`run` reads the same root through the loader every command uses, then loads vLLM and the model,
which costs a minute per run on a small CPU: far too much for 200 mutations. So `run` goes as far as
the model load and no further: its process has vLLM made unimportable (NO_VLLM), and the first
import of vLLM, the first thing an engine does, ends it with status 97. A mutation that validate
refuses must make `run` fail with the same kind of clean error before that point (the model is never
loaded for bad data); one that validate accepts must bring `run` to that point (the run's config is
checked, its layout planned, its data loaded and its config saved). What comes after (prompts
rendered and sent to the model) is exercised on the sample by the real-vLLM tests. A tenth of the
mutations rather than all keeps this test near its former ~100 s on a 2-core CI machine: a `run`
process up to the model costs about 2.1 s of CPU, a `validate` 0.8 s."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import subprocess
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from personalens.personalbench.wildchat import COLUMNS as READ_COLUMNS  # the columns the reader uses

REPO = Path(__file__).resolve().parents[1]
SEED = 22
MUTATIONS = 120
THROUGH_RUN = 10  # every 10th mutation also through `run`
TIMEOUT_S = 60
# `python -c NO_VLLM ARGS...` is `personalens ARGS...` in which importing vLLM ends the process with
# status REACHED_MODEL (an engine imports it first thing, before loading its model)
REACHED_MODEL = 97
NO_VLLM = f"""
import os, sys

class NoVllm:
    def find_spec(self, name, path=None, target=None):
        if name == "vllm" or name.startswith("vllm."):
            os._exit({REACHED_MODEL})

sys.meta_path.insert(0, NoVllm())
from personalens.cli import main
main(sys.argv[1:])
"""
COUNTS = re.compile(r"(\d+) users, (\d+) single-domain and (\d+) multi-domain scenarios")


@dataclass(frozen=True)
class Outcome:
    mutation: str
    kind: str  # clean error, warning, accepted, traceback, hang, silent change
    detail: str


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in (".json", ".jsonl"))


def _paths(value, prefix=()):
    """Every field path below the top level of a JSON value (objects' keys and list items)."""
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    else:
        return
    for key, child in items:
        yield (*prefix, key)
        yield from _paths(child, (*prefix, key))


def _at(value, path):
    for key in path:
        value = value[key]
    return value


def _mutate_field(rng: random.Random, path: Path) -> str | None:
    """A wrong type, a renamed key or a deleted key at a random field path of a JSON file (not a
    top-level key, whose loss is a legitimate change of data)."""
    if path.suffix != ".json":
        return None
    obj = json.loads(path.read_text())
    deep = [p for p in _paths(obj) if len(p) >= 2]
    if not deep:
        return None
    field = rng.choice(deep)
    parent = _at(obj, field[:-1])
    how = rng.choice(["type", "rename", "delete"] if isinstance(parent, dict) else ["type"])
    if how == "type":
        parent[field[-1]] = rng.choice([None, 7, 1.5, True, "text", [], {}, [1, "x"]])
    elif how == "rename":
        parent[f"{field[-1]}_renamed"] = parent.pop(field[-1])
    else:
        del parent[field[-1]]
    path.write_text(json.dumps(obj))
    return f"{how} {'/'.join(map(str, field))}"


def _mutate(rng: random.Random, root: Path) -> str:
    """Apply one mutation to the copy at root; its description."""
    path = rng.choice(_files(root))
    rel = path.relative_to(root)
    data = path.read_bytes()
    how = rng.choice(
        [
            "truncate", "empty", "directory", "crlf", "blank lines", "nan", "infinity", "field", "field",
            "field", "bom", "surrogate", "nesting", "long int", "bad utf8", "fifo", "u2028", "duplicate",
            "not json", "trailing comma", "latin-1 folder",
        ]
    )  # fmt: skip
    if how == "latin-1 folder":  # a task folder named in Latin-1, not UTF-8, holding a task file
        folder = root / "task" / os.fsdecode("Caf\u00e9".encode("latin-1"))
        folder.mkdir()
        shutil.copy(next((root / "task").glob("*/task.jsonl")), folder / "task.jsonl")
        return "latin-1 folder task/Caf\\xe9"
    if how == "truncate":
        path.write_bytes(data[: rng.randrange(1, max(2, len(data) - 1))])
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "directory":
        path.unlink()
        path.mkdir()
    elif how == "crlf":
        path.write_bytes(data.replace(b"\n", b"\r\n"))
    elif how == "blank lines":
        path.write_bytes(data.replace(b"\n", b"\n\n  \n"))
    elif how in ("nan", "infinity"):
        word = b"NaN" if how == "nan" else b"-Infinity"
        path.write_bytes(re.sub(rb":\s*\"[^\"]*\"", b": " + word, data, count=1))
    elif how == "field":
        done = _mutate_field(rng, path)
        how = done or "unchanged (no field)"
    elif how == "bom":
        path.write_bytes(b"\xef\xbb\xbf" + data)
    elif how == "surrogate":
        path.write_bytes(re.sub(rb":\s*\"", lambda m: m.group(0) + rb"\ud800", data, count=1))
    elif how == "nesting":
        path.write_bytes(b"[" * 50_000 + b"]" * 50_000)
    elif how == "long int":
        path.write_bytes(re.sub(rb":\s*\"[^\"]*\"", b": " + b"9" * 5000, data, count=1))
    elif how == "bad utf8":
        cut = rng.randrange(len(data))
        path.write_bytes(data[:cut] + b"\xff\xfe" + data[cut:])
    elif how == "fifo":
        path.unlink()
        os.mkfifo(path)
    elif how == "u2028":
        path.write_bytes(re.sub(rb":\s*\"", lambda m: m.group(0) + "\u2028".encode(), data, count=1))
    elif how == "duplicate":
        path.write_bytes(re.sub(rb"\{\s*(\"[^\"]*\")\s*:", rb"{\1: 0, \1:", data, count=1))
    elif how == "not json":
        path.write_bytes(b"this is not json\n")
    else:
        path.write_bytes(re.sub(rb"\}\s*$", b",}", data.rstrip(), count=1))
    return f"{how} in {rel}"


def _classify(mutation: str, result: subprocess.CompletedProcess | None, expected: tuple) -> Outcome:
    if result is None:
        return Outcome(mutation, "hang", f"no answer in {TIMEOUT_S} s, nor alone in {3 * TIMEOUT_S} s")
    text = result.stdout + result.stderr
    if "Traceback" in text:
        return Outcome(mutation, "traceback", result.stderr[-1500:])
    if result.returncode != 0:
        named = re.search(r"(profile|task)/", text) is not None
        return Outcome(mutation, "clean error" if named else "unnamed error", text[-300:])
    counts = COUNTS.search(result.stdout)
    if mutation.startswith("stats"):  # stats prints tables, not validate's counts
        return Outcome(mutation, "warning" if "warning:" in text else "accepted", "")
    if counts is None or tuple(map(int, counts.groups())) != expected:
        if "warning:" in text:
            return Outcome(mutation, "warning", text[-300:])
        return Outcome(mutation, "silent change", f"counts {counts and counts.groups()} != {expected}")
    return Outcome(mutation, "warning" if "warning:" in text else "accepted", "")


def _classify_run(mutation: str, result: subprocess.CompletedProcess | None, validated: Outcome) -> Outcome:
    """`run` (without vLLM) against validate's verdict on the same root: refused the same way, before
    the model, or brought to the model load."""
    if result is None:
        return Outcome(mutation, "hang", f"no answer in {TIMEOUT_S} s, nor alone in {3 * TIMEOUT_S} s")
    text = result.stdout + result.stderr
    if "Traceback" in text or "failed:" in text:  # an unexpected exception: its traceback is in the log file
        return Outcome(mutation, "traceback", text[-1500:])
    refused = validated.kind in ("clean error", "unnamed error")
    if result.returncode == REACHED_MODEL:
        kind = "reached the model" if not refused else "loads a model for data validate refused"
        return Outcome(mutation, kind, text[-300:])
    if result.returncode == 2 and re.search(r"error: .*(profile|task)/", text, re.S):
        return Outcome(mutation, "clean error" if refused else "refused what validate accepted", text[-300:])
    return Outcome(mutation, "unnamed error", text[-300:])


def _run(
    args: list[str], timeout: float = TIMEOUT_S, no_vllm: bool = False, **kwargs
) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(
            [sys.executable, *(["-c", NO_VLLM] if no_vllm else ["-m", "personalens.cli"]), *args],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            **kwargs,
        )
    except subprocess.TimeoutExpired:
        return None


def test_seeded_mutations_of_the_sample_never_crash_hang_or_change_counts_silently(sample_root, tmp_path):
    clean = _run(["validate", str(sample_root)])
    assert clean is not None and clean.returncode == 0, clean
    expected = tuple(map(int, COUNTS.search(clean.stdout).groups()))
    rng = random.Random(SEED)
    cases, runs = [], []
    for i in range(MUTATIONS):
        root = tmp_path / f"m{i:03d}"
        shutil.copytree(sample_root, root)
        mutation = _mutate(rng, root)
        # every 25th through `stats` instead, which writes tables (the surrogate crash was there)
        command = (
            ["stats", str(root), f"run.out_dir={tmp_path / f'stats{i:03d}'}"]
            if i % 25 == 0
            else ["validate", str(root)]
        )
        cases.append((f"{command[0]}: {mutation}", command))
        if i % THROUGH_RUN == 1:
            run = ["run", str(root), "protocol=quick", f"run.out_dir={tmp_path / f'run{i:03d}'}", "progress=false"]
            runs.append((len(cases) - 1, f"run: {mutation}", run))
    calls = [(case[1], False) for case in cases] + [(case[2], True) for case in runs]
    with ThreadPoolExecutor(max_workers=4) as pool:
        answers = list(pool.map(lambda call: _run(call[0], no_vllm=call[1]), calls))
    # a command that timed out beside the others (a loaded CI machine) runs again alone, with more time:
    # a hang is one that does not end either way
    answers = [_run(a, 3 * TIMEOUT_S, no_vllm=n) if r is None else r for (a, n), r in zip(calls, answers)]
    results, ran = answers[: len(cases)], answers[len(cases) :]
    outcomes = [_classify(name, result, expected) for (name, _), result in zip(cases, results)]
    outcomes += [_classify_run(name, result, outcomes[index]) for (index, name, _), result in zip(runs, ran)]
    table = Counter(o.kind for o in outcomes)
    print(f"\n{len(outcomes)} outcomes (seed {SEED}): " + ", ".join(f"{k}: {n}" for k, n in sorted(table.items())))
    assert {"clean error", "reached the model"} <= {o.kind for o in outcomes if o.mutation.startswith("run:")}
    good = ("clean error", "warning", "accepted", "reached the model")
    bad = [o for o in outcomes if o.kind not in good]
    assert not bad, "\n\n".join(f"{o.kind}: {o.mutation}\n{o.detail}" for o in bad[:8])


READS_DATA = ["validate", "stats", "plan", "merge", "generate", "judge", "run", "consistency", "agreement export"]


@pytest.mark.parametrize("command", READS_DATA)
def test_a_task_folder_named_in_latin1_is_a_clean_error_in_every_command(command, sample_root, tmp_path):
    root = tmp_path / "data"
    shutil.copytree(sample_root, root)
    folder = root / "task" / os.fsdecode("Caf\u00e9".encode("latin-1"))  # b"Caf\xe9"
    folder.mkdir()
    shutil.copy(root / "task" / "Alarm" / "task.jsonl", folder / "task.jsonl")
    out = tmp_path / "out"
    args = [*command.split(), f"data.root={root}", f"run.out_dir={out}", "progress=false"]
    if command in ("judge", "agreement export"):  # they read the data for the dialogues of a run: one dialogue
        from run_rows import dialogue_row

        from personalens.data import load_scenarios
        from personalens.store import DIALOGUE_SCHEMA, PartWriter, shard_dir

        s = load_scenarios(sample_root, "0", "SD")[0]
        row = dialogue_row(s.user.user_id, s.task.task_id, "SD", list(s.task.domains), user_index=0)
        PartWriter(shard_dir(out, "dialogues", 0, 1), DIALOGUE_SCHEMA).write([row])
        args += [f"agreement.out_dir={tmp_path / 'sheets'}", "agreement.dialogues=1"] if "agreement" in command else []
    result = _run(args, no_vllm=True)
    assert result is not None, "no answer"
    text = result.stdout + result.stderr
    assert "Traceback" not in text and "failed:" not in text, text
    assert result.returncode not in (0, REACHED_MODEL), text  # refused, and before any model loads
    assert "task/Caf\\xe9/: the folder name is not UTF-8" in text, text


# ---- PersonalBench: the WildChat reader and the prompts file, up to reading (no model) -----------

PB_MUTATIONS = 64  # every kind twice
PB_SAMPLE = REPO / "data" / "personalbench"
WILDCHAT = re.compile(r"wildchat: (\d+) files, (\d+) records, (\d+) conversations read, (\d+) bad records skipped")
UNREADABLE = re.compile(r"(\d+) x unreadable file")
PROMPTS = re.compile(r"until=read: (\d+) users, (\d+) prompts read")
SHARD_KINDS = [
    "truncate", "empty", "not parquet", "directory", "fifo", "column type", "nested type", "rename column",
    "drop column", "null column", "null value", "nested null", "bad utf8", "timestamp range",
]  # fmt: skip
PROMPT_KINDS = [
    "truncate", "empty", "directory", "fifo", "bad utf8", "not json", "bom", "crlf", "blank lines", "u2028",
    "duplicate key", "surrogate", "nesting", "long int", "delete key", "rename key", "wrong type", "same id",
]  # fmt: skip


def _rows_mutation(rng: random.Random, table, how: str):
    """`table` with one column or value changed as `how` says; its description."""
    import pyarrow as pa

    names = table.column_names
    read = [c for c in names if c in READ_COLUMNS]
    name = rng.choice(read if read and rng.random() < 0.75 else names)  # mostly columns the reader uses
    index = names.index(name)
    n = table.num_rows
    if how == "column type":  # every value of a column replaced by another type
        kind = rng.choice(["int", "string", "list"])
        values = (
            pa.array(range(n), pa.int64())
            if kind == "int"
            else pa.array([f"x{i}" for i in range(n)])
            if kind == "string"
            else pa.array([[i] for i in range(n)], pa.list_(pa.int64()))
        )
        return table.set_column(index, name, values), f"{name} as {kind}"
    if how == "rename column":
        return table.rename_columns([f"{c}_renamed" if c == name else c for c in names]), name
    if how == "drop column":
        return table.drop_columns([name]), name
    if how == "null column":
        return table.set_column(index, name, pa.nulls(n, table.schema.field(name).type)), name
    if how == "bad utf8":  # a string column's value that is not UTF-8 (Arrow does not check a view)
        strings = [c for c in read if pa.types.is_string(table.schema.field(c).type)]
        name = rng.choice(strings)
        values = table.column(name).to_pylist()
        row = rng.randrange(n)
        raw = [None if v is None else v.encode() for v in values]
        raw[row] = (raw[row] or b"") + b"\xff\xfe"
        column = pa.array(raw, pa.binary()).view(pa.string())
        return table.set_column(names.index(name), name, column), f"{name} row {row}"
    if how == "timestamp range":  # past Python's datetime range
        row = rng.randrange(n)
        field = table.schema.field("timestamp")
        ints = table.column("timestamp").cast(pa.int64()).to_pylist() if pa.types.is_timestamp(field.type) else [0] * n
        ints[row] = 2**62
        column = pa.array(ints, pa.int64()).cast(pa.timestamp("us", tz="UTC"))
        return table.set_column(names.index("timestamp"), "timestamp", column), f"row {row}"
    rows = table.to_pylist()
    row = rng.randrange(n)
    if how == "null value":
        rows[row][name] = None
        return pa.Table.from_pylist(rows, schema=table.schema), f"{name} row {row}"
    messages = [(i, m) for i, r in enumerate(rows) for m in r["conversation"] or [] if isinstance(m, dict)]
    if not messages:
        return table, "unchanged (no message)"
    _, message = rng.choice(messages)
    key = rng.choice(["role", "content", "turn_identifier", "header"])
    if how == "nested null":
        message[key] = None
        return pa.Table.from_pylist(rows, schema=table.schema), f"conversation.{key}"
    # nested type: one message field of every row takes another type
    for r in rows:
        for m in r["conversation"] or []:
            if isinstance(m, dict):
                m[key] = {"role": 3, "content": 1.5, "turn_identifier": "x", "header": "h"}[key]
    return pa.Table.from_pylist(rows), f"conversation.{key}"


def _mutate_shard(rng: random.Random, path: Path, how: str) -> str:
    import pyarrow.parquet as pq

    data = path.read_bytes()
    if how == "truncate":
        path.write_bytes(data[: rng.randrange(1, len(data) - 1)])
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "not parquet":
        path.write_bytes(b"this is not parquet\n")
    elif how == "directory":
        path.unlink()
        path.mkdir()
    elif how == "fifo":
        path.unlink()
        os.mkfifo(path)
    else:
        table, detail = _rows_mutation(rng, pq.read_table(path), how)
        pq.write_table(table, path)
        how = f"{how} {detail}"
    return f"{how} in {path.name}"


def _mutate_prompts(rng: random.Random, path: Path, how: str) -> str:
    data = path.read_bytes()
    lines = data.splitlines(keepends=True)
    if how == "truncate":  # inside a line, so that its JSON object is cut
        k = rng.randrange(len(lines))
        path.write_bytes(b"".join(lines[:k]) + lines[k][: rng.randrange(1, len(lines[k].rstrip()) - 1)])
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "directory":
        path.unlink()
        path.mkdir()
    elif how == "fifo":
        path.unlink()
        os.mkfifo(path)
    elif how == "bad utf8":
        cut = rng.randrange(len(data))
        path.write_bytes(data[:cut] + b"\xff\xfe" + data[cut:])
    elif how == "not json":
        path.write_bytes(b"this is not json\n")
    elif how == "bom":
        path.write_bytes(b"\xef\xbb\xbf" + data)
    elif how == "crlf":
        path.write_bytes(data.replace(b"\n", b"\r\n"))
    elif how == "blank lines":
        path.write_bytes(data.replace(b"\n", b"\n\n  \n"))
    elif how == "u2028":
        path.write_bytes(data.replace(b'"text": "', '"text": "\u2028'.encode(), 1))
    elif how == "duplicate key":
        path.write_bytes(data.replace(b'{"prompt_id"', b'{"prompt_id": "dup", "prompt_id"', 1))
    elif how == "surrogate":
        path.write_bytes(data.replace(b'"text": "', b'"text": "\\ud800', 1))
    elif how == "nesting":
        path.write_bytes(b"[" * 50_000 + b"]" * 50_000 + b"\n")
    elif how == "long int":
        path.write_bytes(re.sub(rb'"prompt_id": "[^"]*"', b'"prompt_id": ' + b"9" * 5000, data, count=1))
    elif how in ("delete key", "rename key", "wrong type"):
        k = rng.randrange(len(lines))
        item = json.loads(lines[k])
        key = rng.choice(sorted(item))
        if how == "delete key":
            del item[key]
        elif how == "rename key":
            item[f"{key}_renamed"] = item.pop(key)
        else:
            item[key] = rng.choice([None, 1.5, True, [], {}, "yes"] if key == "sensitive" else [None, 1.5, [], {}])
        lines[k] = json.dumps(item).encode() + b"\n"
        path.write_bytes(b"".join(lines))
        how = f"{how} {key} line {k + 1}"
    else:  # same id: a line repeated
        path.write_bytes(data + lines[rng.randrange(len(lines))])
    return f"{how} in {path.name}"


def _counts(text: str) -> tuple[tuple[int, ...], int, int] | None:
    read, prompts = WILDCHAT.search(text), PROMPTS.search(text)
    if read is None or prompts is None:
        return None
    unreadable = sum(int(n) for n in UNREADABLE.findall(text))
    return tuple(map(int, read.groups())), unreadable, int(prompts[2])


def _classify_read(mutation: str, target: str, result, baseline) -> Outcome:
    """clean error (rc != 0 naming the file), bad records counted (more skipped records, or an
    unreadable shard, each named), accepted (the counts of the sample, or more conversations),
    silent change (fewer conversations or prompts with nothing counted), unnamed error, traceback, hang."""
    if result is None:
        return Outcome(mutation, "hang", f"no answer in {TIMEOUT_S} s, nor alone in {3 * TIMEOUT_S} s")
    text = result.stdout + result.stderr
    if "Traceback" in text:
        return Outcome(mutation, "traceback", text[-1500:])
    if result.returncode != 0:
        return Outcome(mutation, "clean error" if target in text else "unnamed error", text[-300:])
    counts = _counts(text)
    if counts is None:
        return Outcome(mutation, "silent change", f"no counts printed: {text[-300:]}")
    (files, rows, conversations, bad), unreadable, prompts = counts
    (_, rows0, conversations0, bad0), _, prompts0 = baseline
    if prompts != prompts0:
        return Outcome(mutation, "silent change", f"{prompts} prompts read, not {prompts0}")
    if (conversations < conversations0 or rows < rows0) and bad <= bad0 and not unreadable:
        return Outcome(mutation, "silent change", text[-600:])
    if bad > bad0 or unreadable:
        named = target in text
        return Outcome(mutation, "bad records counted" if named else "unnamed error", text[-300:])
    return Outcome(mutation, "warning" if "warning:" in text else "accepted", "")


def test_seeded_mutations_of_wildchat_shards_and_prompts_never_crash_hang_or_lose_records(tmp_path):
    """The PersonalBench reader up to extraction (`personalbench.until=read`, no model) on mutated
    copies of the bundled WildChat-format shards and prompts file."""

    def command(root: Path, out: Path) -> list[str]:
        return [
            "personalbench",
            "run",
            "personalbench.until=read",
            f"personalbench.input=[{root / 'wildchat-sample' / 'data'}/train-*.parquet]",
            f"personalbench.prompts_file={root / 'prompts.jsonl'}",
            f"run.out_dir={out}",
            "progress=false",
        ]

    clean = _run(command(PB_SAMPLE, tmp_path / "clean"))
    assert clean is not None and clean.returncode == 0, clean
    baseline = _counts(clean.stdout + clean.stderr)
    assert baseline is not None, clean.stderr
    rng = random.Random(SEED)
    kinds = []
    while len(kinds) < PB_MUTATIONS:  # every kind in each round, in a seeded order
        batch = [("shard", k) for k in SHARD_KINDS] + [("prompts", k) for k in PROMPT_KINDS]
        rng.shuffle(batch)
        kinds += batch
    cases = []
    for i, (target, how) in enumerate(kinds[:PB_MUTATIONS]):
        root = tmp_path / f"pb{i:03d}"
        shutil.copytree(PB_SAMPLE, root, ignore=shutil.ignore_patterns("annotations", "*.py"))
        if target == "shard":
            # mostly the first shard: 23 rows; the second holds one row, already a bad record
            shards = sorted((root / "wildchat-sample" / "data").glob("*.parquet"))
            path = shards[0] if rng.random() < 0.75 else rng.choice(shards)
            mutation = _mutate_shard(rng, path, how)
        else:
            path = root / "prompts.jsonl"
            mutation = _mutate_prompts(rng, path, how)
        cases.append((mutation, path.name, command(root, tmp_path / f"out{i:03d}")))
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda case: _run(case[2]), cases))
    # a run that timed out beside the others (a loaded CI machine) runs again alone, with more time:
    # a hang is a run that does not end either way
    results = [_run(case[2], timeout=3 * TIMEOUT_S) if r is None else r for case, r in zip(cases, results)]
    outcomes = [_classify_read(m, target, r, baseline) for (m, target, _), r in zip(cases, results)]
    table = Counter(o.kind for o in outcomes)
    print(f"\n{len(outcomes)} mutations (seed {SEED}): " + ", ".join(f"{k}: {n}" for k, n in sorted(table.items())))
    for o in outcomes:
        print(f"  {o.kind}: {o.mutation}")
    bad = [o for o in outcomes if o.kind in ("traceback", "hang", "silent change", "unnamed error")]
    assert not bad, "\n\n".join(f"{o.kind}: {o.mutation}\n{o.detail}" for o in bad[:8])


# ---- permission denied ---------------------------------------------------------------------------

CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, PR_CAPBSET_DROP = 1, 2, 24


def _without_root_file_access() -> None:
    """preexec_fn: as root, drop the two capabilities that let root read any file whatever its mode
    (from the bounding set, so the exec'd CLI never has them). The process stays uid 0, so it still
    reaches the interpreter and packages that only root may read (a pyenv under /root, mode 0700),
    where switching to `nobody` could not even start Python."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def _unreadable(path: Path) -> dict:
    """chmod 000 `path`; the subprocess keyword arguments under which the CLI then cannot read it.
    Skips when that cannot be arranged."""
    path.chmod(0)
    kwargs = {"preexec_fn": _without_root_file_access} if os.geteuid() == 0 else {}
    try:
        probe = subprocess.run(
            [sys.executable, "-c", f"open({str(path)!r}, 'rb')"], capture_output=True, text=True, timeout=60, **kwargs
        )
    except (OSError, subprocess.SubprocessError) as err:
        pytest.skip(f"cannot run a process without root's file access here ({err})")
    if "PermissionError" not in probe.stderr:
        pytest.skip(f"a file of mode 000 stays readable here, even without CAP_DAC_OVERRIDE: {probe.stderr[-300:]}")
    return kwargs


@pytest.mark.parametrize("which", ["data root file", "prompts file", "wildchat shard"])
def test_a_file_that_cannot_be_read_for_its_permissions_is_named_not_a_crash(which, sample_root, tmp_path):
    if which == "data root file":
        root = tmp_path / "data"
        shutil.copytree(sample_root, root)
        target = root / "profile" / "user0" / "tasks.json"
        args = ["validate", str(root)]
    else:
        root = tmp_path / "pb"
        shutil.copytree(PB_SAMPLE, root, ignore=shutil.ignore_patterns("annotations", "*.py"))
        shards = root / "wildchat-sample" / "data"
        target = root / "prompts.jsonl" if which == "prompts file" else shards / "train-00000-of-00002.parquet"
        args = [
            "personalbench",
            "run",
            "personalbench.until=read",
            f"personalbench.input=[{shards}/train-*.parquet]",
            f"personalbench.prompts_file={root / 'prompts.jsonl'}",
            f"run.out_dir={tmp_path / 'out'}",
            "progress=false",
        ]
    result = _run(args, **_unreadable(target))
    assert result is not None, "no answer"
    text = result.stdout + result.stderr
    assert "Traceback" not in text, text
    if which == "wildchat shard":  # an unreadable shard is counted and named, as a damaged one is
        assert result.returncode == 0, text
        assert re.search(rf"1 x unreadable file \(first: {re.escape(str(target))}: .*Permission denied", text), text
    else:
        assert result.returncode != 0
        name = "profile/user0/tasks.json" if which == "data root file" else str(target)
        assert re.search(rf"{re.escape(name)}: (line \d+ )?.*Permission denied", text), text
