"""The managed server's key check (engines/serving/guard.py) as the ASGI middleware vLLM loads, pure:
every route but /health needs the bearer key; the real server is tested in test_managed_vllm.py."""

from __future__ import annotations

import asyncio

import pytest

from personalens.engines.serving.guard import RequireKey


async def _app(scope, receive, send):
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"served"})


def _call(guard, path: str, authorization: bytes | None = None, kind: str = "http") -> list[dict]:
    headers = [(b"content-type", b"application/json")] + ([(b"authorization", authorization)] if authorization else [])
    sent = []

    async def send(message):
        sent.append(message)

    asyncio.run(guard({"type": kind, "path": path, "headers": headers}, None, send))
    return sent


def test_every_route_but_health_needs_the_key(monkeypatch):
    monkeypatch.setenv("VLLM_API_KEY", "s3cret")
    guard = RequireKey(_app)
    for path in ("/v1/chat/completions", "/invocations", "/tokenize", "/pooling", "/metrics"):
        for authorization in (None, b"Bearer wrong", b"s3cret", b"Basic s3cret"):
            assert _call(guard, path, authorization)[0]["status"] == 401, (path, authorization)
        assert _call(guard, path, b"Bearer s3cret")[0]["status"] == 200
        assert _call(guard, path, b"bearer s3cret")[0]["status"] == 200  # the scheme is case-insensitive
    assert _call(guard, "/health")[0]["status"] == 200
    assert _call(guard, "/invocations", kind="websocket") == [{"type": "websocket.close", "code": 1008}]


def test_a_server_without_a_key_does_not_start(monkeypatch):
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    with pytest.raises(RuntimeError, match="VLLM_API_KEY is not set"):
        RequireKey(_app)
