"""The server engine's streamed requests against a small local HTTP server that streams chunked as
vLLM's does (replies one after another reuse one kept-alive connection) and misbehaves on cue:
a reply that starts late while /health answers (waited for: queueing is no failure), a stream that
stalls after its first chunk (given up, its connection closed before it is sent again), a stream or a
body cut mid-reply (retried, and reported; after its retries it fails alone while /health answers),
an error event in the stream (a refusal costs only its request; a server's fault is retried), a reply
the server ended with finish_reason "abort" (no turn: retried). The same rules against a real vLLM server are in
tests/test_server.py."""

from __future__ import annotations

import json
import logging
import re
import select
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from engine_fixtures import chat

from personalens.engines.models.config import ModelConfig
from personalens.engines.serving.engine import ServerEngine
from personalens.engines.serving.http import ServerError

CHUNKS = [
    {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
    {"choices": [{"index": 0, "delta": {"content": "hel"}}]},
    {"choices": [{"index": 0, "delta": {"content": "lo"}, "finish_reason": "stop"}]},
    {
        "choices": [],
        "usage": {"prompt_tokens": 5, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 4}},
    },
]


class _Streaming(BaseHTTPRequestHandler):
    """Streams CHUNKS; the server's `script` says what each next POST does instead of answering at once."""

    protocol_version = "HTTP/1.1"

    def do_GET(self):
        self._send_json(self.server.health, {})

    def do_POST(self):
        try:
            self._post()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up on this request

    def _post(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.arrivals.append((time.monotonic(), self.client_address[1]))
        assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
        step = self.server.script.pop(0) if self.server.script else "answer"
        if step == "cut-body":  # a Content-Length the body never reaches (urllib's IncompleteRead)
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "1000")
            self.end_headers()
            self.wfile.write(b'{"choices": [')
            return self._close()
        # chunked, as vLLM's server streams, and kept alive; or, "ended-early", delimited by closing
        self._chunked = step != "ended-early"
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header(*(("Transfer-Encoding", "chunked") if self._chunked else ("Connection", "close")))
        self.end_headers()
        if step == "late":  # queued in the server: nothing at all for a while
            time.sleep(self.server.delay)
        self._event(CHUNKS[0])
        if step == "stall":  # starts, then stalls: wait until the client hangs up, and note when
            select.select([self.connection], [], [], 30)
            self.server.hangups.append(time.monotonic())
            return self._close()
        if step in ("cut-stream", "ended-early"):
            return self._close()
        if step == "abort":  # vLLM's engine aborted the request mid-reply
            self._event({"choices": [{"index": 0, "delta": {"content": "hel"}, "finish_reason": "abort"}]})
            self._event(CHUNKS[-1])
            self._write(b"data: [DONE]\n\n")
            return self._write(b"")
        if step.startswith("error-"):  # vLLM's error event: the status it would have answered with
            status = int(step.removeprefix("error-"))
            self._event({"error": {"message": f"failed {status}", "type": "Error", "param": None, "code": status}})
            self._write(b"data: [DONE]\n\n")
            return self._write(b"")
        for chunk in CHUNKS[1:]:
            self._event(chunk)
        self._write(b"data: [DONE]\n\n")
        self._write(b"")  # the last chunk

    def _event(self, chunk: dict) -> None:
        self._write(f"data: {json.dumps(chunk)}\n\n".encode())

    def _write(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data) if self._chunked else data)
        self.wfile.flush()

    def _send_json(self, status: int, body: dict) -> None:
        payload = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def _close(self) -> None:
        self.close_connection = True
        self.wfile.flush()

    def log_message(self, *args):
        pass


@pytest.fixture
def streaming_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Streaming)
    server.script, server.arrivals, server.hangups, server.health, server.delay = [], [], [], 200, 0.0
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def engine_for(server, **settings) -> ServerEngine:
    base_url = f"http://127.0.0.1:{server.server_port}/v1"
    raw = {
        "name": "m",
        "engine": "server",
        "server": {"base_url": base_url, "model": "m", "backoff_s": 0.01, **settings},
    }
    return ServerEngine(ModelConfig.from_mapping(raw))


def test_a_streamed_reply_is_put_together_with_its_usage(streaming_server):
    (out,) = engine_for(streaming_server).generate([chat("Hi")])
    assert (out.text, out.prompt_tokens, out.completion_tokens, out.cached_tokens) == ("hello", 5, 2, 4)
    assert out.finish_reason == "stop" and len(streaming_server.arrivals) == 1


def test_replies_come_one_after_another_on_one_kept_alive_connection(streaming_server):
    out = engine_for(streaming_server, max_concurrency=1).generate([chat("Hi"), chat("Hello"), chat("Hey")])
    assert [g.text for g in out] == ["hello"] * 3
    assert len({port for _, port in streaming_server.arrivals}) == 1


def test_a_reply_that_waits_in_the_queue_is_not_timed_out_while_the_server_is_healthy(streaming_server):
    streaming_server.script, streaming_server.delay = ["late"], 1.5
    started = time.monotonic()
    (out,) = engine_for(streaming_server, timeout_s=0.3, retries=0).generate([chat("Hi")])
    assert out.text == "hello" and time.monotonic() - started >= 1.5  # five stall timeouts long
    assert len(streaming_server.arrivals) == 1


