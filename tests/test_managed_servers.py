"""Managed servers never outlive personalens: real processes, with a stand-in server (a Python child
that starts a grandchild in its own process group, as vLLM's API server starts its engine core),
stopped when the parent is interrupted (SIGINT), terminated (SIGTERM) or killed (SIGKILL); a server
that dies at start or mid-run is reported at once with the end of its log; servers load together; a
port taken by another server before this one binds it is given up for another, and one answered by
a program that is no model server is taken; a server not ready within its model's start timeout is
given up."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from cli_helpers import REPO, parent_pid
from engine_fixtures import chat, free_port, start_impostor

from personalens.engines.models.config import ModelConfig
from personalens.engines.placement.placed import Placement
from personalens.engines.serving import managed
from personalens.engines.serving.engine import ServerEngine
from personalens.engines.serving.processes import Launched, ServerExited, Servers, ServerStartError
from personalens.engines.stop import Stop

GRACE_S = 2.0
POLL_S = 0.5  # the launcher's

# a stand-in server: starts a grandchild in its group; "stubborn" ones ignore SIGTERM (only SIGKILL ends them)
STAND_IN = textwrap.dedent(
    """
    import signal, subprocess, sys, time
    mode = sys.argv[1]
    if mode.startswith("stubborn"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if not mode.endswith("-child"):
        subprocess.Popen([sys.executable, __file__, mode + "-child"])
        print("serving", flush=True)
    time.sleep(600)
    """
)

# personalens' side, as a command runs: starts the stand-in as a managed server under the command's
# stop, then waits, until a signal stops it
PARENT = textwrap.dedent(
    """
    import os, sys
    from pathlib import Path
    from personalens.engines.serving.processes import Servers
    from personalens.engines.stop import Stop, Stopped
    marker, stand_in, log, mode, grace = sys.argv[1:6]
    env = dict(os.environ, PL_TEST_MARK=marker)
    stop = Stop()
    try:
        with stop.on_signals():  # the signals a command takes (cli.py)
            Servers(stop).launch("stand-in", [sys.executable, stand_in, mode], env, Path(log), 0, float(grace))
            print("launched", flush=True)
            stop.wait(600)
            stop.check()
    except Stopped as stopped:
        sys.exit(stopped.exit_status)
    finally:
        stop.close()
    """
)


def marked(marker: str) -> list[int]:
    """Live (not zombie) processes whose environment holds PL_TEST_MARK=<marker>."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if f"PL_TEST_MARK={marker}".encode() in environ and state != "Z":
            found.append(int(entry.name))
    return found


def wait_for(condition, timeout: float) -> float:
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < timeout, f"not within {timeout} s"
        time.sleep(0.05)
    return time.monotonic() - started


def ignore_sigint() -> None:
    """What a shell without job control does to a command it starts with `&` (a batch script's, a CI
    runner's): SIGINT ignored, which Python leaves in place at start."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.parametrize(
    ("sig", "mode", "inherited"),
    [
        (signal.SIGINT, "polite", signal.SIG_DFL),
        (signal.SIGINT, "polite", signal.SIG_IGN),
        (signal.SIGTERM, "polite", signal.SIG_DFL),
        (signal.SIGKILL, "stubborn", signal.SIG_DFL),
    ],
    ids=["ctrl-c", "ctrl-c-started-with-sigint-ignored", "sigterm", "kill-9-and-a-server-that-ignores-sigterm"],
)
def test_no_server_process_outlives_the_parent(tmp_path, sig, mode, inherited):
    marker = f"{tmp_path.name}-{sig}"
    stand_in = tmp_path / "stand_in.py"
    stand_in.write_text(STAND_IN)
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, marker, str(stand_in), str(tmp_path / "server.log"), mode, str(GRACE_S)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # the test's own disposition of SIGINT must not decide the case: pytest may itself run with it ignored
        preexec_fn=ignore_sigint
        if inherited == signal.SIG_IGN
        else lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        assert parent.stdout.readline().strip() == "launched", parent.stderr.read()
        wait_for(lambda: len(marked(marker)) == 3, timeout=30)  # the launcher, the server, its child
        parent.send_signal(sig)
        parent.wait(timeout=90)  # generous: a loaded machine runs the exit hooks slowly
        if sig == signal.SIGKILL:
            # the launcher notices its parent gone within a poll, asks, waits the grace period, then kills
            gone_after = wait_for(lambda: not marked(marker), timeout=GRACE_S + POLL_S + 5)
            assert gone_after >= GRACE_S - 0.5
        else:
            # personalens itself stopped its server, and waited for it, before it ended with 128 + N, as a
            # command ends on signal N (engines/stop.py), however SIGINT was handled when it started
            assert parent.returncode == 128 + sig, parent.stderr.read()
            assert marked(marker) == []
    finally:
        if parent.poll() is None:
            parent.kill()
        for pid in marked(marker):
            os.kill(pid, signal.SIGKILL)
    assert "serving" in (tmp_path / "server.log").read_text()


def test_a_server_that_dies_at_start_is_reported_with_its_log(tmp_path):
    stop = Stop()
    servers = Servers(stop)
    die = "import sys; print('no model here: /nowhere'); sys.exit(3)"
    launched = servers.launch("broken", [sys.executable, "-c", die], os.environ, tmp_path / "broken.log", port=1)
    # an http_proxy of the cluster must not take the requests to this machine's servers
    assert "127.0.0.1" in os.environ["no_proxy"].split(",") and "127.0.0.1" in os.environ["NO_PROXY"].split(",")
    try:
        with pytest.raises(ServerStartError, match=r"(?s)broken exited with status 3 .*no model here: /nowhere"):
            servers.wait_ready([launched], timeout=60)
        silent = servers.launch(
            "silent", [sys.executable, "-c", "import time; time.sleep(600)"], os.environ, tmp_path / "s.log", port=1
        )
        with pytest.raises(ServerStartError, match=r"silent was not ready after 1 s"):
            servers.wait_ready([silent], timeout=1)
    finally:
        stop.close()
    assert silent.process.poll() is not None  # stopped when the command's stop closed


# a stand-in vLLM server: after `delay` seconds, serves /health, /v1/models (one model) and chat
# completions that never end on its port, failing as vLLM does when the port is taken
HTTP_STAND_IN = textwrap.dedent(
    """
    import json, os, sys, time
    from http.server import BaseHTTPRequestHandler, HTTPServer
    port, model, delay = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])
    print("pid", os.getpid(), flush=True)
    time.sleep(delay)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps({"data": [{"id": model}]} if self.path == "/v1/models" else {}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self):  # a reply that never ends: a chunk every 0.1 s
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            while True:
                self.wfile.write(b'data: {"choices": [{"delta": {"content": "a"}}]}\\n\\n')
                self.wfile.flush()
                time.sleep(0.1)

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", port), Handler)
    print("serving", flush=True)
    server.serve_forever()
    """
)


def http_stand_in(servers: Servers, tmp_path: Path, name: str, port: int, delay: float = 0.0) -> Launched:
    script = tmp_path / "http_stand_in.py"
    script.write_text(HTTP_STAND_IN)
    command = [sys.executable, str(script), str(port), name, str(delay)]
    return servers.launch(name, command, os.environ, tmp_path / f"{name}.log", port, key="the-key", model=name)


def test_servers_load_together_and_one_that_dies_fails_the_start_at_once(tmp_path):
    stop = Stop()
    servers = Servers(stop)
    slow = http_stand_in(servers, tmp_path, "slow", free_port(), delay=600)
    die = "import sys, time; time.sleep(1); print('CUDA out of memory'); sys.exit(1)"
    broken = servers.launch("broken", [sys.executable, "-c", die], os.environ, tmp_path / "broken.log", free_port())
    started = time.monotonic()
    try:
        with pytest.raises(ServerStartError) as failure:
            servers.wait_ready([slow, broken], timeout=300)
    finally:
        stop.close()
    # reported when it died, not after the other one's time to load; in one line with the log's end
    assert time.monotonic() - started < 15
    message = str(failure.value)
    assert "\n" not in message, message
    assert f"broken exited with status 1 before it was ready; log {tmp_path / 'broken.log'}" in message
    assert message.endswith("its last lines: CUDA out of memory")


def test_a_port_taken_before_the_server_binds_it_is_given_up_for_another(tmp_path, caplog):
    # another server holds the port and answers /health, but not as this one (it refuses the key)
    impostor = start_impostor()
    taken = impostor.server_port
    relaunched = []
    stop = Stop()
    servers = Servers(stop)

    def relaunch(i: int) -> Launched:
        relaunched.append(i)
        return http_stand_in(servers, tmp_path, "mine", free_port())

    try:
        with caplog.at_level(logging.WARNING, logger="personalens.engines.serving.processes"):
            mine = http_stand_in(servers, tmp_path, "mine", taken, delay=1)
            (ready,) = servers.wait_ready([mine], timeout=60, relaunch=relaunch)
        assert relaunched == [0] and ready.port != taken and ready.answers() is None
        assert "/v1/models" in impostor.asked  # it was asked who it is, and not taken for this server
        assert f"port {taken} of mine's server was taken before vLLM bound it; starting it again" in caplog.text
    finally:
        stop.close()
        impostor.shutdown()
        impostor.server_close()


class _NotAModelServer(BaseHTTPRequestHandler):
    """Another program on the port: 200 and an HTML page for every route."""

    def do_GET(self):
        page = b"<html>a dashboard</html>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(page)))
        self.end_headers()
        self.wfile.write(page)

    def log_message(self, *args):
        pass


def test_a_port_answered_by_a_program_that_is_no_model_server_is_taken(tmp_path):
    other = ThreadingHTTPServer(("127.0.0.1", 0), _NotAModelServer)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    try:
        mine = Launched("mine", None, tmp_path / "mine.log", other.server_port, key="the-key", model="mine")
        assert mine.answers() == (
            f"port {other.server_port} answers /health, but /v1/models is not a models list: port taken by another server"
        )
    finally:
        other.shutdown()
        other.server_close()


def test_a_managed_server_is_given_its_models_start_timeout(tmp_path, monkeypatch):
    # a "server" that never answers: the start fails after the model config's timeout
    (tmp_path / "never_ready.py").write_text("import time\ntime.sleep(120)\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    monkeypatch.setattr(managed, "SERVER_MODULE", "never_ready")
    monkeypatch.setattr(managed, "check_server", lambda args: None)  # its flags are vLLM's, checked elsewhere
    config = ModelConfig.from_mapping({"name": "slow", "server_start_timeout_s": 2, "dtype": "float32"})
    started = time.monotonic()
    stop = Stop()
    try:
        with pytest.raises(ServerStartError, match=r"^the vLLM server of slow was not ready after 2 s; log "):
            placed = Placement(config, ("assistant",), "managed_server", config)
            managed.start_servers([placed], tmp_path / "logs", "", stop)
    finally:
        stop.close()
    assert time.monotonic() - started < 30


def test_a_server_that_exits_mid_run_requests_the_commands_stop_with_its_exit_line(tmp_path):
    stop = Stop()
    servers = Servers(stop)
    (server,) = servers.wait_ready([http_stand_in(servers, tmp_path, "watched", free_port())], timeout=60)
    try:
        pid = int(server.log.read_text().split()[1])
        os.kill(pid, signal.SIGKILL)
        started = time.monotonic()
        assert stop.wait(30)  # the command sees it wherever it waits on its stop
        assert time.monotonic() - started < 5
        with pytest.raises(ServerExited) as exited:
            stop.check()
        line = str(exited.value)
        assert line.startswith("the vLLM server of watched exited with status 137 (killed by SIGKILL) while the")
        assert f"log {server.log}, its last lines: pid {pid} | serving" in line and "\n" not in line
    finally:
        stop.close()


def test_a_server_engine_waiting_on_a_server_that_exits_stops_at_once(tmp_path):
    stop = Stop()
    servers = Servers(stop)
    (server,) = servers.wait_ready([http_stand_in(servers, tmp_path, "streaming", free_port())], timeout=60)
    raw = {"name": "streaming", "engine": "server", "server": {"base_url": server.base_url, "model": "streaming"}}
    engine = ServerEngine(ModelConfig.from_mapping(raw), stop)
    pid = int(server.log.read_text().split()[1])
    killer = threading.Timer(1.0, os.kill, (pid, signal.SIGKILL))
    try:
        killer.start()
        started = time.monotonic()
        # its requests stream from the server until it is killed; the engine's event loop is interrupted
        with pytest.raises(ServerExited, match="exited with status 137 .* while the command was using it"):
            engine.generate([chat("Hi"), chat("Hello")])
        assert time.monotonic() - started < 6
    finally:
        killer.cancel()
        stop.close()


def test_a_server_that_ends_by_itself_takes_its_children_with_it_at_once(tmp_path):
    """What a dead server left in its group (vLLM's engine cores) is killed without the grace period,
    so that personalens learns of the exit at once."""
    stand_in = tmp_path / "stand_in.py"
    stand_in.write_text(STAND_IN)
    marker = f"{tmp_path.name}-orphans"
    env = dict(os.environ, PL_TEST_MARK=marker)
    stop = Stop()
    launched = Servers(stop).launch(
        "stand-in", [sys.executable, str(stand_in), "stubborn"], env, tmp_path / "s.log", 1, 60
    )
    try:
        wait_for(lambda: len(marked(marker)) == 3, timeout=30)  # the launcher, the server, its child
        (server,) = [p for p in marked(marker) if parent_pid(p) == launched.process.pid]
        os.kill(server, signal.SIGKILL)
        launched.process.wait(timeout=10)  # far less than its grace period: its child ignores SIGTERM
        assert launched.process.returncode == 128 + signal.SIGKILL and marked(marker) == []
    finally:
        stop.close()
