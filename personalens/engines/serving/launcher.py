"""A watchdog between personalens and a server it starts, so that the server never outlives it:

    python -m personalens.engines.serving.launcher --parent PID --grace SECONDS -- COMMAND...

runs COMMAND in a new session (its own process group: vLLM's API server starts engine-core child
processes, which stay in that group) and stops the whole group, SIGTERM and after `--grace` seconds
SIGKILL, when it is asked to (SIGTERM, SIGINT or SIGHUP) or when PID is gone: personalens ended
without stopping it, even by SIGKILL, which nothing in personalens itself can catch. When the command
ends first, what it left in its group is killed at once and the launcher exits with its status (128 + N
when signal N killed it, as shells report it). It imports nothing heavy, so it starts at once.
"""

from __future__ import annotations

import argparse
import os
import select
import signal
import subprocess
import sys
import time

POLL_S = 0.5


def live_members(group: int) -> list[int]:
    """Processes of a process group that are not zombies (Linux /proc)."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                # pid (comm) state ppid pgrp ...; comm may hold spaces and parentheses
                state, _, pgrp = f.read().rsplit(")", 1)[1].split()[:3]
        except (OSError, IndexError, ValueError):
            continue  # ended meanwhile
        if int(pgrp) == group and state != "Z":
            members.append(int(entry))
    return members


def stop_group(child: subprocess.Popen, grace: float) -> None:
    """SIGTERM to the child's whole group, then SIGKILL to what is left after `grace` seconds."""
    group = child.pid
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(group, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            child.poll()  # reap the child itself, so it does not linger as a zombie
            if not live_members(group):
                return
            time.sleep(0.1)


def watch(parent: int, grace: float, command: list[str]) -> int:
    asked: list[int] = []  # a flag, not an exception: a signal at any point is seen by the loop
    # each signal also writes a byte to this pipe, which ends the loop's wait at once rather than at its
    # next poll: personalens waits for this process when it stops its servers
    woken, wake = os.pipe()
    os.set_blocking(wake, False)
    signal.set_wakeup_fd(wake)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda signum, frame: asked.append(signum))
    child = subprocess.Popen(command, start_new_session=True)
    while child.poll() is None and not asked and os.getppid() == parent:  # re-parented: personalens is gone
        select.select([woken], [], [], POLL_S)
    ended = child.returncode
    # also what the command left running when it ended by itself: at once then, since a dead API
    # server's engine cores serve no one, and personalens learns of the exit only from this exit
    stop_group(child, grace if ended is None else 0.0)
    if ended is None:
        return 0  # stopped on request
    return 128 - ended if ended < 0 else ended


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m personalens.engines.serving.launcher")
    parser.add_argument("--parent", type=int, required=True, help="stop the command when this process is gone")
    parser.add_argument("--grace", type=float, default=10.0, help="seconds between SIGTERM and SIGKILL")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given after --")
    if os.getppid() != args.parent:
        return 1  # the parent died before this process was up
    return watch(args.parent, args.grace, command)


if __name__ == "__main__":
    sys.exit(main())
