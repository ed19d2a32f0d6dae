"""The dialogues shown in report.html's browser: their turns with the judge's scores and explanations
(model@judge's, where a judge panel scored the run).

A seeded sample when the runs hold more than `limit` dialogues, so that the page stays small enough
to open; only the sampled dialogues' text is read (the keys are read first, then the chosen rows)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from personalens.config.saved import read_judges
from personalens.store import KEY_COLUMNS
from personalens.store.results import part_files

# what identifies a dialogue within the runs of one report (a run may hold several models)
_KEY = ("run_id", *KEY_COLUMNS, "assistant_model")
_DIALOGUE_FIELDS = (*_KEY, "user_index", "kind", "domains", "rounds", "ended", "turns")
_JUDGMENT_FIELDS = (*_KEY, "dimension", "speaker", "turn", "score", "parsed", "judge_text")


@dataclass(frozen=True)
class Browsable:
    dialogues: tuple[dict, ...]  # JSON-ready: ids, kind, domains, turns, judgments
    total: int  # dialogues in the runs


def browsable(run_dirs: Sequence[Path], limit: int, seed: int) -> Browsable:
    keys = [
        (i, key)
        for i, run_dir in enumerate(run_dirs)
        for key in _dataset(run_dir, "dialogues").to_table(columns=list(_KEY)).to_pylist()
    ]
    keys.sort(key=lambda k: (k[0], tuple(str(k[1][c]) for c in _KEY)))
    total = len(keys)
    if total > limit:
        chosen = np.random.default_rng(seed).choice(len(keys), limit, replace=False)
        keys = [keys[i] for i in sorted(chosen)]
    wanted: dict[int, set[tuple]] = defaultdict(set)
    for i, key in keys:
        wanted[i].add(tuple(key[c] for c in _KEY))
    out = []
    for i, run_dir in enumerate(run_dirs):
        if wanted[i]:
            out += _read(run_dir, wanted[i])
    out.sort(key=lambda d: (d["model"], d["setting"], d["kind"] != "SD", d["user_index"], d["task"], d["trial"]))
    return Browsable(tuple(out), total)


def _dataset(run_dir: Path, table: str) -> ds.Dataset:
    files = [str(p) for p in part_files(Path(run_dir) / table)]
    # parts written before a column was added (judge_key) read as null in it
    schema = pa.unify_schemas([pq.read_schema(f) for f in files], promote_options="permissive")
    return ds.dataset(files, schema=schema, format="parquet")


def _model_judge(run_dir: Path, dataset: ds.Dataset) -> pc.Expression | None:
    """The rows of the run's model@judge (judge.yaml), where a judge panel wrote others beside them."""
    saved = read_judges(run_dir).get("judge")
    if "judge_key" not in dataset.schema.names or saved is None:
        return None
    return pc.field("judge_key").is_null() | (pc.field("judge_key") == saved.fingerprint)


def _read(run_dir: Path, wanted: set[tuple]) -> list[dict]:
    users = sorted({k[1] for k in wanted})
    # the user filter keeps the read small; the exact key is checked below
    near = pc.field("user_id").isin(users)
    judged: dict[tuple, list[dict]] = defaultdict(list)
    judgments = _dataset(run_dir, "judgments")
    ours = _model_judge(run_dir, judgments)
    for j in judgments.to_table(
        columns=list(_JUDGMENT_FIELDS), filter=near if ours is None else near & ours
    ).to_pylist():
        key = tuple(j[c] for c in _KEY)
        if key in wanted:
            judged[key].append(
                {
                    "dimension": j["dimension"],
                    "speaker": j["speaker"] or "",
                    "turn": j["turn"],
                    "score": j["score"] if j["parsed"] else None,
                    "text": j["judge_text"] or "",
                }
            )
    rows = []
    for d in _dataset(run_dir, "dialogues").to_table(columns=list(_DIALOGUE_FIELDS), filter=near).to_pylist():
        key = tuple(d[c] for c in _KEY)
        if key in wanted:
            rows.append(
                {
                    "user_index": d["user_index"],
                    "model": d["assistant_model"],
                    "setting": d["setting"],
                    "kind": d["kind"],
                    "domains": list(d["domains"]),
                    "user": d["user_id"],
                    "task": d["task_id"],
                    "trial": d["trial"],
                    "rounds": d["rounds"],
                    "ended": d["ended"],
                    "turns": [{"role": t["role"], "text": t["text"]} for t in d["turns"] or ()],
                    "judgments": sorted(judged[key], key=lambda j: (j["turn"], j["dimension"], j["speaker"])),
                }
            )
    return rows
