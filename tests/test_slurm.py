"""slurm/submit.sh on a real single-node SLURM cluster: the generate -> judge -> merge+report
chain over 2 shards of the bundled sample, judged by a panel of two judges (model@judge and a warm
one on the same engine), run with the embedded model on the CPU, on a cluster
without `kill_invalid_depend`: first with one shard's generate failing (its judge task is cancelled,
not left pending, and the chain ends with a report over the other shard that names the failed one
and why) and the other one's generate sent SLURM's warning signal mid-dialogue (it stops, requeues
itself and resumes from its stored turns), the missing shard's judgments named per judge, then the
failed shard alone resubmitted, after which the merged run holds exactly the selection under each
judge and the report shows it complete, with one Table 3 per judge.

Each generate/judge job loads vLLM, so this takes minutes; the cluster runs one job at a time."""

from __future__ import annotations

import csv
import os
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import slurm_cluster
from cli_helpers import read_rows

from personalens.data import load_scenarios

SHARDS = 2
USERS, KINDS = "0-1", "SD"  # one user per shard, 7 dialogues
# one round per dialogue (three turns: the signal lands in the second step, whose assistant replies
# take seconds here) and two judge dimensions: the chain is under test here, not the dialogues
OVERRIDES = [
    f"data.users={USERS}",
    f"data.kinds={KINDS}",
    "protocol=quick",
    "protocol.max_rounds_sd=1",
    "judging.dimensions=[task_completion,personalization]",
    "judges=[{name: warm, sampling: {temperature: 0.7}}]",
    "trials=1",
    "progress=false",
    # no torch.compile: vLLM then starts in seconds instead of minutes on a small CPU
    *(f"{role}.enforce_eager=true" for role in ("assistant", "user_agent", "judge")),
]
KEY_COLUMNS = ["user_id", "task_id", "setting", "trial"]
CHAIN_TIMEOUT = 1800  # seconds for one submitted chain: four vLLM jobs of one to two minutes each here


@pytest.fixture(scope="module")
def expected_keys(sample_root) -> list[tuple]:
    """The dialogues a single process would run: every selected scenario, default setting, trial 0."""
    return sorted((s.user.user_id, s.task.task_id, "base", 0) for s in load_scenarios(sample_root, USERS, KINDS))


def submit(
    cluster: slurm_cluster.SlurmCluster, workdir: Path, out_dir: Path, array: str | None = None
) -> dict[str, str]:
    """Run slurm/submit.sh as a user would on a CPU-only cluster; returns {stage: job id}."""
    env = {
        **cluster.env,
        "PERSONALENS": str(Path(sys.executable).with_name("personalens")),
        "GPUS": "0",
        "CPUS": "1",
        "MEM": "2G",
        "REPORT_CPUS": "1",
        "REPORT_MEM": "2G",
        "LOG_DIR": str(workdir / "logs"),
        "REPORT_PARTITION": "cpu",  # the GPU-less report job on a partition of its own
    }
    if array is not None:
        env["ARRAY"] = array
    repo = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [str(repo / "slurm" / "submit.sh"), str(SHARDS), *OVERRIDES, f"run.out_dir={out_dir}"],
        env=env,
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return dict(line.split() for line in done.stdout.splitlines())


def job_fields(cluster: slurm_cluster.SlurmCluster, job: str) -> dict[str, str]:
    return dict(re.findall(r"(\w+)=(\S*)", cluster.run("scontrol", "show", "job", "--oneliner", job, attempts=5)))


def warn_mid_dialogue(cluster: slurm_cluster.SlurmCluster, job: str, turns: Path, timeout: float) -> None:
    """Send `job` SLURM's warning signal as `--signal=B:USR1@300` does before the time limit, once
    its first step's turns are stored; then start its requeued run at once (SLURM holds a requeued
    job for about two minutes first)."""
    deadline = time.monotonic() + timeout
    while not any(turns.glob("part-*.parquet")):
        assert time.monotonic() < deadline and job_fields(cluster, job)["JobState"] in ("PENDING", "RUNNING")
        time.sleep(0.2)
    cluster.run("scancel", "--batch", "--signal=USR1", job)
    while (fields := job_fields(cluster, job))["Restarts"] == "0" or fields["JobState"] != "PENDING":
        assert time.monotonic() < deadline, fields
        time.sleep(0.5)
    cluster.run("scontrol", "update", f"JobId={job}", "StartTime=now")


def read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def keys(path: Path) -> list[tuple]:
    table = pq.read_table(path, columns=KEY_COLUMNS)
    return sorted(zip(*(table.column(c).to_pylist() for c in KEY_COLUMNS)))


