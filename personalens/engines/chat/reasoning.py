"""A reasoning model's reply split into its thinking and its answer, so that only the answer ever
reaches another party (the user agent, the assistant, the judge) and the thinking is kept and counted.

Two ways, one result (`Split`):
- on the output token ids, with vLLM's reasoning parser named in the model's config (`split_ids`):
  the parser's `is_reasoning_end` says whether the thinking ended, its `extract_content_ids` gives
  the answer's ids. Offline `vllm.LLM` calls do not split (vLLM issue #17292), so the in-process
  engine does it here;
- on the text, where no parser is configured or the engine returns only text (`split_text`): a
  closed `<think>..</think>` block, an unclosed one (the reply stopped inside its thinking), the
  `</think>`-only form of templates that open `<think>` in the prompt, and Mistral's
  `[THINK]..[/THINK]`.

A reply whose thinking never ended has no answer: its `answer` is empty and `closed` false, and the
engine reports it with `finish_reason` THINKING, never as an answer (docs/fidelity.md). So is a reply
whose thinking ended but that was cut at its max_tokens before any answer (`with_split`): an empty
answer is no reply, in process and through servers alike (docs/models.md, "How a reasoning reply
ends")."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from personalens.engines.base import Generation

THINKING = "thinking"  # a Generation's finish_reason: the reply stopped before its thinking ended

# (start, end) of the thinking blocks the text fallback knows
PAIRS = (("<think>", "</think>"), ("[THINK]", "[/THINK]"))
# what marks thinking in a text (the report's leak check): the pairs above, and the harmony format's
# channel tokens (gpt-oss) and other families' blocks, which must never reach another party either
MARKERS = (
    *(marker for pair in PAIRS for marker in pair),
    "<|channel|>",
    "<|message|>",
    "<seed:think>",
    "</seed:think>",
    "◁think▷",
    "◁/think▷",
)


@dataclass(frozen=True)
class Split:
    answer: str
    reasoning: str = ""
    closed: bool = True  # False: the reply stopped inside its thinking (it then has no answer)
    reasoning_tokens: int | None = None  # tokens before the answer; None where only the text was seen


def opens_thinking(prompt_tail: str, pairs: Sequence[tuple[str, str]] = PAIRS) -> bool:
    """Whether a prompt (its end, as text) leaves the model inside a thinking block, as templates
    that put `<think>` in the generation prompt do (DeepSeek-R1 distills, recent Qwen3)."""
    return any(start and prompt_tail.rfind(start) > prompt_tail.rfind(end) for start, end in pairs)


def split_text(text: str, opened: bool = False) -> Split:
    """The thinking and answer of a reply's text; `opened`: the prompt left the model thinking."""
    for start, end in PAIRS:
        if end in text:  # the answer follows the last end marker
            head, _, answer = text.rpartition(end)
            return Split(answer.lstrip(), without_markers(head))
        if start in text:
            return Split("", without_markers(text), closed=False)
    if opened:
        return Split("", text.strip(), closed=False)
    return Split(text)


def thinking_tokens(
    split: Split, text: str, output_ids: Sequence[int], decode: Callable[[Sequence[int]], str]
) -> Split:
    """A split of a reply's `text` with its thinking counted on the reply's ids: the fewest first ids
    whose text (`decode`) reaches past the last end-of-thinking marker (a marker may be one token or
    several), or every id when the thinking never ended."""
    ids = list(output_ids)
    if not split.closed:
        return dataclasses.replace(split, reasoning_tokens=len(ids))
    ends = [text.rfind(end) + len(end) for _, end in PAIRS if end in text]
    if not ends:
        return dataclasses.replace(split, reasoning_tokens=0)
    reach, low, high = max(ends), 1, len(ids)
    while low < high:  # decoded prefixes only grow: the first long enough
        middle = (low + high) // 2
        if len(decode(ids[:middle])) >= reach:
            high = middle
        else:
            low = middle + 1
    return dataclasses.replace(split, reasoning_tokens=low)


def split_ids(
    parser: Any, output_ids: Sequence[int], decode: Callable[[Sequence[int]], str], opened: bool = False
) -> Split:
    """The thinking and answer of a reply's token ids with a vLLM reasoning parser (any of
    `vllm.reasoning`'s); `decode` turns ids into text without special tokens; `opened`: the prompt
    left the model thinking. Thinking tokens are the reply's tokens before its answer, markers
    included."""
    ids = list(output_ids)
    if parser.is_reasoning_end(ids):
        answer = list(parser.extract_content_ids(ids))
        thinking = ids[: len(ids) - len(answer)]
        return Split(decode(answer).lstrip(), without_markers(decode(thinking)), True, len(thinking))
    start = getattr(parser, "reasoning_start_str", None)
    if opened or (start and start in decode_raw(parser, ids)):
        return Split("", without_markers(decode(ids)), closed=False, reasoning_tokens=len(ids))
    return Split(decode(ids), reasoning_tokens=0)


def decode_raw(parser: Any, ids: Sequence[int]) -> str:
    """The ids as text with special tokens kept (markers are special tokens in some tokenizers)."""
    return parser.model_tokenizer.decode(list(ids), skip_special_tokens=False)


def without_markers(text: str) -> str:
    """The text with every thinking marker (MARKERS) removed, stripped."""
    for marker in MARKERS:
        text = text.replace(marker, "")
    return text.strip()


def leaks(text: str) -> int:
    """How many thinking markers a text holds (0 for every text sent to another party)."""
    return sum(text.count(marker) for marker in MARKERS)


def load_parser(name: str, tokenizer: Any, chat_template_kwargs: dict[str, Any]) -> Any:
    """vLLM's reasoning parser `name`, built with the tokenizer and the same template kwargs the
    prompts are rendered with (the Qwen3 parser assumes thinking is on unless told otherwise)."""
    from vllm.reasoning import ReasoningParserManager

    parser_cls = ReasoningParserManager.get_reasoning_parser(name)
    return parser_cls(tokenizer, chat_template_kwargs=dict(chat_template_kwargs))


def answered(split: Split, finish_reason: str | None) -> bool:
    """Whether a split reply has an answer to send on: its thinking ended, and a reply that thought was
    not cut at its max_tokens ("length") before a word of answer (a model that did not think keeps
    whatever it wrote)."""
    thought = bool(split.reasoning) or bool(split.reasoning_tokens)
    return split.closed and (bool(split.answer.strip()) or finish_reason != "length" or not thought)


def with_split(gen: Generation, split: Split) -> Generation:
    """A generation whose text is the answer alone, with its thinking beside it; one that stopped
    inside its thinking, or after it but with no answer before its max_tokens, finishes as THINKING."""
    tokens = split.reasoning_tokens
    if tokens is None:
        tokens = None if split.reasoning or not split.closed else 0
    return dataclasses.replace(
        gen,
        text=split.answer,
        reasoning=split.reasoning,
        reasoning_tokens=tokens,
        finish_reason=gen.finish_reason if answered(split, gen.finish_reason) else THINKING,
    )
