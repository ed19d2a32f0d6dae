"""The signal path of a command with managed servers, under stress: Ctrl-C (once or twice) and SIGTERM
arrive at random points before a server starts, in `Servers.launch`, while a model loads in process
(not looking at the stop), in `wait_ready`, while the server serves (the main thread writing log lines)
and in `Stop.close`, in several drivers at once, 120 times in all. Each
time the command's block must end promptly, and no process of its server (the launcher, the stand-in,
its child) may be left. Each driver is a real process with its own signal handlers, as personalens is,
started with SIGINT ignored, as a shell without job control starts a command with `&`."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from collections import Counter

from cli_helpers import REPO

DRIVERS = 4
ROUNDS = 30  # per driver
PROMPT_S = 5.0  # from the first signal to the block's end, at most

# one driver: ROUNDS commands in a row, each with one managed stand-in server (an HTTP server on a free
# port, ready after a short delay, with a child in its process group as vLLM's API server has), and a
# timer thread that signals this process at a random moment; prints one JSON line per round
DRIVER = textwrap.dedent(
    """
    import json, logging, os, random, signal, socket, sys, threading, time
    from pathlib import Path
    from personalens.engines.serving import processes
    from personalens.engines.serving.processes import Servers
    from personalens.engines.stop import Stop, Stopped

    STAND_IN = (
        "import subprocess, sys, time\\n"
        "from http.server import BaseHTTPRequestHandler, HTTPServer\\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\\n"
        "time.sleep(float(sys.argv[2]))\\n"
        "class H(BaseHTTPRequestHandler):\\n"
        "    def do_GET(self):\\n"
        "        self.send_response(200); self.send_header('Content-Length', '0'); self.end_headers()\\n"
        "    def log_message(self, *args):\\n"
        "        pass\\n"
        "HTTPServer(('127.0.0.1', int(sys.argv[1])), H).serve_forever()\\n"
    )

    seed, rounds, folder = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
    rng = random.Random(seed)
    processes.POLL_S = 0.05  # health checks while the server loads, every 50 ms rather than every second
    logging.basicConfig(filename=folder / f"driver-{seed}.log", level=logging.INFO)
    log = logging.getLogger("driver")
    phase = "before"
    TARGETS = ["before", "launch", "loading", "starting", "serving", "closing"]

    def marked(marker):
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                environ = open(f"/proc/{entry}/environ", "rb").read().split(b"\\0")
                state = open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if f"PL_TEST_MARK={marker}".encode() in environ and state != "Z":
                found.append(int(entry))
        return found

    def free_port():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    for r in range(rounds):
        marker = f"stress-{seed}-{r}"
        kind = rng.choice(["SIGINT", "SIGTERM", "SIGINT twice"])
        # the part of the path to signal in, and how far into it
        target, ready_after = rng.choice(TARGETS), rng.uniform(0.0, 0.3)
        into = {"loading": 0.05, "starting": ready_after + 0.1, "serving": 0.2, "closing": 0.05}.get(target, 0.0)
        delay = rng.uniform(0.0, into)
        sent, live, lock = [], [True], threading.Lock()

        def fire():
            while phase != target and live[0]:
                time.sleep(0.001)
            time.sleep(delay)
            for i in range(2 if kind == "SIGINT twice" else 1):
                with lock:
                    if not live[0]:
                        return
                    sent.append((phase, time.monotonic()))
                    os.kill(os.getpid(), signal.SIGTERM if kind == "SIGTERM" else signal.SIGINT)
                time.sleep(0.05)

        timer = threading.Thread(target=fire)
        stop, outcome = Stop(), "finished"
        phase, started = "before", time.monotonic()
        try:
            with stop.on_signals():
                try:
                    timer.start()
                    try:
                        time.sleep(0.02)  # the command's own work before it starts a server
                        servers = Servers(stop)
                        phase = "launch"
                        port = free_port()
                        command = [sys.executable, "-c", STAND_IN, str(port), str(ready_after)]
                        env = dict(os.environ, PL_TEST_MARK=marker)
                        launched = servers.launch("stand-in", command, env, folder / f"{marker}.log", port, 2.0)
                        # a model loading in process meanwhile, which does not look at the stop
                        phase = "loading"
                        time.sleep(0.15)
                        phase = "starting"
                        servers.wait_ready([launched], timeout=30)
                        phase = "serving"
                        until = time.monotonic() + 0.2
                        while time.monotonic() < until and not stop.requested:
                            log.info("serving %s", marker)  # a signal may land inside logging
                        phase = "ending"
                        stop.check()
                    finally:
                        phase = "closing"
                        stop.close()
                        phase = "closed"
                        with lock:
                            live[0] = False
                except Stopped as stopped:
                    outcome = f"stopped {stopped.exit_status}"
        except KeyboardInterrupt:  # the second Ctrl-C, wherever it landed before the handlers were restored
            outcome = "interrupted"
        with lock:
            live[0] = False
        timer.join()
        ended = time.monotonic()
        first = sent[0] if sent else ("after", ended)
        print(json.dumps({
            "kind": kind, "phase": first[0], "phases": [p for p, _ in sent], "outcome": outcome, "left": marked(marker),
            "after_signal_s": round(ended - first[1], 3), "round_s": round(ended - started, 3),
        }), flush=True)
    """
)


def ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def test_signals_at_any_point_leave_no_server_and_end_promptly(tmp_path):
    drivers = [
        subprocess.Popen(
            [sys.executable, "-c", DRIVER, str(seed), str(ROUNDS), str(tmp_path)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=ignore_sigint,
        )
        for seed in range(DRIVERS)
    ]
    rounds = []
    for driver in drivers:
        out, err = driver.communicate(timeout=240)
        assert driver.returncode == 0, err[-3000:]
        rounds += [json.loads(line) for line in out.splitlines()]
    assert len(rounds) == DRIVERS * ROUNDS
    for r in rounds:
        assert r["left"] == [], r  # the launcher waited for its server's whole group
        assert r["after_signal_s"] < PROMPT_S, r
        if r["phases"] == ["loading", "loading"]:  # a second Ctrl-C where the stop is not looked at
            assert r["outcome"] == "interrupted", r
        elif r["phase"] in ("before", "launch", "loading", "starting", "serving"):  # a stop before close
            expected = {"SIGTERM": {"stopped 143"}, "SIGINT": {"stopped 130"}}.get(r["kind"])
            assert r["outcome"] in (expected or {"stopped 130", "interrupted"}), r
        else:  # one that lands while it closes is ignored: the command ends as it would have
            assert r["outcome"] in ("finished", "stopped 130", "stopped 143", "interrupted"), r
    # the random moments reached every part of the path, each several times
    phases = Counter(r["phase"] for r in rounds)
    assert all(phases[p] >= 5 for p in ("before", "loading", "starting", "serving", "closing")), phases
    assert phases["launch"] >= 1, phases
    assert any(r["phases"] == ["loading", "loading"] for r in rounds)
