"""Chat messages for the three agents, as pure functions of (templates, scenario, turns, settings).

Who sees what (the paper's protocol):
- user agent: demographics (no user id), affinities and past-interaction summaries of every domain
  of the task (each labelled with its domain), the situation, and the task's user intent. The
  whole prompt is one user message; the conversation so far is text inside it.
- assistant: a system message (the "base" or "vanilla" instructions, plus the demographics /
  interaction summaries / situation when the setting's D / I / S flag is on), then the dialogue
  as alternating user/assistant chat turns, so each model's own chat template applies. It never
  sees the affinities or the task.
- judge: one user message. Task completion sees the conversation and the task goal; personalization
  sees demographics, the task domains' affinities, the task description, the interaction summaries,
  the situation and the conversation; naturalness and coherence see only the conversation and are
  asked about one speaker's utterances.

What each judge prompt asks the model to output (the formats of Figures 16-20, for the grammars
that constrain the judge's decoding):
- task_completion: the prompt ends with "VERDICT:"; the reply is the verdict `True` or `False`,
  then a line `EXPLANATION: <brief explanation>`.
- personalization: `<response>`, then the lines `Personalization Score: <1-4>`,
  `Key Observations: <text>`, `Justification: <text>`, `Improvement Suggestions: <text>`,
  then `</response>`.
- naturalness: `<response>`, `Naturalness Score: <1-5>`, `Justification: <text>`, `</response>`.
- coherence: `<response>`, `Coherence Score: <1-5>`, `Justification: <text>`, `</response>`.
Scores are whole numbers.
"""

from __future__ import annotations

from typing import Mapping, Sequence, TypedDict

from personalens.data.records import Role, Scenario, Turn
from personalens.prompts.sections import (
    affinities_text, conversation_text, demographics_text, interactions_text, situation_text,
)
from personalens.prompts.setting import PromptSetting
from personalens.prompts.templates import Templates


class Message(TypedDict):
    role: str  # "system" | "user" | "assistant"
    content: str


DIMENSIONS: tuple[str, ...] = ("task_completion", "personalization", "naturalness", "coherence")
# Dimensions rated once per speaker, and how their prompts name that speaker's turns.
RATED_SPEAKERS: Mapping[str, str] = {"user": "user utterances", "assistant": "assistant responses"}
PER_SPEAKER: tuple[str, ...] = ("naturalness", "coherence")


def user_agent_messages(templates: Templates, scenario: Scenario, turns: Sequence[Turn]) -> list[Message]:
    """The user agent's prompt: its opening query (Figure 13) when `turns` is empty, else its next
    reply to the assistant's last turn (Figure 14)."""
    _check_turns(turns, next_role="user")
    user, domains = scenario.user, scenario.task.domains
    profile = {
        "demographics": demographics_text(user),
        "affinities": affinities_text(user, domains),
        "interactions": interactions_text(user, domains),
        "situation": situation_text(scenario.situation),
        "task": scenario.task.user_intent,
    }
    if not turns:
        return [_user(templates.render("user_agent/initial.txt", **profile))]
    return [_user(templates.render("user_agent/next.txt", **profile, conversation=conversation_text(turns)))]


def assistant_messages(
    templates: Templates, scenario: Scenario, turns: Sequence[Turn], setting: PromptSetting
) -> list[Message]:
    """The assistant's system prompt for `setting`, then the dialogue so far (ending with the user)."""
    _check_turns(turns, next_role="assistant")
    user = scenario.user
    system = templates.render(
        f"assistant/{setting.mode}.txt",
        demographics=demographics_text(user) if setting.demographics else None,
        interactions=interactions_text(user, scenario.task.domains) if setting.interactions else None,
        situation=situation_text(scenario.situation) if setting.situation else None,
    )
    return [{"role": "system", "content": system},
            *({"role": turn.role, "content": turn.text} for turn in turns)]


def judge_messages(
    templates: Templates, dimension: str, scenario: Scenario, turns: Sequence[Turn], speaker: Role | None = None
) -> list[Message]:
    """The judge's prompt for one dimension of a dialogue; `speaker` ("user" or "assistant") picks
    whose utterances naturalness and coherence rate, and must be None for the other dimensions."""
    if dimension not in DIMENSIONS:
        raise ValueError(f"unknown judge dimension {dimension!r}; expected one of {', '.join(DIMENSIONS)}")
    if dimension in PER_SPEAKER and speaker not in RATED_SPEAKERS:
        raise ValueError(f"judge dimension {dimension!r} needs speaker 'user' or 'assistant', got {speaker!r}")
    if dimension not in PER_SPEAKER and speaker is not None:
        raise ValueError(f"judge dimension {dimension!r} takes no speaker, got {speaker!r}")
    if not turns:
        raise ValueError(f"{scenario.key}: cannot judge an empty conversation")
    _check_turns(turns, next_role=None)
    conversation = conversation_text(turns)
    name = f"judge/{dimension}.txt"
    if dimension == "task_completion":
        text = templates.render(name, conversation=conversation, goal=scenario.task.goal)
    elif dimension == "personalization":
        user, domains = scenario.user, scenario.task.domains
        text = templates.render(
            name,
            demographics=demographics_text(user),
            affinities=affinities_text(user, domains),
            task=scenario.task.description,
            interactions=interactions_text(user, domains),
            situation=situation_text(scenario.situation),
            conversation=conversation,
        )
    else:
        text = templates.render(name, conversation=conversation, rated=RATED_SPEAKERS[speaker])
    return [_user(text)]


def _user(content: str) -> Message:
    return {"role": "user", "content": content}


def _check_turns(turns: Sequence[Turn], next_role: Role | None) -> None:
    """Turns must alternate starting with the user; `next_role`, when given, is who speaks next."""
    for i, turn in enumerate(turns):
        expected = "user" if i % 2 == 0 else "assistant"
        if turn.role != expected:
            raise ValueError(f"turn {i} has role {turn.role!r}; turns must alternate user, assistant, ... starting with the user")
    if next_role is not None and len(turns) % 2 != (0 if next_role == "user" else 1):
        last = turns[-1].role if turns else "nobody"
        raise ValueError(f"the {next_role} cannot speak next: the last turn is the {last}'s")