def test_a_reply_that_waits_while_the_server_is_unhealthy_fails(streaming_server):
    streaming_server.script, streaming_server.delay, streaming_server.health = ["late"], 3.0, 503
    with pytest.raises(ServerError, match=r"failed after 1 attempt\(s\): no reply for 0.3 s, and the server does"):
        engine_for(streaming_server, timeout_s=0.3, retries=0).generate([chat("Hi")])


def test_a_stalled_reply_is_hung_up_before_it_is_sent_again(streaming_server, caplog):
    streaming_server.script = ["stall"]
    with caplog.at_level(logging.WARNING, logger="personalens.engines.serving.http"):
        (out,) = engine_for(streaming_server, timeout_s=0.5, retries=1).generate([chat("Hi")])
    assert out.text == "hello"
    (first, _), (second, _) = streaming_server.arrivals
    (hung_up,) = streaming_server.hangups
    # the server saw the first copy's connection closed (vLLM aborts such a request) before the second came
    assert first < hung_up <= second
    assert "no reply for 0.5 s; attempt 2 of 2" in caplog.text


@pytest.mark.parametrize(
    ("cut", "reported"),
    [
        ("cut-body", "the connection was cut mid-reply (incomplete body"),
        ("cut-stream", "the connection was cut mid-reply (incomplete body"),
        ("ended-early", "closed before the reply ended"),
    ],
)
def test_a_reply_cut_mid_body_is_retried_and_reported(streaming_server, caplog, cut, reported):
    streaming_server.script = [cut]
    with caplog.at_level(logging.WARNING, logger="personalens.engines.serving.http"):
        (out,) = engine_for(streaming_server, retries=1).generate([chat("Hi")])
    assert out.text == "hello" and len(streaming_server.arrivals) == 2
    assert reported in caplog.text
    # out of retries: it fails alone (the server answers /health), and the call keeps the other reply
    streaming_server.script = [cut]
    failed, answered = engine_for(streaming_server, retries=0, max_concurrency=1).generate([chat("Hi"), chat("Yo")])
    assert re.search(rf"failed after 1 attempt\(s\): .*{re.escape(reported[:20])}", failed.error), failed.error
    assert (failed.text, answered.text, answered.error) == ("", "hello", None)


def test_a_reply_the_server_aborted_is_no_turn_and_is_sent_again(streaming_server, caplog):
    streaming_server.script = ["abort"]
    with caplog.at_level(logging.WARNING, logger="personalens.engines.serving.http"):
        (out,) = engine_for(streaming_server, retries=1).generate([chat("Hi")])
    assert (out.text, out.finish_reason) == ("hello", "stop") and len(streaming_server.arrivals) == 2
    assert "the server aborted the request mid-reply; attempt 2 of 2" in caplog.text


def test_an_error_event_refusing_the_request_costs_only_it_and_a_server_error_is_retried(streaming_server, caplog):
    streaming_server.script = ["error-400"]
    refused, answered = engine_for(streaming_server, max_concurrency=1, retries=1).generate([chat("Hi"), chat("Yo")])
    assert refused.error == "HTTP 400 in the stream: failed 400" and refused.text == ""
    assert answered.text == "hello" and len(streaming_server.arrivals) == 2  # the refusal was not sent again
    streaming_server.script = ["error-500"]
    with caplog.at_level(logging.WARNING, logger="personalens.engines.serving.http"):
        (out,) = engine_for(streaming_server, retries=1).generate([chat("Hi")])
    assert out.text == "hello" and len(streaming_server.arrivals) == 4
    assert "error in the stream: failed 500; attempt 2 of 2" in caplog.text


def test_a_model_with_a_reasoning_parser_whose_server_returns_no_reasoning_field_is_named_at_its_first_call(
    streaming_server, caplog
):
    """The server's replies carry no `reasoning` field: a warning line, once, for free text; an error
    for a grammar (such a server applies it from the first token); nothing where thinking is off."""
    from personalens.engines.models.config import ModelConfigError

    def engine(**model) -> ServerEngine:
        server = {"base_url": f"http://127.0.0.1:{streaming_server.server_port}/v1", "model": "m"}
        return ServerEngine(ModelConfig.from_mapping({"name": "r", "engine": "server", "server": server, **model}))

    thinking = engine(reasoning_parser="deepseek_r1")
    with caplog.at_level(logging.WARNING, logger="personalens.engines.serving.engine"):
        for _ in range(2):
            assert [g.text for g in thinking.generate([chat("Hi"), chat("Hi")])] == ["hello", "hello"]
        engine(reasoning_parser="deepseek_r1", chat_template_kwargs={"enable_thinking": False}).generate([chat("Hi")])
    named = [r.getMessage() for r in caplog.records]
    assert len(named) == 1 and "r: its config names reasoning_parser deepseek_r1" in named[0]
    assert "returned no `reasoning` field in 2 replies (started without --reasoning-parser deepseek_r1?)" in named[0]
    with pytest.raises(ModelConfigError, match="applies a grammar from the first token, so this judge would never"):
        engine(reasoning_parser="deepseek_r1").generate([chat("Hi", grammar='root ::= "hello"')])
