"""Running the real `personalens` command line from tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow.dataset as ds

REPO = Path(__file__).resolve().parents[1]
PERSONALENS = [sys.executable, "-m", "personalens.cli"]
# for a command whose test is about its own files and resumes, not vLLM's processes: its engines keep
# their engine core in the command's process, which then imports torch and vLLM once instead of three
# times (about 25 s less per engine start here; tests/test_stop.py and test_generate_vllm.py keep vLLM's
# default processes)
ENGINE_CORE_HERE = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


def run_cli(
    *args: str, timeout: float = 900, check: bool = True, env: dict | None = None
) -> subprocess.CompletedProcess:
    proc = subprocess.run([*PERSONALENS, *args], cwd=REPO, text=True, capture_output=True, timeout=timeout, env=env)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"personalens {' '.join(args)} exited {proc.returncode}\n"
            f"--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-8000:]}"
        )
    return proc


def start_cli(*args: str, log: Path, env: dict | None = None) -> subprocess.Popen:
    """Start the CLI in its own process group, so a test can kill it with every vLLM worker."""
    with open(log, "w") as out:
        return subprocess.Popen(
            [*PERSONALENS, *args], cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env
        )


def kill_once(
    proc: subprocess.Popen, ready: Callable[[], bool], log: Path, timeout: float = 600, sig: int = signal.SIGKILL
) -> int:
    """Signal a `start_cli` process as soon as `ready()` holds and wait for it to end; its exit
    status. SIGKILL goes to its whole group (every vLLM worker); another signal to personalens
    alone, which must then end within `timeout` seconds, what it leaves of its group killed after it.
    Fails if the process ends first or `ready()` does not hold within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    try:
        while not ready():
            assert proc.poll() is None, Path(log).read_text()[-4000:]
            assert time.monotonic() < deadline, f"not ready after {timeout} s: {Path(log).read_text()[-4000:]}"
            time.sleep(0.2)
        if sig != signal.SIGKILL:
            os.kill(proc.pid, sig)
            proc.wait(timeout=timeout)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass  # the whole group ended
        proc.wait()
    return proc.returncode


def parent_pid(pid: int) -> int:
    """A live process's parent (Linux /proc)."""
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def read_rows(folder: Path) -> list[dict]:
    files = sorted(str(p) for p in Path(folder).rglob("part-*.parquet"))
    return ds.dataset(files, format="parquet").to_table().to_pylist() if files else []
