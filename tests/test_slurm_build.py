"""slurm/build.sbatch on a real single-node SLURM cluster: the three phases its header documents
(tasks, then the users array over 2 shards once tasks succeeded, then assemble), submitted with
sbatch as a user would on a CPU-only cluster, building the bundled sample on the embedded model.

The tasks job and each users shard load vLLM on the CPU (tens of seconds each here); assemble loads no
model. The cluster runs one job at a time."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import slurm_cluster

from personalens.store import read_table

SHARDS = 2
REPO = Path(__file__).resolve().parents[1]
PERSONALENS = str(Path(sys.executable).with_name("personalens"))
# the smallest build that still has every stage: 2 users (one per shard), 1 task per domain, 1 MD task;
# no torch.compile, so that vLLM starts in seconds instead of minutes on a small CPU
OVERRIDES = [
    "datagen=quick",
    "datagen.users=2",
    "datagen.tasks.sd_per_domain=1",
    "datagen.tasks.md_count=1",
    "datagen.consistency.max_regenerations=1",
    "builder.enforce_eager=true",
    "progress=false",
]
# CPU only: no GPU request, and resources a 2-core test node has
RESOURCES = ["--gres=none", "--cpus-per-task=1", "--mem=2G"]
TIMEOUT = 1800  # seconds for the three phases: three vLLM jobs of about a minute each here


def sbatch(cluster: slurm_cluster.SlurmCluster, workdir: Path, phase: str, *flags: str) -> str:
    """Submit one phase the way the header of slurm/build.sbatch does; returns the job id."""
    out = cluster.run(
        "sbatch",
        "--parsable",
        f"--export=ALL,PHASE={phase},PERSONALENS={PERSONALENS}",
        *RESOURCES,
        *flags,
        str(REPO / "slurm" / "build.sbatch"),
        *OVERRIDES,
        f"datagen.out_dir={workdir / 'data'}",
        cwd=workdir,
    )
    return out.strip().split(";")[0]


@pytest.mark.slurm
@pytest.mark.vllm
def test_build_phases_on_slurm_assemble_a_valid_data_root_from_both_shards(cluster, tmp_path):
    tasks = sbatch(cluster, tmp_path, "tasks")
    users = sbatch(
        cluster,
        tmp_path,
        "users",
        f"--dependency=afterok:{tasks}",
        "--kill-on-invalid-dep=yes",
        f"--array=0-{SHARDS - 1}",
        "--output=%x-%A_%a.log",
    )
    assemble = sbatch(cluster, tmp_path, "assemble", f"--dependency=afterok:{users}", "--kill-on-invalid-dep=yes")
    states = cluster.wait([tasks, users, assemble], TIMEOUT)
    logs = cluster.job_logs(tmp_path, tmp_path / "data" / "logs")
    assert states == {
        tasks: "COMPLETED",
        f"{users}_0": "COMPLETED",
        f"{users}_1": "COMPLETED",
        assemble: "COMPLETED",
    }, f"{states}\n{logs}"
    # each job's log is named after its job (and array task), as the header says
    assert {p.name for p in tmp_path.glob("*.log")} == {
        f"pl-build-{tasks}.log",
        f"pl-build-{users}_0.log",
        f"pl-build-{users}_1.log",
        f"pl-build-{assemble}.log",
    }, logs

    data = tmp_path / "data"
    # each shard made its own user's profile stages, and only the tasks job made the shared tasks
    for k in range(SHARDS):
        rows = read_table(data / "build" / "interests" / f"shard-{k:03d}-of-{SHARDS:03d}").to_pylist()
        assert {r["key"] for r in rows} == {f'["user{k}"]'}, logs
    assert [p.name for p in (data / "build" / "sd_tasks").iterdir()] == ["shard-000-of-001"], logs

    # the assembled root holds both shards' users and validates with no problems
    done = subprocess.run(
        [PERSONALENS, "validate", str(data)], env=cluster.env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}\n{logs}"
    assert done.stdout.strip().splitlines()[-1].startswith(f"{data}: OK; 2 users,"), done.stdout
    assert sorted(p.name for p in (data / "profile").iterdir()) == ["user0", "user1"]
    # the assemble job's log holds its results: the validate line and the new data's tables
    assembled = (tmp_path / f"pl-build-{assemble}.log").read_text()
    assert f"{data}: OK; 2 users," in assembled and "### Table 1" in assembled, logs
