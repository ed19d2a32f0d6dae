"""The one interface every engine implements: batched chat generation."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from personalens.errors import PersonalensError

Message = dict  # {"role": "system" | "user" | "assistant", "content": str}


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0
    max_tokens: int = 800
    top_p: float = 1.0
    seed: int | None = None
    min_tokens: int = 0  # benchmarks set min_tokens == max_tokens to fix every reply's length
    # a reasoning model's most thinking tokens, before an answer of at most max_tokens (the reply is then two
    # requests: engines/chat/budget.py). None: no budget, the thinking counts against max_tokens
    thinking_budget: int | None = None
    # the rest of a model card's sampling (config/sampling.py); None leaves vLLM's default and is not sent
    top_k: int | None = None
    min_p: float | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = None

    @property
    def reply_tokens(self) -> int:
        """The most tokens a reply generates: its thinking budget and its answer's max_tokens."""
        return self.max_tokens + (self.thinking_budget or 0)

    def extras(self) -> dict[str, float | int]:
        """The optional sampling values that are set, by vLLM's names (SamplingParams and the server's
        request body alike)."""
        return {k: getattr(self, k) for k in OPTIONAL if getattr(self, k) is not None}


OPTIONAL = ("top_k", "min_p", "presence_penalty", "repetition_penalty")


def sampling_from(section: Mapping[str, Any], max_tokens: int | None = None) -> Sampling:
    """Sampling from a config section (temperature, max_tokens, top_p, thinking_budget and the optional
    top_k, min_p, presence_penalty, repetition_penalty); `max_tokens` replaces the section's where a stage
    keeps its budget elsewhere."""
    budget = section.get("thinking_budget")
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 0):
        raise PersonalensError(f"thinking_budget: expected null or a number of tokens >= 0, got {budget!r}")
    return Sampling(
        temperature=float(section["temperature"]),
        max_tokens=int(section["max_tokens"] if max_tokens is None else max_tokens),
        top_p=float(section.get("top_p", 1.0)),
        thinking_budget=budget,
        **{k: section[k] for k in OPTIONAL if section.get(k) is not None},
    )


