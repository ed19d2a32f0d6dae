"""A real single-node SLURM cluster for tests, started by hand (no systemd) and kept off the system.

munged, slurmctld and slurmd run in the foreground as child processes, so teardown stops exactly
them by PID. Everything they use (munge key and socket, slurm.conf, spool, state, logs) lives in one
folder, the daemons listen on free loopback ports, and client commands find the cluster through
SLURM_CONF in `SlurmCluster.env`. Its configuration is SLURM's default where the scripts depend on it:
no `DependencyParameters=kill_invalid_depend`, so a job whose dependency can never be met stays pending
unless its own `--kill-on-invalid-dep=yes` cancels it (slurm/submit.sh). Its two partitions, `debug`
(the default) and `cpu` (for REPORT_PARTITION), hold the one node and hand every job the whole of it, so
at most one job runs at a time (each test job loads vLLM on the CPU, and two of them would not fit in
memory).

Debian/Ubuntu: `apt-get install -y slurmctld slurmd slurm-client munge` (tested with 22.05)."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "scontrol", "sinfo", "squeue", "scancel")
# states after which a job never runs again (scontrol spells them this way)
FINISHED_STATES = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
    }
)


def unavailable_reason() -> str | None:
    """Why a cluster cannot be started here, or None when it can."""
    if os.geteuid() != 0:
        return "starting SLURM daemons needs root (slurmd runs jobs as their submitting user)"
    missing = [name for name in (*DAEMONS, *CLIENTS) if shutil.which(name) is None]
    if missing:
        return (
            f"SLURM/munge binaries missing: {', '.join(missing)} "
            "(apt-get install -y slurmctld slurmd slurm-client munge)"
        )
    return None


@dataclass
class SlurmCluster:
    root: Path
    env: dict[str, str]
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)

    def run(self, *args: str, cwd: Path | None = None, check: bool = True, attempts: int = 1) -> str:
        """Run a SLURM client command against this cluster and return its stdout.

        `attempts` > 1 is for read-only queries: a client now and then dies of SIGPIPE when the
        busy controller drops its connection (seen once in CI while vLLM jobs loaded both cores),
        and asking again is harmless."""
        for attempt in range(attempts):
            done = subprocess.run(args, env=self.env, cwd=cwd, capture_output=True, text=True)
            if done.returncode == 0 or not check:
                return done.stdout
            if attempt + 1 < attempts:
                time.sleep(2.0)
        raise RuntimeError(
            f"{' '.join(args)} failed ({done.returncode}) {attempts} time(s): "
            f"{done.stderr.strip()}\n{self.daemon_logs()}"
        )

    def job_states(self, job_id: str) -> dict[str, str]:
        """State of each record of a job: one per array task ('12_0'), or one for a plain job."""
        states = {}
        for line in self.run("scontrol", "show", "job", "--oneliner", job_id, attempts=5).splitlines():
            fields = dict(re.findall(r"(\w+)=(\S*)", line))
            if "ArrayJobId" in fields:
                name = f"{fields['ArrayJobId']}_{fields['ArrayTaskId']}"
            else:
                name = fields["JobId"]
            states[name] = fields["JobState"]
        return states

    def wait(self, job_ids: list[str], timeout: float) -> dict[str, str]:
        """Wait until every record of these jobs has finished; return all their states.

        Not `sbatch --wait`: it exits 0 for a job cancelled because its dependency failed."""
        deadline = time.monotonic() + timeout
        while True:
            states = {name: state for job in job_ids for name, state in self.job_states(job).items()}
            if all(state in FINISHED_STATES for state in states.values()):
                return states
            if time.monotonic() > deadline:
                self.run("scancel", *job_ids, check=False)
                raise TimeoutError(f"SLURM jobs not finished after {timeout:.0f} s: {states}")
            time.sleep(1.0)

    def daemon_logs(self) -> str:
        return "\n".join(
            f"--- {path.name}\n{path.read_text(errors='replace')[-4000:]}"
            for path in sorted((self.root / "log").glob("*.log"))
        )

    def job_logs(self, *folders: Path) -> str:
        """The tail of every *.log in `folders`, then the daemons' logs: what an assertion shows."""
        logs = [path for folder in folders for path in sorted(folder.glob("*.log"))]
        return "\n".join(
            [*(f"===== {p.name}\n{p.read_text(errors='replace')[-6000:]}" for p in logs), self.daemon_logs()]
        )

    def stop(self) -> None:
        # slurmd first so that it does not try to reach a stopped controller
        for name in reversed(DAEMONS):
            process = self.processes.pop(name, None)
            if process is None:
                continue
            process.terminate()
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _node_hardware() -> str:
    """`CPUs=... RealMemory=...` of this machine, as slurmd detects it."""
    line = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, check=True).stdout
    return " ".join(
        re.findall(
            r"\b(?:CPUs|Boards|SocketsPerBoard|CoresPerSocket|ThreadsPerCore|"
            r"RealMemory)=\d+",
            line,
        )
    )


