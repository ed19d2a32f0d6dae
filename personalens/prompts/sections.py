"""Plain-text renderings of the scenario parts that prompts show, and of the conversation so far.

Every rendering follows the order of its input (the release's order, the task's domain order, the
turn order), never a set or sorted order, so the same scenario always gives the same text.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from personalens.data.records import AffinityValue, Situation, Task, Turn, UserProfile

SPEAKER_LABELS: Mapping[str, str] = {"user": "USER", "assistant": "ASSISTANT"}

V = TypeVar("V")


def demographics_text(user: UserProfile) -> str:
    """'Age: 35-44 years old' lines; the user id is never shown to a model."""
    return "\n".join(
        f"{key.replace('_', ' ').capitalize()}: {value}" for key, value in user.demographics.items() if key != "user_id"
    )


def affinities_text(user: UserProfile, domains: Sequence[str]) -> str:
    """The user's preferences in each of `domains`, each domain under a '[Domain]' label."""
    blocks = []
    for domain in domains:
        prefs = _of_domain(user.affinities, domain, "affinities", user)
        lines = [f"- {kind}: {_value_text(value)}" for kind, value in prefs.items()]
        blocks.append("\n".join([f"[{domain}]", *lines]))
    return "\n\n".join(blocks)


def interactions_text(user: UserProfile, domains: Sequence[str]) -> str:
    """The past-interaction summary of each of `domains`, each under a '[Domain]' label."""
    return "\n\n".join(
        f"[{domain}]\n{_of_domain(user.interactions, domain, 'interactions', user).strip()}" for domain in domains
    )


def situation_text(situation: Situation) -> str:
    return "\n".join(f"- {key}: {value}" for key, value in situation.items())


def conversation_text(turns: Sequence[Turn]) -> str:
    """'USER: ...' / 'ASSISTANT: ...' paragraphs. The text for the first k turns is a prefix of the
    text for more turns, which lets a prefix cache reuse it across the turns of a dialogue."""
    return "\n\n".join(f"{SPEAKER_LABELS[turn.role]}: {turn.text.strip()}" for turn in turns)


# ---- the released code's formats (its src/generate_dialogue*.py and src/evaluate_dialogue.py) ----


def official_demographics_text(user: UserProfile, with_id: bool) -> str:
    """'- age: 35-44 years old' lines under the release's keys; its judge also sees the user id."""
    items = [("user_id", user.user_id)] if with_id else []
    return "\n".join(f"- {key}: {value}" for key, value in [*items, *user.demographics.items()])


def official_affinities_text(user: UserProfile, task: Task) -> str:
    """SD: the first domain's '- type: value' lines. MD: each domain's lines under a 'Domain:'
    heading, every block opened and closed by a newline."""

    def lines(domain: str) -> str:
        prefs = _of_domain(user.affinities, domain, "affinities", user)
        return "\n".join(f"- {kind}: {_value_text(value)}" for kind, value in prefs.items())

    if task.kind == "SD":
        return lines(task.domains[0])
    return "".join(f"\n{domain}:\n{lines(domain)}\n" for domain in task.domains)


def official_interactions_text(user: UserProfile, task: Task) -> str:
    """SD: the first domain's summary as it is. MD: each summary inside <Domain> ... </Domain> tags."""

    def summary(domain: str) -> str:
        return _of_domain(user.interactions, domain, "interactions", user)

    if task.kind == "SD":
        return summary(task.domains[0])
    return "".join(f"\n<{domain}>\n{summary(domain)}\n</{domain}>\n" for domain in task.domains)


def official_conversation_text(turns: Sequence[Turn]) -> str:
    """'[USER]: ...' / '[ASSISTANT]: ...' lines, the text as generated (user agent and judge)."""
    return "\n".join(f"[{turn.role.upper()}]: {turn.text}" for turn in turns)


def official_history_text(turns: Sequence[Turn]) -> str:
    """'User: ...' / 'Assistant: ...' lines: the assistant's `Conversation History:`."""
    return "\n".join(f"{turn.role.capitalize()}: {turn.text}" for turn in turns)


@dataclass(frozen=True)
class Style:
    """How a template set writes the scenario and the dialogue into its prompts."""

    demographics: Callable[[UserProfile, bool], str]  # (user, with the user id)
    affinities: Callable[[UserProfile, Task], str]
    interactions: Callable[[UserProfile, Task], str]
    situation: Callable[[Situation], str]
    conversation: Callable[[Sequence[Turn]], str]  # what the user agent and the judge read
    history: Callable[[Sequence[Turn]], str]  # what the assistant reads, when it reads text
    judge_sees_user_id: bool
    judge_task: Callable[[Task], str]  # the task text the personalization judge reads


STYLES: Mapping[str, Style] = {
    "paper": Style(
        demographics=lambda user, with_id: demographics_text(user),
        affinities=lambda user, task: affinities_text(user, task.domains),
        interactions=lambda user, task: interactions_text(user, task.domains),
        situation=situation_text,
        conversation=conversation_text,
        history=conversation_text,
        judge_sees_user_id=False,
        judge_task=lambda task: task.description,
    ),
    "official": Style(
        demographics=official_demographics_text,
        affinities=official_affinities_text,
        interactions=official_interactions_text,
        situation=situation_text,
        conversation=official_conversation_text,
        history=official_history_text,
        judge_sees_user_id=True,
        judge_task=lambda task: task.user_intent,
    ),
}


def style_named(name: str) -> Style:
    try:
        return STYLES[name]
    except KeyError:
        raise ValueError(f"unknown prompt style {name!r}; expected one of {', '.join(STYLES)}") from None


def _value_text(value: AffinityValue) -> str:
    return value if isinstance(value, str) else ", ".join(value)


def _of_domain(by_domain: Mapping[str, V], domain: str, what: str, user: UserProfile) -> V:
    try:
        return by_domain[domain]
    except KeyError:
        raise ValueError(f"{user.user_id}: no {what} for domain {domain!r}") from None
