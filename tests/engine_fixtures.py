"""Shared helpers for the engine tests: the embedded model's settings for tests, and requests."""

from __future__ import annotations

import re
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from personalens.engines.base import Request, Sampling
from personalens.engines.models.config import ModelConfig

# small and quick to start: a fixed 512 MiB KV cache, no torch.compile; the in-process engine and a
# `vllm serve` may run side by side
TEST_KV_CACHE_BYTES = 512 * 2**20
TEST_MAX_MODEL_LEN = 2048

TINY_MODEL = ModelConfig(
    name="SmolLM2-135M-Instruct",
    path=None,
    gpu_memory_utilization=0.15,
    kv_cache_memory_bytes=TEST_KV_CACHE_BYTES,
    max_model_len=TEST_MAX_MODEL_LEN,
    enforce_eager=True,
    max_num_seqs=32,
    block_size=32,
    cpu_reserved_cores=0,
)

# every model setting that reaches vLLM away from its default: what a managed server's command line and
# vLLM's own parser of it are checked with (test_engine_layout.py, test_managed_vllm.py)
EVERY_SETTING = ModelConfig(
    "served",
    tokenizer="/tok",
    dtype="bfloat16",
    tensor_parallel_size=2,
    gpu_memory_utilization=0.5,
    kv_cache_memory_bytes=123,
    kv_cache_dtype="fp8",
    quantization="fp8",
    kv_offload_gib=4.0,
    max_model_len=4096,
    enable_prefix_caching=False,
    enforce_eager=True,
    enable_chunked_prefill=False,
    seed=7,
    max_num_seqs=16,
    max_num_batched_tokens=8192,
    block_size=32,
    cpu_reserved_cores=0,
    load_format="dummy",
    rope_scaling=(("factor", 4.0), ("original_max_position_embeddings", 1024), ("rope_type", "yarn")),
    speculative=(("method", "ngram"), ("num_speculative_tokens", 3), ("prompt_lookup_max", 4)),
)

SCORE_GRAMMAR = 'root ::= "Score: " [1-5] "\\n" [a-zA-Z ,.]*'
SCORE_PATTERN = re.compile(r"Score: [1-5]\n[a-zA-Z ,.]*")


def tagged_grammar(tag: int) -> str:
    """A grammar whose output starts with `Item <tag>:`, to tell batched replies apart."""
    return f'root ::= "Item {tag}:" [a-z ]*'


def chat(text: str, *, system: str | None = None, grammar: str | None = None, **sampling) -> Request:
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
    return Request(messages=messages, sampling=Sampling(**sampling), grammar=grammar)


def assert_prefix_cache_serves_a_repeat(engine, topic: str) -> None:
    """A long prompt sent twice: the second time most of it comes from the prefix cache. `topic`
    should be new to the engine, so that the first call starts cold."""
    prompt = f"Describe the {topic} in detail. " + " ".join(f"Fact {i} about the {topic}." for i in range(80))
    (first,) = engine.generate([chat(prompt, max_tokens=2)])
    (second,) = engine.generate([chat(prompt, max_tokens=2)])
    assert first.prompt_tokens == second.prompt_tokens > 200
    assert first.cached_tokens < first.prompt_tokens // 2 < second.cached_tokens < second.prompt_tokens


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Impostor(BaseHTTPRequestHandler):
    def do_GET(self):
        self.server.asked.append(self.path)
        self.send_response(200 if self.path == "/health" else 401)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def start_impostor() -> ThreadingHTTPServer:
    """Another server on a free port, as another job's on a shared node: healthy, but it refuses
    every other route (401). Its `asked` lists the paths it was asked for; `shutdown()` and
    `server_close()` end it."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Impostor)
    server.asked = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
