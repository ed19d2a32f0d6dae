"""slurm/personalbench.sbatch on a real single-node SLURM cluster: an array of 2 user shards of
`personalbench run` on the bundled sample with the embedded model on the CPU, then `export` and
`score` in one job that depends on the whole array, as docs/personalbench.md says to run them.

Each array task loads vLLM, so this takes minutes; the cluster runs one job at a time."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import slurm_cluster
from personalbench_helpers import REPO, config

from personalens.personalbench.command import settings
from personalens.personalbench.pipeline import load_histories
from personalens.personalbench.stage import Shard
from personalens.store import read_table

pytestmark = [pytest.mark.slurm, pytest.mark.vllm]

SHARDS = 2
OVERRIDES = [
    "personalbench=quick",
    "progress=false",
    "personalbench.bootstrap=20",
    # no torch.compile: vLLM then starts in seconds instead of minutes on a small CPU
    "assistant.enforce_eager=true",
    "judge.enforce_eager=true",
]
# the sbatch file asks for a GPU node; a CPU-only cluster overrides that on the command line
CPU_ONLY = ["--gres=none", "--cpus-per-task=1", "--mem=2G"]
TIMEOUT = 1200  # seconds: two vLLM jobs of about a minute each here, then export and score


def sbatch(cluster: slurm_cluster.SlurmCluster, workdir: Path, *args: str) -> str:
    env = {**cluster.env, "PERSONALENS": str(Path(sys.executable).with_name("personalens"))}
    done = subprocess.run(
        ["sbatch", "--parsable", *args], env=env, cwd=workdir, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().split(";")[0]


def users_by_shard(out: Path, table: str) -> list[list[str]]:
    """Each shard's user ids in `table`, one entry per row (a user written twice appears twice)."""
    found = []
    for k in range(SHARDS):
        rows = read_table(out / table / f"shard-{k:03d}-of-{SHARDS:03d}")
        found.append([] if rows is None else rows.column("user_id").to_pylist())
    return found


def test_array_over_user_shards_then_export_and_score(cluster, tmp_path):
    out = tmp_path / "run"
    overrides = [*OVERRIDES, f"run.out_dir={out}"]
    array = sbatch(
        cluster,
        tmp_path,
        f"--array=0-{SHARDS - 1}",
        *CPU_ONLY,
        str(REPO / "slurm" / "personalbench.sbatch"),
        *overrides,
    )
    # export and score read every shard's files: one job once the whole array has succeeded
    quoted = " ".join(f"'{o}'" for o in overrides)
    after = sbatch(
        cluster,
        tmp_path,
        f"--dependency=afterok:{array}",
        "--kill-on-invalid-dep=yes",
        *CPU_ONLY,
        "--job-name=pl-pb-score",
        "--output=%x-%j.log",
        f'--wrap=set -e; "$PERSONALENS" personalbench export {quoted}; "$PERSONALENS" personalbench score {quoted}',
    )
    states = cluster.wait([array, after], TIMEOUT)
    logs = cluster.job_logs(tmp_path)
    assert states == {f"{array}_0": "COMPLETED", f"{array}_1": "COMPLETED", after: "COMPLETED"}, f"{states}\n{logs}"

    # the users a single process selects, read the same way (no model needed for that)
    single, _, _ = load_histories(settings(config(*overrides)), Shard(out / "personalbench"))
    expected = sorted(h.user_id for h in single)
    assert len(expected) == 3
    pb = out / "personalbench"
    extracted = users_by_shard(pb, "extractions")
    assert all(extracted) and not set(extracted[0]) & set(extracted[1]), extracted
    assert sorted(u for shard in extracted for u in shard) == expected  # each user once, in one shard
    pairs = users_by_shard(pb, "pairs")
    assert [set(p) for p in pairs] == [set(e) for e in extracted]
    preferences = Counter(u for shard in users_by_shard(pb, "preferences") for u in shard)
    assert preferences == Counter(u for shard in pairs for u in shard), logs  # every pair judged once
    assert len(list((pb / "input").glob("shard-*.json"))) == SHARDS

    assert {"attributes.csv", "relevance.csv", "preference.csv"} <= {p.name for p in (pb / "sheets").iterdir()}
    report = (pb / "report" / "report.md").read_text()
    assert "PersonalBench relevance selection" in report, logs
    counts = (pb / "report" / "counts.csv").read_text()
    assert "users kept,3" in counts, counts  # the users of both shards, counted once each
