"""A reasoning reply with a thinking budget, made in two requests so that its thinking is at most the
budget and its answer at most the protocol's `max_tokens`, however early or late the thinking ends,
in process and through any OpenAI-compatible vLLM server (with or without a reasoning parser), for
every family (gpt-oss's harmony channels too, whose thinking vLLM cannot end by force):

1. the thinking request: the prompt, `max_tokens` the budget, stopped at the family's end-of-thinking
   marker (a stop string, kept in the output; no grammar);
2. the answer request: the prompt's ids, the thinking's and, where the budget cut the thinking, the
   family's end marker after them, continued with the request's own sampling, grammar and `max_tokens`.
   The engine's prefix cache holds the prompt and the thinking, so it costs little more than one.

What the thinking request's reply decides (`step`): thinking that ended is continued (CONTINUE);
thinking that the budget cut is ended by force and continued (FORCE); thinking that the model stopped
without ending it has no answer (END: finish_reason `thinking`, engines/chat/reasoning.py); a reply
with no thinking at all is an answer, kept where it ended by itself within `max_tokens` and needs no
grammar (KEEP), else asked again as the original request at the answer's `max_tokens` (AGAIN). The
two replies are then one generation (`joined`): the thinking's text and tokens, the answer's text and
finish_reason, the tokens of both."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from personalens.engines.base import Generation, Request, Sampling
from personalens.engines.chat import harmony
from personalens.engines.chat.reasoning import PAIRS, THINKING, Split, with_split, without_markers

CONTINUE, FORCE, END, KEEP, AGAIN = "continue", "force", "end", "keep", "again"


@dataclass(frozen=True)
class Markers:
    """A family's thinking markers as text: `stops` end a thinking request; `forced` is what ends a
    thinking the budget cut; `skip` is what a budget of 0 puts after a prompt that did not open the
    thinking (the model's own empty thinking block)."""

    stops: tuple[str, ...]
    forced: str
    skip: str


# gpt-oss: the analysis channel (and any commentary) is the thinking, the final channel's header ends it
HARMONY = Markers(
    stops=("<|channel|>final<|message|>",),
    forced="<|end|><|start|>assistant<|channel|>final<|message|>",
    skip="<|channel|>final<|message|>",
)


def markers(parser: str | None, start: str | None = None, end: str | None = None) -> Markers:
    """The markers of a model's reasoning parser (its name; `start`/`end`: the parser's own marker
    strings, where it was loaded), else those of the `<think>` families (engines/chat/reasoning.py's PAIRS)."""
    if parser == harmony.PARSER:
        return HARMONY
    if end:
        return Markers((end,), end, f"{start or ''}{end}")
    first_start, first_end = PAIRS[0]
    return Markers(tuple(e for _, e in PAIRS), first_end, first_start + first_end)


def budgeted(request: Request) -> bool:
    """Whether a request is made in two (its sampling has a thinking budget)."""
    return request.sampling.thinking_budget is not None


def thinking_sampling(sampling: Sampling) -> Sampling:
    """The thinking request's sampling: the request's, `max_tokens` its thinking budget, no lower bound."""
    return dataclasses.replace(
        sampling, max_tokens=int(sampling.thinking_budget or 0), thinking_budget=None, min_tokens=0
    )


def answer_request(request: Request, prompt_ids: Sequence[int] | None) -> Request:
    """The answer request: the original's sampling (its own max_tokens, the answer's) without a
    budget, continuing `prompt_ids` (None: the original prompt, asked again)."""
    sampling = dataclasses.replace(request.sampling, thinking_budget=None)
    if prompt_ids is None:
        return dataclasses.replace(request, sampling=sampling)
    return dataclasses.replace(request, sampling=sampling, prompt_ids=list(prompt_ids))


def thought(gen: Generation) -> bool:
    """Whether a split reply thought at all (it has thinking text or tokens, or stopped inside it)."""
    return bool(gen.reasoning) or bool(gen.reasoning_tokens) or gen.finish_reason == THINKING


def step(request: Request, gen: Generation, cut: bool) -> str:
    """What follows a thinking request's split reply `gen`; `cut`: it stopped at the budget (finish
    "length" before the split)."""
    if gen.error is not None:
        return END
    if not thought(gen):
        alone = not cut and not request.grammar and gen.completion_tokens <= request.sampling.max_tokens
        return KEEP if alone else AGAIN
    if gen.finish_reason != THINKING:
        return CONTINUE
    return FORCE if cut else END


def continued(prompt_ids: Sequence[int], output_ids: Sequence[int], forced: Sequence[int]) -> list[int]:
    """The answer request's prompt: the thinking request's prompt and output, and the forced marker."""
    return [*prompt_ids, *output_ids, *forced]


class Chains:
    """An engine's two-request replies in flight, by request id: the thinking requests with the request
    each was made for, the answer requests with the thinking request's id and reply, and the id of the
    request that now runs for each thinking request's id (what an interrupted call aborts), and the
    answer requests that continue a thinking's ids (their replies are read whole: `read_answer`)."""

    def __init__(self) -> None:
        self.thinking: dict[str, Request] = {}
        self.answers: dict[str, tuple[str, Generation]] = {}
        self.running: dict[str, str] = {}
        self.continuing: set[str] = set()

    def answering(self, answer_id: str, first_id: str, first: Generation, continues: bool = True) -> None:
        """`continues`: the answer request continues the thinking's ids (not the prompt asked again)."""
        self.answers[answer_id] = (first_id, first)
        self.running[first_id] = answer_id
        if continues:
            self.continuing.add(answer_id)

    def finished(self, request_id: str, gen: Generation) -> tuple[str, Generation] | None:
        """An answer request's reply joined to its thinking, under the thinking request's id; None
        where `request_id` is no answer request."""
        if request_id not in self.answers:
            return None
        first_id, first = self.answers.pop(request_id)
        self.running.pop(first_id, None)
        self.continuing.discard(request_id)
        return first_id, joined(first, gen)

    def forget(self, request_ids: Sequence[str]) -> list[str]:
        """The ids that run for `request_ids` (their answer requests' where one runs), forgotten."""
        out = []
        for request_id in request_ids:
            self.thinking.pop(request_id, None)
            running = self.running.pop(request_id, request_id)
            self.answers.pop(running, None)
            self.continuing.discard(running)
            out.append(running)
        return out


def read_answer(gen: Generation) -> Generation:
    """An answer request's reply as read: all its text is the answer, since it follows the thinking's
    end (split again, an end marker the model wrote inside its answer would make the words before it
    thinking, and an answer with nothing after the marker no answer); markers in it are removed."""
    if gen.error is not None:
        return gen
    return dataclasses.replace(gen, text=without_markers(gen.text))


def joined(thinking: Generation, answer: Generation) -> Generation:
    """One generation of a thinking request's reply and its answer request's: the thinking's text and
    tokens, the answer's text, finish_reason and tokens (a refused answer request refuses the reply);
    an answer that is empty at its max_tokens is none (reasoning.py's `with_split`). A first reply that
    did not think (AGAIN, or a budget of 0) leaves the answer as it is."""
    if answer.error is not None:
        return dataclasses.replace(answer, prompt_tokens=thinking.prompt_tokens)
    if not thought(thinking):
        return answer
    gen = Generation(
        text=answer.text,
        prompt_tokens=thinking.prompt_tokens,
        completion_tokens=thinking.completion_tokens + answer.completion_tokens,
        cached_tokens=thinking.cached_tokens,
        finish_reason=answer.finish_reason,
    )
    tokens = thinking.completion_tokens
    return with_split(gen, Split(answer.text.strip(), thinking.reasoning, True, tokens))
