"""A managed vLLM server on this CPU made slow (2 sequences at a time, a small KV cache, replies of a
fixed length), shared by the tests of this file: it starts on another port when its first port was
taken by another server before vLLM bound it; more requests than it holds, with a stall timeout far
shorter than the time the last of them queue, are each answered exactly once (counted by the
server's own /metrics); and a request whose client hangs up is aborted by the server, which the
engine relies on when it sends a stalled request again (server_http.py)."""

from __future__ import annotations

import dataclasses
import logging
import re
import time

import httpx
import pytest
from engine_fixtures import chat, start_impostor

from personalens.engines import managed
from personalens.engines.config import ModelConfig
from personalens.engines.layout import Decision
from personalens.engines.server import ServerEngine
from personalens.engines.server_processes import stop_all

pytestmark = pytest.mark.vllm

SLOW = {
    "name": "SmolLM2-slow",
    "kv_cache_memory_bytes": 32 * 2**20,  # about 1,400 tokens of SmolLM2-135M
    "max_model_len": 512,
    "max_num_seqs": 2,
    "enforce_eager": True,
    "cpu_reserved_cores": 0,
    "placement": "managed_server",
}
REPLY_TOKENS = 16


@pytest.fixture(scope="module")
def slow_server(tmp_path_factory):
    """(the served config, the port another server held when this one started, what it was asked)."""
    pytest.importorskip("vllm")
    impostor = start_impostor()
    taken = impostor.server_port
    free_ports = managed._free_ports
    config = ModelConfig.from_mapping(SLOW, where="model@assistant")
    try:
        with pytest.MonkeyPatch.context() as patch:
            # the first port chosen is the impostor's, as if it had bound it after personalens chose it
            first = iter([[taken]])
            patch.setattr(managed, "_free_ports", lambda n: next(first, None) or free_ports(n))
            decision = Decision(config, ("assistant",), "managed_server", config)
            logs = tmp_path_factory.mktemp("logs")
            served = managed.start_servers([decision], logs)[config]
        yield served, taken, impostor.asked, logs
    finally:
        stop_all()
        impostor.shutdown()
        impostor.server_close()


def metrics(served: ModelConfig) -> dict[str, float]:
    """The server's /metrics: each series summed over its labels but a histogram bucket's bound
    (`name{le=2.5}`)."""
    root = served.server.base_url.removesuffix("/v1")
    text = httpx.get(f"{root}/metrics", headers={"Authorization": f"Bearer {served.server.api_key}"}).text
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("vllm:"):
            series, value = line.rsplit(" ", 1)
            name = series.split("{")[0]
            bound = re.search(r'le="([^"]+)"', series)
            key = f"{name}{{le={bound[1]}}}" if bound else name
            out[key] = out.get(key, 0.0) + float(value)
    return out


def test_a_port_taken_before_vllm_binds_it_is_given_up_for_another(slow_server):
    served, taken, asked, logs = slow_server
    assert not served.server.base_url.startswith(f"http://127.0.0.1:{taken}/")
    # the first launch lost its port (vLLM says so and exits); the other server was asked who it is
    # and not taken for this one
    (log,) = logs.glob("vllm-server.*.log")
    assert "Address already in use" in log.read_text(errors="replace")
    assert "/v1/models" in asked


def test_more_requests_than_the_server_holds_are_each_answered_once(slow_server, caplog):
    served, *_ = slow_server
    n, timeout = 10, 1.5  # all sent at once, run 2 at a time: the last ones queue far longer than the timeout
    server = dataclasses.replace(served.server, timeout_s=timeout, max_concurrency=n)
    engine = ServerEngine(dataclasses.replace(served, server=server))
    requests = [chat(f"Count to ten, number {i}.", max_tokens=REPLY_TOKENS, min_tokens=REPLY_TOKENS) for i in range(n)]
    before = metrics(served)
    with caplog.at_level(logging.WARNING, logger="personalens.engines.server_http"):
        out = engine.generate(requests)
    after = metrics(served)
    change = {key: after[key] - before.get(key, 0.0) for key in after}
    assert [g.completion_tokens for g in out] == [REPLY_TOKENS] * n and all(g.error is None for g in out)
    # requests waited in the server's queue longer than the timeout (a bucket bound of vLLM's histogram) ...
    waited = (
        change["vllm:request_queue_time_seconds_count"]
        - change[f"vllm:request_queue_time_seconds_bucket{{le={timeout}}}"]
    )
    assert waited >= 2, {k: v for k, v in change.items() if "queue_time" in k}
    # ... and nothing was sent twice: the server finished n requests, and prefilled exactly their prompts
    assert change["vllm:request_success_total"] == n
    assert change["vllm:prompt_tokens_total"] == sum(g.prompt_tokens for g in out)
    assert change["vllm:generation_tokens_total"] == n * REPLY_TOKENS
    assert "attempt 2" not in caplog.text


def test_the_server_aborts_a_request_whose_client_hangs_up(slow_server):
    served, *_ = slow_server
    body = {"model": served.name, "messages": [{"role": "user", "content": "Tell a long story."}]}
    body |= {"max_tokens": 400, "min_tokens": 400, "stream": True}
    headers = {"Authorization": f"Bearer {served.server.api_key}"}
    before = metrics(served)
    with httpx.stream("POST", f"{served.server.base_url}/chat/completions", json=body, headers=headers) as reply:
        next(reply.iter_lines())  # it runs: its first chunk came
        assert metrics(served)["vllm:num_requests_running"] == 1
    # the connection is closed; the server stops generating long before 400 tokens
    deadline = time.monotonic() + 10
    while metrics(served)["vllm:num_requests_running"] > 0:
        assert time.monotonic() < deadline, "the request still runs"
        time.sleep(0.2)
    generated = metrics(served)["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"]
    assert generated < 400, generated
