"""Prompt rendering: template files in, chat messages out (pure functions, no model calls)."""

from personalens.prompts.render import (
    DIMENSIONS,
    PER_SPEAKER,
    Message,
    assistant_messages,
    judge_messages,
    user_agent_messages,
)
from personalens.prompts.sections import conversation_text
from personalens.prompts.setting import PromptSetting
from personalens.prompts.templates import PromptError, Templates, load_templates

__all__ = [
    "DIMENSIONS",
    "PER_SPEAKER",
    "Message",
    "PromptError",
    "PromptSetting",
    "Templates",
    "assistant_messages",
    "conversation_text",
    "judge_messages",
    "load_templates",
    "user_agent_messages",
]
