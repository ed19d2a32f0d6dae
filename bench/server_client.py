"""Requests per second of the server engine's HTTP client against one real `vllm serve` of the
embedded model, for one or more checkouts of personalens (e.g. before and after a change of client):
each checkout's `ServerEngine.generate` sends the same batch of short chat completions, in rounds
that alternate between checkouts, so that both see the same server and the same machine load.

    python bench/server_client.py --checkouts /path/to/old /path/to/new --requests 128 --max-tokens 1 16

The server runs with 32 sequences at a time and the test suite's 512 MiB KV cache; the machine's
CPU flags and load average are printed with the numbers, since they move them.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from personalens.engines.serving.launcher import stop_group

MEASURE = """
import json, sys, time
from personalens.engines.base import Request, Sampling
from personalens.engines.models.config import ModelConfig
from personalens.engines.serving.engine import ServerEngine
url, n, tokens, concurrency = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
raw = {"name": "bench", "engine": "server", "server": {"base_url": url, "model": "bench", "max_concurrency": concurrency}}
engine = ServerEngine(ModelConfig.from_mapping(raw))
sampling = Sampling(max_tokens=tokens, min_tokens=tokens)
requests = [Request([{"role": "user", "content": f"Say a word, number {i}."}], sampling) for i in range(n)]
engine.generate(requests[:4])  # connections and the server's first requests, not timed
started = time.perf_counter()
out = engine.generate(requests)
took = time.perf_counter() - started
assert all(g.completion_tokens == tokens for g in out)
print(json.dumps({"seconds": took}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkouts", nargs="+", type=Path, default=[Path(__file__).resolve().parents[1]])
    parser.add_argument("--requests", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from personalens.engines.models.embedded import embedded_model_dir

    port = _free_port()
    log = open(Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-server-client.{port}.log", "w")
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(embedded_model_dir())]
    command += ["--served-model-name", "bench", "--host", "127.0.0.1", "--port", str(port), "--max-num-seqs", "32"]
    command += ["--kv-cache-memory-bytes", str(512 * 2**20), "--max-model-len", "2048", "--enforce-eager"]
    command += ["--disable-uvicorn-access-log"]
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_healthy(server, port)
        url = f"http://127.0.0.1:{port}/v1"
        print(f"CPU: {_cpu()}; load average at start: {_load()}")
        print("| checkout | max_tokens | requests | requests/s (median of rounds) | rounds |")
        print("|---|---:|---:|---:|---|")
        for tokens in args.max_tokens:
            seconds: dict[Path, list[float]] = {c: [] for c in args.checkouts}
            for _ in range(args.rounds):
                for checkout in args.checkouts:
                    seconds[checkout].append(_measure(checkout, url, args.requests, tokens, args.concurrency))
            for checkout, took in seconds.items():
                rates = ", ".join(f"{args.requests / s:.1f}" for s in took)
                median = args.requests / statistics.median(took)
                print(f"| {checkout} | {tokens} | {args.requests} | {median:.1f} | {rates} |")
        print(f"load average at the end: {_load()}")
    finally:
        stop_group(server, grace=30)
        log.close()


def _measure(checkout: Path, url: str, n: int, tokens: int, concurrency: int) -> float:
    env = dict(os.environ, PYTHONPATH=str(checkout))
    command = [sys.executable, "-c", MEASURE, url, str(n), str(tokens), str(concurrency)]
    done = subprocess.run(command, cwd=checkout, env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.splitlines()[-1])["seconds"]


def _wait_healthy(server: subprocess.Popen, port: int) -> None:
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"vllm serve exited with {server.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(1)
    raise SystemExit("vllm serve not healthy after 600 s")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cpu() -> str:
    info = Path("/proc/cpuinfo").read_text()
    model = next(line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name"))
    flags = next(line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags"))
    shown = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags]
    return f"{os.cpu_count()} x {model}, flags {' '.join(shown)}"


def _load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


if __name__ == "__main__":
    main()
