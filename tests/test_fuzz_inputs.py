"""Seeded fuzz of the data reader through the real CLI: mutated copies of data/sample, each checked
by `personalens validate` (and a few by `stats`) in its own subprocess with a timeout.

Each outcome is classified: clean error (rc != 0, a message naming the file, no traceback), warning
(rc 0, a named warning), accepted (rc 0, and then the counts must equal the unmutated sample's),
traceback, hang. The test prints the table and fails on any traceback, hang or silent count change."""

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

REPO = Path(__file__).resolve().parents[1]
SEED = 22
MUTATIONS = 200
TIMEOUT_S = 60
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
            "not json", "trailing comma",
        ]
    )  # fmt: skip
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
        return Outcome(mutation, "hang", f"no answer in {TIMEOUT_S} s")
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


def _run(args: list[str]) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(
            [sys.executable, "-m", "personalens.cli", *args],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return None


def test_seeded_mutations_of_the_sample_never_crash_hang_or_change_counts_silently(sample_root, tmp_path):
    clean = _run(["validate", str(sample_root)])
    assert clean is not None and clean.returncode == 0, clean
    expected = tuple(map(int, COUNTS.search(clean.stdout).groups()))
    rng = random.Random(SEED)
    cases = []
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
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda case: _run(case[1]), cases))
    outcomes = [_classify(name, result, expected) for (name, _), result in zip(cases, results)]
    table = Counter(o.kind for o in outcomes)
    print(f"\n{len(outcomes)} mutations (seed {SEED}): " + ", ".join(f"{k}: {n}" for k, n in sorted(table.items())))
    bad = [o for o in outcomes if o.kind in ("traceback", "hang", "silent change", "unnamed error")]
    assert not bad, "\n\n".join(f"{o.kind}: {o.mutation}\n{o.detail}" for o in bad[:8])
