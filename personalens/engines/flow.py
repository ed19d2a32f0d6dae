"""How many requests an engine keeps in flight: about what its KV cache runs at once. The rule of
every server engine (serving/engine.py), and of an in-process engine that is one copy of a model
beside server copies (vllm/local.py `capped`), so that every copy of a model is capped alike.

vLLM runs a request only while its KV cache holds the request's tokens; the others wait in the
server's queue. Waiting there costs no timeout (replies are streamed, serving/http.py), but every
waiting request holds a connection, and all of them are aborted at once if this process stops. So one
generate() keeps at most

    the server's KV cache tokens / the call's mean (prompt tokens + max_tokens)

requests in flight, never more than `server.max_concurrency` (a managed server's max_num_seqs) and
never fewer than one. A request's reply is counted at the tokens replies of its kind (its max_tokens
and whether a grammar constrains it: in practice its role) have taken so far, at most its max_tokens,
and at max_tokens before the first such reply; so a judge whose replies take a few hundred of its
4,000 tokens gets many more requests in flight once its first replies are in. The prompt prefix
every request of the call shares (instructions, a system prompt) is counted once: the server's prefix
cache holds one copy of it. The KV cache size is the server's own (vLLM's /metrics,
`vllm:cache_config_info`: num_gpu_blocks x block_size); a server that does not report it gets
`max_concurrency`. Prompt tokens are estimated from the messages' characters at the tokens per
character this engine's server has reported so far. Every copy of a model (replicated.py) is capped
by this rule against its own cache: a server copy's from its /metrics, the in-process copy's from
its vLLM engine (num_gpu_blocks x block_size), at most its `max_num_seqs`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field

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


def _kind(request: Request) -> tuple[int, bool]:
    """What tells requests of one role apart: their reply budget and whether a grammar constrains it."""
    return request.sampling.max_tokens, request.grammar is not None


@dataclass
class ReplySizes:
    """Completion tokens per reply, learned per kind of request (`_kind`) from the server's replies."""

    seen: dict[tuple[int, bool], tuple[int, int]] = field(default_factory=dict)  # kind -> (replies, tokens)

    def add(self, request: Request, completion_tokens: int) -> None:
        replies, tokens = self.seen.get(_kind(request), (0, 0))
        self.seen[_kind(request)] = (replies + 1, tokens + completion_tokens)

    def expect(self, request: Request) -> int:
        """The mean of its kind's replies so far, at most its max_tokens; max_tokens before any."""
        replies, tokens = self.seen.get(_kind(request), (0, 0))
        budget = request.sampling.max_tokens
        return min(budget, max(1, round(tokens / replies))) if replies else budget


def shared_prefix_chars(requests: Sequence[Request]) -> int:
    """Characters of the messages' text that every request of the call begins with."""
    if len(requests) < 2:
        return 0
    texts = ["\n".join(str(m.get("content") or "") for m in r.messages) for r in requests]
    return len(os.path.commonprefix(texts))


def needs(requests: Sequence[Request], prompts: PromptSizes, replies: ReplySizes) -> tuple[int, list[int]]:
    """The tokens the call's shared prefix holds once, and each request's other tokens at its end
    (its prompt beyond the prefix and its expected reply)."""
    shared = round(prompts.estimate(requests[0]) * shared_prefix_chars(requests) / max(1, prompt_chars(requests[0])))
    return shared, [max(0, prompts.estimate(r) - shared) + replies.expect(r) for r in requests]


def in_flight(kv_tokens: int | None, needs: Sequence[int], limit: int, shared: int = 0) -> int:
    """Requests to keep in flight: as many of mean size `needs` (tokens each may hold at its end) as
    `kv_tokens` holds beside one copy of the `shared` prefix, between 1 and `limit`; `limit` when the
    KV cache size is not known."""
    if kv_tokens is None or not needs:
        return limit
    mean = max(1.0, sum(needs) / len(needs))
    return max(1, min(limit, int(max(0, kv_tokens - shared) // mean)))