def derive_seed(seed: int, *parts: object) -> int:
    """A request's sampling seed from the run's seed and what identifies the request: stable across
    processes and machines (unlike hash())."""
    digest = hashlib.sha256("|".join(map(str, (seed, *parts))).encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


@dataclass(frozen=True)
class Request:
    messages: Sequence[Message]
    sampling: Sampling
    grammar: str | None = None  # an EBNF (GBNF) grammar the output must match
    # the prompt as the engine's own tokenizer makes it from `messages` (engines/chat/token_ids.py); an
    # in-process engine then skips rendering and tokenizing; a server engine (serving/engine.py) and an engine
    # without a `chat_tokenizer` send `messages`
    prompt_ids: Sequence[int] | None = None
    # what identifies the conversation the request belongs to (`conversation`): a model's copies
    # (engines/replicated.py) answer a conversation's requests on one copy, whose prefix cache holds
    # its history; None: any copy
    affinity: str | None = None


def conversation(*key: object) -> str:
    """A request's `affinity` from what identifies its conversation (a dialogue's key)."""
    return "|".join(map(str, key))


@dataclass(frozen=True)
class Generation:
    text: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0  # prompt tokens served from the prefix cache; 0 where the engine does not say
    # why the reply stopped: "stop", "length" (cut at max_tokens), or "thinking" (it stopped inside its
    # thinking, so it has no answer: engines/chat/reasoning.py)
    finish_reason: str | None = None
    # set when the engine refused this one request (its message; the text is then empty); the other
    # requests of the call are answered as usual
    error: str | None = None
    # a reasoning model's thinking, split from the answer in `text` (engines/chat/reasoning.py), and the
    # tokens it took of completion_tokens (None where the engine saw thinking but could not count it)
    reasoning: str = ""
    reasoning_tokens: int | None = 0

    @property
    def answer_tokens(self) -> int | None:
        """Completion tokens of the answer alone (None where the thinking's are not known)."""
        return None if self.reasoning_tokens is None else self.completion_tokens - self.reasoning_tokens

    @property
    def over_context(self) -> bool:
        """Refused because its prompt does not fit the model's context (vLLM's message, in process
        and from its server)."""
        return self.error is not None and _OVER_CONTEXT.search(self.error) is not None


# vLLM's refusals of a prompt that leaves no room in the context: too long a prompt (in process and
# from its server), and its server's answer to a prompt that fills the context exactly (it lowers
# max_tokens to what is left, and refuses what leaves none)
_OVER_CONTEXT = re.compile(
    r"maximum context length|exceeds model's maximum|max_tokens must be at least 1", re.IGNORECASE
)


class RefusedAll(PersonalensError):
    """Every request of a call was refused for one reason: a fault of the configuration (a chat
    template that rejects a role, a missing grammar backend, a bad sampling option), not of any
    request, which would otherwise mark every dialogue failed."""


def check_refusals(engine: str, generations: Sequence[Generation]) -> None:
    """Raises `RefusedAll` when two or more requests were all refused with one message, none of
    them for too long a prompt (which is about each request)."""
    reasons = {g.error for g in generations}
    if len(generations) < 2 or len(reasons) != 1 or None in reasons or generations[0].over_context:
        return
    raise RefusedAll(f"{engine} refused all {len(generations)} requests of a call for one reason: {reasons.pop()}")


def rejected(message: str, prompt_tokens: int = 0) -> Generation:
    """The answer to a request the engine refused: no text, the reason kept."""
    return Generation(text="", prompt_tokens=prompt_tokens, completion_tokens=0, error=message)


def dropped() -> Generation:
    """The answer to a request the engine stopped running without ever reporting it finished."""
    return rejected("vLLM dropped the request without a reply")


# told, while a call runs, how many more of its requests have finished and how many tokens they
# generated (for progress bars)
OnFinished = Callable[[int, int], None]


class Engine(Protocol):
    """Generates one reply per request, in one batched call, in request order. An engine may call
    `on_finished` as requests finish during the call; one that does not still returns them all.
    A request the engine refuses (too long a prompt, a bad parameter) comes back as a `rejected`
    generation; only a failure of the engine itself (a dead server, out of memory) raises, and a
    call whose requests were all refused for one reason (`check_refusals`).
    An engine that knows its model's tokenizer also has `chat_tokenizer` (engines/chat/token_ids.py), so
    callers can hand it `Request.prompt_ids` made incrementally and measure prompts before they are
    sent, and `max_model_len`, its context (None where unknown).
    An engine whose `generate` may run in several threads at once, its calls' requests then sharing
    the engine's batch (a call that starts while another runs joins its batch, as vLLM admits new
    requests at its next step), has `joins_calls = True`; lockstep cohorts then send their calls to it
    without waiting for its running call (simulate/workers.py). Without it, calls run one at a time.
    An engine of a model whose config sets `speculative:` has `speculative = True` and `spec_decode()`,
    vLLM's spec-decode counters so far, which `generate` and `judge` record (engines/spec_decode.py)."""

    name: str  # the model name recorded in outputs

    def generate(self, requests: Sequence[Request], on_finished: OnFinished | None = None) -> list[Generation]: ...


class Submitting(Protocol):
    """An engine that takes requests while it runs (`scheduling=continuous`): `submit` queues
    requests and returns their ids at once; `finished` waits for the engine's next step and returns
    the queued requests that finished in it, with their replies (a refused request among them, as a
    `rejected` generation); `idle` says whether the engine runs none of them any longer, so that a
    request it dropped without reporting it finished is answered (as `dropped`) rather than waited on."""

    name: str

    def submit(self, requests: Sequence[Request]) -> list[str]: ...

    def finished(self) -> list[tuple[str, Generation]]: ...

    def idle(self) -> bool: ...


class Embedder(Protocol):
    """Embeds texts, in one batched call, in order."""

    name: str

    def embed(self, texts: Sequence[str]) -> list[list[float]]: ...
