"""The key check of a managed vLLM server (managed.py), loaded into the server by vLLM's
`--middleware` option: every request but /health must carry the server's key as a bearer token.

vLLM's own key (VLLM_API_KEY, which the server also gets) guards only the /v1, /v2 and /inference
routes; /invocations (the SageMaker route, which serves the same completions), /tokenize, /pooling,
/score and others stay open to anyone on the node (vLLM issue 58144). This guard closes them all.
The key is read from the server's environment; it is compared as a digest in constant time."""

from __future__ import annotations

import hashlib
import hmac
import os

from personalens.engines.vllm.api import SERVER_KEY_ENV

OPEN_PATHS = ("/health",)  # what personalens polls while the server loads; it tells nothing


def _digest(text: bytes) -> bytes:
    return hashlib.sha256(text).digest()


class RequireKey:
    """ASGI middleware: 401 for an HTTP request, and a refused websocket, without `Authorization:
    Bearer <key>`."""

    def __init__(self, app):
        self.app = app
        key = os.environ.get(SERVER_KEY_ENV)
        if not key:
            raise RuntimeError(f"{SERVER_KEY_ENV} is not set: a managed server must not start without a key")
        self._key = _digest(key.encode())

    def _authorized(self, scope) -> bool:
        value = dict(scope.get("headers") or ()).get(b"authorization", b"")
        scheme, _, token = value.partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(_digest(token), self._key)

    async def __call__(self, scope, receive, send):
        kind = scope["type"]
        if kind not in ("http", "websocket") or scope["path"] in OPEN_PATHS or self._authorized(scope):
            return await self.app(scope, receive, send)
        if kind == "websocket":
            return await send({"type": "websocket.close", "code": 1008})
        await send({"type": "http.response.start", "status": 401, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": b'{"error": "Unauthorized"}'})