def _slurm_conf(root: Path, node: str, munge_socket: Path) -> str:
    return f"""\
ClusterName=personalens-test
SlurmctldHost={node}(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={munge_socket}
CredType=cred/munge
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/run/slurmctld.pid
SlurmdPidFile={root}/run/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
SchedulerParameters=batch_sched_delay=0
MinJobAge=3600
NodeName={node} NodeAddr=127.0.0.1 {_node_hardware()} State=UNKNOWN
PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=EXCLUSIVE
PartitionName=cpu Nodes={node} MaxTime=INFINITE State=UP OverSubscribe=EXCLUSIVE
"""


def start(root: Path, timeout: float = 30.0) -> SlurmCluster:
    """Start munged, slurmctld and slurmd with all state under `root`; wait for an idle node."""
    reason = unavailable_reason()
    if reason:
        raise RuntimeError(reason)
    for folder in ("munge", "state", "spool", "run", "log"):
        (root / folder).mkdir(parents=True, exist_ok=True)
    # munged refuses a socket folder that others may write to, and a key others may read
    (root / "munge").chmod(0o755)
    key = root / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    munge_socket = root / "munge" / "munge.socket"
    if len(str(munge_socket)) > 100:
        raise RuntimeError(f"{munge_socket} is too long for a unix socket path; use a shorter root")

    node = socket.gethostname().split(".")[0]
    conf = root / "slurm.conf"
    conf.write_text(_slurm_conf(root, node, munge_socket))
    # the jobs' vLLM engines keep their engine core in the job's own process: these tests are about
    # the scripts, signals, requeues and shards, not vLLM's processes (tests/test_stop.py and
    # test_managed_vllm.py cover those), and each job then imports torch and vLLM once, not three times
    env = {**os.environ, "SLURM_CONF": str(conf), "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    cluster = SlurmCluster(root=root, env=env)
    commands = {
        # --force: munged as root (the test runs as root; no munge user needed)
        "munged": [
            "munged",
            "--foreground",
            "--force",
            f"--socket={munge_socket}",
            f"--key-file={key}",
            f"--pid-file={root}/run/munged.pid",
            f"--seed-file={root}/munge/munged.seed",
            f"--log-file={root}/log/munged.log",
        ],
        "slurmctld": ["slurmctld", "-D", "-c", "-f", str(conf)],  # -c: cold start, no saved state
        "slurmd": ["slurmd", "-D", "-f", str(conf)],
    }
    try:
        for name in DAEMONS:
            with open(root / "log" / f"{name}.stdout.log", "w") as out:
                cluster.processes[name] = subprocess.Popen(
                    commands[name], env=cluster.env, stdout=out, stderr=subprocess.STDOUT
                )
            if name == "munged":
                _wait_for(lambda: munge_socket.exists(), timeout, "munged socket", cluster)
        _wait_for(
            lambda: cluster.run("sinfo", "--noheader", "--format=%T", check=False).strip() == "idle",
            timeout,
            "an idle node",
            cluster,
        )
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _wait_for(ready, timeout: float, what: str, cluster: SlurmCluster) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        for name, process in cluster.processes.items():
            if process.poll() is not None:
                raise RuntimeError(
                    f"{name} exited with {process.returncode} while waiting for {what}\n{cluster.daemon_logs()}"
                )
        if time.monotonic() > deadline:
            raise RuntimeError(f"no {what} after {timeout:.0f} s\n{cluster.daemon_logs()}")
        time.sleep(0.2)
