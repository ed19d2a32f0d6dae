"""Chat formats: whether a model's chat template accepts a system role, and folding the system
prompt into the first user turn for templates that do not (Mistral-7B-Instruct-v0.2, Mixtral)."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from jinja2 import Template, TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from personalens.engines.base import Message
from personalens.engines.chat.dates import strftime_now

# rendered into a probe conversation; a template that keeps the system role keeps this text
_PROBE_SYSTEM = "personalens-probe-system-prompt"
_PROBE_USER = "personalens-probe-user-turn"


class ChatTemplateError(ValueError):
    """The chat template cannot render even a plain user turn, so nothing can be decided from it."""


def _raise_exception(message: str) -> None:
    # Hugging Face templates call raise_exception() to reject a conversation (Mistral: system role)
    raise TemplateError(message)


def render_chat(chat_template: str, messages: list[Message], **variables: Any) -> str:
    """Renders a conversation the way transformers renders chat templates (with a generation prompt);
    `variables` are the tokenizer's special tokens (bos_token, eos_token, ...; empty when not given)
    and the model's chat_template_kwargs (enable_thinking, ...)."""
    return _compiled(chat_template).render(
        messages=messages, add_generation_prompt=True, **{"bos_token": "", "eos_token": "", **variables}
    )


@functools.lru_cache(maxsize=16)
def _compiled(chat_template: str) -> Template:
    """A chat template compiled once: compiling it costs far more than rendering one prompt."""
    # the same Jinja settings transformers uses for chat templates
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = strftime_now  # Llama 3.x's and gpt-oss's templates: the run's date
    return env.from_string(chat_template)


def template_supports_system_role(chat_template: str) -> bool:
    """True when the template renders a system message and keeps its text."""
    user = {"role": "user", "content": _PROBE_USER}
    try:
        render_chat(chat_template, [user])
    except Exception as err:  # any failure here means the probe itself is meaningless
        raise ChatTemplateError(
            f"the chat template fails on a single user message ({err}); "
            "set the model's system_role to true or false instead of auto"
        ) from err
    try:
        rendered = render_chat(chat_template, [{"role": "system", "content": _PROBE_SYSTEM}, user])
    except Exception:
        return False
    return _PROBE_SYSTEM in rendered


def resolve_system_role(setting: bool | str, chat_template: str | None) -> bool:
    """The config's `system_role` (true | false | "auto") decided against the model's chat template."""
    if isinstance(setting, bool):
        return setting
    if setting != "auto":
        raise ValueError(f"system_role must be true, false or auto, got {setting!r}")
    if not chat_template:
        raise ChatTemplateError(
            "system_role is auto but the tokenizer has no chat template; "
            "use an instruction-tuned model or a tokenizer that ships one"
        )
    return template_supports_system_role(chat_template)


def fold_system_prompt(messages: Sequence[Message]) -> list[Message]:
    """Moves a leading system message into the first user turn (or a new user turn before the first
    assistant turn), keeping user/assistant alternation."""
    if not messages or messages[0]["role"] != "system":
        return list(messages)
    system, rest = messages[0]["content"], list(messages[1:])
    if rest and rest[0]["role"] == "user":
        return [{"role": "user", "content": f"{system}\n\n{rest[0]['content']}"}, *rest[1:]]
    return [{"role": "user", "content": system}, *rest]


def format_messages(messages: Sequence[Message], system_role: bool) -> list[Message]:
    """The conversation as the model's chat template accepts it."""
    return list(messages) if system_role else fold_system_prompt(messages)


# carried by the probe conversation's assistant turns as their thinking
_PROBE_THINKING = ("personalens-probe-thinking-one", "personalens-probe-thinking-two")


def with_reasoning(message: Message, thinking: str) -> Message:
    """An assistant message with its thinking in the fields chat templates and vLLM read:
    `reasoning_content` (Hugging Face templates: Qwen3, ...; vLLM's server takes it as `reasoning`)
    and `reasoning` (vLLM's chat parsing in process, which passes both to the template)."""
    return {**message, "reasoning_content": thinking, "reasoning": thinking}


def template_keeps_thinking(chat_template: str, keep: str, **variables: Any) -> bool:
    """Whether the template renders the thinking of earlier assistant turns that a dialogue's prompt
    gives it: `keep` "last" (the latest reply's) or "all" (every earlier reply's), probed on two
    exchanges and the next user turn, as the assistant's prompts end."""
    given = _PROBE_THINKING[1:] if keep == "last" else _PROBE_THINKING
    messages: list[Message] = []
    for index, thinking in enumerate(_PROBE_THINKING):
        messages.append({"role": "user", "content": f"{_PROBE_USER}-{index}"})
        answer = {"role": "assistant", "content": f"personalens-probe-answer-{index}"}
        messages.append(with_reasoning(answer, thinking) if thinking in given else answer)
    messages.append({"role": "user", "content": _PROBE_USER})
    rendered = render_chat(chat_template, messages, **variables)
    return all(thinking in rendered for thinking in given)
