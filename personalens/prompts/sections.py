"""Plain-text renderings of the scenario parts that prompts show, and of the conversation so far.

Every rendering follows the order of its input (the release's order, the task's domain order, the
turn order), never a set or sorted order, so the same scenario always gives the same text.
"""

from __future__ import annotations

from typing import Mapping, Sequence, TypeVar

from personalens.data.records import AffinityValue, Situation, Turn, UserProfile

SPEAKER_LABELS: Mapping[str, str] = {"user": "USER", "assistant": "ASSISTANT"}

V = TypeVar("V")


def demographics_text(user: UserProfile) -> str:
    """'Age: 35-44 years old' lines; the user id is never shown to a model."""
    return "\n".join(
        f"{key.replace('_', ' ').capitalize()}: {value}"
        for key, value in user.demographics.items() if key != "user_id"
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
        f"[{domain}]\n{_of_domain(user.interactions, domain, 'interactions', user).strip()}"
        for domain in domains
    )


def situation_text(situation: Situation) -> str:
    return "\n".join(f"- {key}: {value}" for key, value in situation.items())


def conversation_text(turns: Sequence[Turn]) -> str:
    """'USER: ...' / 'ASSISTANT: ...' paragraphs. The text for the first k turns is a prefix of the
    text for more turns, which lets a prefix cache reuse it across the turns of a dialogue."""
    return "\n\n".join(f"{SPEAKER_LABELS[turn.role]}: {turn.text.strip()}" for turn in turns)


def _value_text(value: AffinityValue) -> str:
    return value if isinstance(value, str) else ", ".join(value)


def _of_domain(by_domain: Mapping[str, V], domain: str, what: str, user: UserProfile) -> V:
    try:
        return by_domain[domain]
    except KeyError:
        raise ValueError(f"{user.user_id}: no {what} for domain {domain!r}") from None
