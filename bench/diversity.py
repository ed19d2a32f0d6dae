"""How long `personalens diversity` takes on N synthetic dialogues (docs/performance.md).

Writes N dialogues in the dialogue schema (personalens/store/schema.py) to one Parquet file,
80% single-domain, 10-40 turns each alternating user / assistant, 5-80 words per turn drawn
from a Zipf-distributed vocabulary, then times reading it and computing Table 10.

    python bench/diversity.py --dialogues 100000 [--by-speaker] [--keep FILE]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from personalens.store import DIALOGUE_SCHEMA
from personalens.tables import render
from personalens.validation.diversity import Protocol
from personalens.validation.pipeline import build_diversity


def synthetic_dialogues(n: int, seed: int = 0, vocabulary: int = 50_000) -> pa.Table:
    rng = np.random.default_rng(seed)
    turns_per_dialogue = rng.integers(10, 41, size=n)
    words_per_turn = rng.integers(5, 81, size=int(turns_per_dialogue.sum()))
    words = np.array([f"w{i}" for i in range(vocabulary)], dtype=object)
    drawn = words[np.minimum(rng.zipf(1.3, size=int(words_per_turn.sum())), vocabulary) - 1].tolist()
    ends = np.cumsum(words_per_turn).tolist()
    texts = [" ".join(drawn[a:b]) for a, b in zip([0, *ends[:-1]], ends)]
    offsets = np.concatenate([[0], np.cumsum(turns_per_dialogue)]).astype(np.int32)
    position = np.arange(len(texts)) - np.repeat(offsets[:-1], turns_per_dialogue)
    roles = np.where(position % 2 == 0, "user", "assistant")
    zeros = pa.array(np.zeros(len(texts), dtype=np.int32))
    turns = pa.ListArray.from_arrays(
        pa.array(offsets),
        pa.StructArray.from_arrays(
            [pa.array(roles.tolist(), pa.string()), pa.array(texts, pa.string()), zeros, zeros],
            fields=list(DIALOGUE_SCHEMA.field("turns").type.value_type),
        ),
    )
    kinds = np.where(rng.random(n) < 0.8, "SD", "MD").tolist()
    columns = {f.name: pa.nulls(n, f.type) for f in DIALOGUE_SCHEMA}
    columns.update(
        kind=pa.array(kinds, pa.string()),
        turns=turns,
        user_id=pa.array([f"user{i % 1500}" for i in range(n)], pa.string()),
        task_id=pa.array([f"task-{i}" for i in range(n)], pa.string()),
    )
    return pa.table(columns, schema=DIALOGUE_SCHEMA)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dialogues", type=int, default=100_000)
    parser.add_argument("--by-speaker", action="store_true")
    parser.add_argument("--token-budget", type=int, default=Protocol.token_budget)
    parser.add_argument("--repeats", type=int, default=Protocol.repeats)
    parser.add_argument("--hypotheses", type=int, default=Protocol.hypotheses)
    parser.add_argument("--keep", type=Path, help="write the synthetic Parquet here (and reuse it if present)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        path = args.keep or Path(tmp) / "dialogues.parquet"
        if not path.exists():
            started = time.perf_counter()
            table = synthetic_dialogues(args.dialogues)
            pq.write_table(table, path)
            print(
                f"wrote {args.dialogues:,} dialogues, {len(table.column('turns').combine_chunks().flatten()):,} "
                f"turns, {path.stat().st_size / 2**20:.0f} MiB in {time.perf_counter() - started:.1f} s"
            )
        protocol = Protocol(args.token_budget, args.repeats, args.hypotheses)
        started, cpu = time.perf_counter(), time.process_time()
        result = build_diversity(path, protocol, args.by_speaker, Path(tmp) / "out")
        print(
            f"personalens diversity: {time.perf_counter() - started:.1f} s wall, {time.process_time() - cpu:.1f} s CPU"
        )
        print(render.markdown(result.tables))


if __name__ == "__main__":
    main()
