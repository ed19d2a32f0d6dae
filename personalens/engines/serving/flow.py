"""How many requests a server engine (server.py) keeps in flight: about what its server runs at once.

vLLM runs a request only while its KV cache holds the request's tokens; the others wait in the
server's queue. Waiting there costs no timeout (replies are streamed, server_http.py), but every
waiting request holds a connection, and all of them are aborted at once if this process stops. So one
generate() keeps at most

    the server's KV cache tokens / the call's mean (prompt tokens + max_tokens)

requests in flight (as if every reply ran to its budget, so the ones sent can all run to the end),
never more than `server.max_concurrency` (a managed server's max_num_seqs) and never fewer than one.
The KV cache size is the server's own (vLLM's /metrics, `vllm:cache_config_info`: num_gpu_blocks x
block_size); a server that does not report it gets `max_concurrency`. Prompt tokens are estimated
from the messages' characters at the tokens per character this engine's server has reported so far.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from personalens.engines.base import Request

CACHE_INFO = "vllm:cache_config_info"
# before the first reply: fewer characters per token than English text's ~4, so that the first
# call's prompts are not underestimated
START_CHARS_PER_TOKEN = 3.0


def kv_cache_tokens(metrics: str) -> int | None:
    """Tokens the server's KV cache holds (every engine of it together), from its /metrics text;
    None when it does not say (not vLLM, or its cache not sized yet)."""
    total = 0
    try:
        for family in text_string_to_metric_families(metrics):
            for sample in family.samples if family.name == CACHE_INFO else ():
                blocks, size = sample.labels.get("num_gpu_blocks", ""), sample.labels.get("block_size", "")
                if blocks.isdigit() and size.isdigit():
                    total += int(blocks) * int(size)
    except ValueError:  # not Prometheus text
        return None
    return total or None


@dataclass
class PromptSizes:
    """Prompt tokens per character of the messages, learned from the server's usage reports."""

    chars: int = 0
    tokens: int = 0

    def add(self, request: Request, prompt_tokens: int) -> None:
        if prompt_tokens > 0:
            self.chars += prompt_chars(request)
            self.tokens += prompt_tokens

    def estimate(self, request: Request) -> int:
        chars = prompt_chars(request)
        if self.chars and self.tokens:
            return round(chars * self.tokens / self.chars)
        return round(chars / START_CHARS_PER_TOKEN)


def prompt_chars(request: Request) -> int:
    return sum(len(str(m.get("content") or "")) for m in request.messages)


def in_flight(kv_tokens: int | None, needs: Sequence[int], limit: int) -> int:
    """Requests to keep in flight: as many of mean size `needs` (tokens each may hold at its end) as
    `kv_tokens` holds, between 1 and `limit`; `limit` when the KV cache size is not known."""
    if kv_tokens is None or not needs:
        return limit
    mean = max(1.0, sum(needs) / len(needs))
    return max(1, min(limit, int(kv_tokens // mean)))
