"""A model's chat template rendered on a run's own conversations before any engine loads, so that a
template that cannot take them stops the command in one line instead of failing (or failing every
request) once the model has loaded.

The template is read from the tokenizer's files (the model's or its `tokenizer` folder; never the
weights) and rendered by transformers' own Jinja renderer, the one vLLM's chat path calls, with the
tokenizer's special tokens and the config's `chat_template_kwargs`. Each conversation is formatted
as the engines format it (engines/chat/messages.py: a system prompt folded into the first user turn
where `system_role` says so). Refused, each in one line naming the role, the model and the rule:
- the template's own `raise_exception` (Mistral's and Gemma's alternation rule, a system role the
  template does not take);
- a variable the template needs that the config does not give (Jinja's undefined);
- a template that does not parse, or none at all;
- a gpt-oss model (reasoning_parser openai_gptoss) where the harmony encoding that splits its
  replies cannot load (engines/chat/harmony.py)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from personalens.engines.base import Message
from personalens.engines.chat import harmony
from personalens.engines.chat.messages import ChatTemplateError, format_messages, resolve_system_role
from personalens.engines.chat.template_files import chat_template, special_tokens
from personalens.engines.models.config import ModelConfig
from personalens.errors import PersonalensError

_UNDEFINED = re.compile(r"'([A-Za-z_]\w*)' is undefined")


class TemplateRefused(PersonalensError):
    """A role's chat template cannot render one of the run's conversations."""


@dataclass(frozen=True)
class Probe:
    """One conversation of the run, as a role's engine would receive it; `what` names it in errors."""

    what: str
    messages: Sequence[Message]


def tokenizer_folder(config: ModelConfig) -> Path | None:
    """The local folder whose tokenizer files hold the template (hub ids were found in the cache when
    the config was checked); None for an endpoint without a `tokenizer`."""
    if config.tokenizer:
        return Path(config.tokenizer).expanduser()
    if config.engine == "server":
        return None
    from personalens.engines.models.embedded import model_path

    return Path(model_path(config)).expanduser()


def template_variables(folder: Path, config: ModelConfig) -> dict:
    """What a template is rendered with besides the messages: the tokenizer's special tokens and the
    config's chat_template_kwargs."""
    return {**special_tokens(folder), **config.template_kwargs}


def check_template(config: ModelConfig, role: str, probes: Sequence[Probe]) -> str | None:
    """Renders each probe with the role's template: None when all render, or why the template could
    not be checked (an endpoint renders its own); a template that refuses one raises TemplateRefused."""
    where = f"model@{role} ({config.name})"
    if config.engine == "vllm" and config.reasoning_parser == harmony.PARSER:
        try:  # gpt-oss's replies are split with the harmony encoding: refused now where it cannot load
            harmony.encoding()
        except harmony.HarmonyUnavailable as err:
            raise TemplateRefused(f"{where}: {err}") from None
    folder = tokenizer_folder(config)
    if folder is None:
        return (
            "an engine: server endpoint applies its own chat template; set its tokenizer to a local folder to check it"
        )
    if not folder.is_dir():
        raise TemplateRefused(f"{where}: no tokenizer folder {folder} to read its chat template from")
    template = chat_template(folder)
    if not template:
        raise TemplateRefused(
            f"{where}: the tokenizer in {folder} has no chat template (chat_template.jinja, chat_template.json or "
            "tokenizer_config.json); use an instruction-tuned model's tokenizer"
        )
    try:
        system_role = resolve_system_role(config.system_role, template)
    except ChatTemplateError as err:
        raise TemplateRefused(f"{where}: {_one_line(str(err))}") from None
    variables = template_variables(folder, config)
    for probe in probes:
        try:
            render(template, format_messages(probe.messages, system_role), variables)
        except Exception as err:
            why = _why(err, role)
            if system_role and _folding_renders(template, probe.messages, variables):
                why += f"; it takes the system prompt folded into the first user turn: set {role}.system_role: false"
            raise TemplateRefused(f"{where}: {why} (on the run's {probe.what})") from None
    return None


def render(template: str, messages: Sequence[Message], variables: dict) -> str:
    """The prompt as vLLM's chat path renders it (transformers' renderer, with the generation prompt)."""
    from transformers.utils.chat_template_utils import render_jinja_template

    rendered, _ = render_jinja_template(
        conversations=[list(messages)], chat_template=template, add_generation_prompt=True, **variables
    )
    return rendered[0]


def _folding_renders(template: str, messages: Sequence[Message], variables: dict) -> bool:
    """Whether the conversation renders with its system prompt folded (the refusal was the system role)."""
    if not messages or messages[0]["role"] != "system":
        return False
    try:
        render(template, format_messages(messages, False), variables)
    except Exception:
        return False
    return True


def _why(err: Exception, role: str) -> str:
    from jinja2 import TemplateError, TemplateSyntaxError, UndefinedError

    message = _one_line(str(err))
    if isinstance(err, UndefinedError):
        found = _UNDEFINED.search(message)
        if found:
            name = found.group(1)
            return (
                f"its chat template needs the variable {name!r}, which the config does not give; "
                f"set {role}.chat_template_kwargs.{name}"
            )
        return f"its chat template reads something the config does not give ({message})"
    if isinstance(err, TemplateSyntaxError):
        return f"its chat template does not parse ({message})"
    if isinstance(err, TemplateError):  # the template's raise_exception: its own rule, in its words
        return f"its chat template refuses the conversation: {message}"
    return f"its chat template fails ({type(err).__name__}: {message})"


def _one_line(text: str) -> str:
    return " ".join(text.split())