@pytest.mark.slurm
@pytest.mark.vllm
def test_failed_shard_is_named_by_merge_and_resubmitting_it_completes_the_run(cluster, tmp_path, expected_keys):
    out_dir = tmp_path / "run"
    # a file where shard 1's output folder belongs makes its generate job fail (the tests run as
    # root, so taking away write permission would not)
    blocker = out_dir / "dialogues" / f"shard-001-of-{SHARDS:03d}"
    blocker.parent.mkdir(parents=True)
    blocker.write_text("not a folder")
    jobs = submit(cluster, tmp_path, out_dir)
    turns = out_dir / "turns" / f"shard-000-of-{SHARDS:03d}"
    warn_mid_dialogue(cluster, f"{jobs['generate']}_0", turns, CHAIN_TIMEOUT)
    states = cluster.wait(list(jobs.values()), CHAIN_TIMEOUT)
    logs = cluster.job_logs(tmp_path / "logs")
    assert states == {
        f"{jobs['generate']}_0": "COMPLETED",
        f"{jobs['generate']}_1": "FAILED",
        f"{jobs['judge']}_0": "COMPLETED",
        f"{jobs['judge']}_1": "CANCELLED",
        jobs["report"]: "FAILED",
    }, f"{states}\n{logs}"
    partitions = {stage: job_fields(cluster, job)["Partition"] for stage, job in jobs.items()}
    assert partitions == {"generate": "debug", "judge": "debug", "report": "cpu"}, partitions
    judge_1 = job_fields(cluster, f"{jobs['judge']}_1")
    assert judge_1["Reason"] == "DependencyNeverSatisfied", judge_1
    merge_log = (tmp_path / "logs" / f"pl-report-{jobs['report']}.log").read_text()
    assert "shard 1 of 2" in merge_log and "shard 0 of 2" not in merge_log, logs
    assert not (out_dir / "merged").exists()
    # the report covers shard 0 and names shard 1 with the closing line of its generate
    partial = (out_dir / "report" / "report.md").read_text()
    assert "cover only the shards that finished" in partial, logs
    assert "shard 1 of 2: no dialogue files" in partial and "why: generate: error:" in partial, partial
    assert "ARRAY=1" in partial and "shard 0 of 2" not in partial, partial
    assert re.search(r"judgments missing \(judge judge: (\d+), judge warm: \1; ", partial), partial  # per judge
    # shard 0's generate stopped on the signal (exit 75), requeued itself and finished on its second
    # run: the turns of the stopped run's steps kept as they were, none simulated twice
    generate_log = (tmp_path / "logs" / f"pl-generate-{jobs['generate']}_0.log").read_text()
    assert "stopped by SIGUSR1" in generate_log and "requeued" in generate_log, logs
    assert job_fields(cluster, f"{jobs['generate']}_0")["Restarts"] == "1"
    stored = read_rows(turns)
    by_session = Counter(t["session_started"] for t in stored)
    assert len(by_session) == 2, by_session
    assert max(Counter((t["user_id"], t["task_id"], t["index"]) for t in stored).values()) == 1
    dialogues = {(r["user_id"], r["task_id"]): r["turns"] for r in read_rows(out_dir / "dialogues" / turns.name)}
    stopped_run = [t for t in stored if t["session_started"] == min(by_session)]
    resumed_run = {(t["user_id"], t["task_id"]) for t in stored if t["session_started"] == max(by_session)}
    assert {(t["user_id"], t["task_id"]) for t in stopped_run} & resumed_run  # stopped mid-dialogue
    for t in stopped_run:
        assert dialogues[(t["user_id"], t["task_id"])][t["index"]]["text"] == t["text"]

    blocker.unlink()
    again = submit(cluster, tmp_path, out_dir, array="1")
    states = cluster.wait(list(again.values()), CHAIN_TIMEOUT)
    logs = cluster.job_logs(tmp_path / "logs")
    assert states == {
        f"{again['generate']}_1": "COMPLETED",
        f"{again['judge']}_1": "COMPLETED",
        again["report"]: "COMPLETED",
    }, f"{states}\n{logs}"

    # the shards split the work by user, and together hold each dialogue of the selection once
    users_by_shard = [
        {key[0] for key in keys(out_dir / "dialogues" / f"shard-{k:03d}-of-{SHARDS:03d}")} for k in range(SHARDS)
    ]
    assert all(users_by_shard) and not set.intersection(*users_by_shard), users_by_shard
    assert keys(out_dir / "merged" / "dialogues.parquet") == expected_keys
    assert sorted(set(keys(out_dir / "merged" / "judgments.parquet"))) == expected_keys
    judged = pq.read_table(out_dir / "merged" / "judgments.parquet", columns=["judge_key"]).column(0).to_pylist()
    assert len(set(judged)) == 2 and len(set(Counter(judged).values())) == 1  # every judgment under each judge
    report = (out_dir / "report" / "report.md").read_text()
    assert "cover only the shards that finished" not in report and "Incomplete" not in report, logs
    for judge, name in (("judge", "judge"), ("judge-warm", "warm")):
        rows = read_csv(out_dir / "report" / f"table3_{judge}.csv")
        assert rows and {r["judge"] for r in rows} == {name}


@pytest.mark.parametrize(
    "args, env, error",
    [
        (["0"], {}, "usage"),
        (["two", "run.name=x"], {}, "usage"),
        (["2"], {"PERSONALENS": "/nonexistent/personalens"}, "PERSONALENS=/path/to/.venv/bin/personalens"),
    ],
)
def test_submit_refuses_bad_settings_before_submitting(tmp_path, args, env, error):
    repo = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [str(repo / "slurm" / "submit.sh"), *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, **env},
    )
    assert done.returncode == 2 and error in done.stderr
    assert not (tmp_path / "slurm-logs").exists()
