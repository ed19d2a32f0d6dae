"""How much of the assistant's own earlier thinking goes back into its prompt: its model config's
`history_reasoning` (docs/models.md). `family` and `none` give its chat turns the answers alone;
`last` adds the thinking of its latest reply, `all` that of every earlier reply, to its chat turns
as their `reasoning_content` (engines/chat/messages.py `with_reasoning`), which its chat template
renders or drops as its family does. Only the assistant's own prompt ever carries it: the user
agent's prompt and the judge's are made from the turns' answers.

`last` and `all` are refused before any model loads where they would mean `none`: where the
assistant's prompts carry the dialogue as text in one user message (the `official` template set),
and where the model's chat template drops the thinking of earlier turns (DeepSeek-R1's and Qwen3's
do: `template_keeps_thinking`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from personalens.engines.base import Message
from personalens.engines.chat.messages import template_keeps_thinking, with_reasoning
from personalens.errors import PersonalensError
from personalens.simulate.dialogue import TurnRecord

KEPT = ("last", "all")  # the settings that give the model its own thinking again


def with_own_thinking(messages: Sequence[Message], turns: Sequence[TurnRecord], keep: str) -> list[Message]:
    """The assistant's prompt `messages` with the thinking of its earlier replies among `turns` (the
    dialogue so far) that `keep` gives back, on its chat turns, which follow its turns in order."""
    out = list(messages)
    if keep not in KEPT:
        return out
    own = [t for t in turns if t.role == "assistant"]
    chat = [i for i, m in enumerate(out) if m["role"] == "assistant"]
    if len(chat) != len(own):
        raise PersonalensError(
            f"history_reasoning {keep}: the assistant's prompt holds {len(chat)} chat turns of its own for "
            f"{len(own)} replies (its template set writes the dialogue as text)"
        )
    for index in range(len(own)) if keep == "all" else range(len(own))[-1:]:
        if own[index].reasoning:
            out[chat[index]] = with_reasoning(out[chat[index]], own[index].reasoning)
    return out


def check_history(
    keep: str, model: str, chat_turns: bool, chat_template: str | None, variables: dict[str, Any]
) -> None:
    """Refuses `last` or `all` in one line where the assistant `model` would not see what it says:
    `chat_turns` false (its prompts carry the dialogue as text), no chat template to check, or a
    template that drops the thinking of earlier turns."""
    if keep not in KEPT:
        return
    where = f"assistant.history_reasoning={keep} ({model})"
    if not chat_turns:
        raise PersonalensError(
            f"{where}: this template set writes the dialogue into one user message of the assistant's prompt, "
            "as text with the answers alone; use fidelity=paper (chat turns), or family or none"
        )
    if not chat_template:
        raise PersonalensError(
            f"{where}: the model's chat template is not found here, so whether it keeps earlier thinking cannot be "
            "checked; set the model's tokenizer to a folder with its tokenizer files"
        )
    if not template_keeps_thinking(chat_template, keep, **variables):
        raise PersonalensError(
            f"{where}: its chat template drops the thinking of earlier assistant turns (given as their "
            "reasoning_content), so it would see its answers alone; use family or none"
        )
