"""The leftover check (tests/leftovers.py) itself: a module that leaves a process or a thread of its own
fails, naming each and the test that started it; a library's daemon thread and what ended are not
named."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

TESTS = Path(__file__).resolve().parent

LEAKY = textwrap.dedent(
    """
    import subprocess, threading, time

    def test_clean():
        subprocess.run(["true"], check=True)

    def test_leaves_a_process():
        subprocess.Popen(["sleep", "20"])

    def test_leaves_a_thread_of_its_own():
        threading.Thread(target=lambda: time.sleep(20), name="own", daemon=True).start()

    def test_a_library_daemon_thread():
        threading.Thread(target=time.sleep, args=(20,), name="library", daemon=True).start()

    def test_a_process_that_ends():
        subprocess.Popen(["sleep", "0.2"])
    """
)


def test_a_module_that_leaves_a_process_or_thread_fails_naming_the_test(tmp_path):
    (tmp_path / "test_leaky.py").write_text(LEAKY)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "leftovers", "-p", "no:cacheprovider", "test_leaky.py"],
        cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=str(TESTS), PL_TEST_SETTLE_S="2"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = run.stdout
    assert run.returncode == 1 and "5 passed, 1 error" in out, out[-3000:]
    assert "sleep 20), started during test_leaky.py::test_leaves_a_process" in out, out[-3000:]
    assert "(own), started during test_leaky.py::test_leaves_a_thread_of_its_own" in out, out[-3000:]
    assert "(library)" not in out and "sleep 0.2" not in out
    for line in out.splitlines():  # what it left, ended so as not to outlive this test
        if "sleep 20), started" in line:
            os.kill(int(line.split("process ")[1].split()[0]), 9)
