"""Chat messages for the three agents, as pure functions of (templates, scenario, turns, settings).

A template set (a folder of prompts/) decides, through the files it holds, the shape of each prompt
(templates.REQUIRED and docs/fidelity.md): the project's own set, following the paper's figures,
is described below; the `official` set (prompts/official/) reproduces the released code's prompts,
with a system prompt for the user agent, per-family assistant prompts that carry the dialogue as
text, and one judge prompt per rated speaker. The set's style (sections.STYLES) writes the values.

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

from collections.abc import Mapping, Sequence
from typing import TypedDict

from personalens.data.records import Role, Scenario, Turn
from personalens.prompts.sections import style_named
from personalens.prompts.setting import PromptSetting
from personalens.prompts.templates import PromptError, Templates


class Message(TypedDict):
    role: str  # "system" | "user" | "assistant"
    content: str


DIMENSIONS: tuple[str, ...] = ("task_completion", "personalization", "naturalness", "coherence")
# Dimensions rated once per speaker, and how their prompts name that speaker's turns.
RATED_SPEAKERS: Mapping[str, str] = {"user": "user utterances", "assistant": "assistant responses"}
PER_SPEAKER: tuple[str, ...] = ("naturalness", "coherence")
# dimension -> the speakers rated separately (naturalness and coherence: user and assistant)
SPEAKERS: Mapping[str, tuple[str, ...]] = {dim: tuple(RATED_SPEAKERS) for dim in PER_SPEAKER}
# Assistant prompt families (a model config's `prompt_family`): a set may hold a family's own
# assistant prompts under assistant/<family>/; "default" (and any family without them) uses assistant/.
FAMILIES: tuple[str, ...] = ("default", "llama", "mistral")


def user_agent_messages(templates: Templates, scenario: Scenario, turns: Sequence[Turn]) -> list[Message]:
    """The user agent's prompt: its opening query (Figure 13) when `turns` is empty, else its next
    reply to the assistant's last turn (Figure 14); a set with user_agent/system.txt sends it first."""
    _check_turns(turns, next_role="user")
    style = style_named(templates.style)
    profile = user_agent_profile(templates, scenario)
    if not turns:
        text = templates.render("user_agent/initial.txt", **profile)
    else:
        text = templates.render("user_agent/next.txt", **profile, conversation=style.conversation(turns))
    system = templates.first("user_agent/system.txt")
    return [*([_system(templates.render(system, **profile))] if system else []), _user(text)]


def user_agent_profile(templates: Templates, scenario: Scenario) -> dict[str, str]:
    """The values the user agent's templates show it, written in the set's style: its demographics,
    the task's preferences and past interactions, the situation, and the task (`task`)."""
    style = style_named(templates.style)
    user, task = scenario.user, scenario.task
    return {
        "demographics": style.demographics(user, False),
        "affinities": style.affinities(user, task),
        "interactions": style.interactions(user, task),
        "situation": style.situation(scenario.situation),
        "task": task.user_intent,
    }


def assistant_messages(
    templates: Templates,
    scenario: Scenario,
    turns: Sequence[Turn],
    setting: PromptSetting,
    family: str = "default",
) -> list[Message]:
    """The assistant's system prompt for `setting` and `family`, then the dialogue so far (ending
    with the user): as chat turns, or as text in one user message when the set has a
    `<mode>.user.txt` template for it (a family may then have no system prompt: Mistral's chat
    format has no system role, and the release writes its instructions into the user message)."""
    _check_turns(turns, next_role="assistant")
    if family not in FAMILIES:
        raise ValueError(f"unknown prompt family {family!r}; expected one of {', '.join(FAMILIES)}")
    style = style_named(templates.style)
    user, task = scenario.user, scenario.task
    context = {
        "demographics": style.demographics(user, False) if setting.demographics else None,
        "interactions": style.interactions(user, task) if setting.interactions else None,
        "situation": style.situation(scenario.situation) if setting.situation else None,
    }
    folder, system, as_text = _assistant_templates(templates, setting, family)
    head = [_system(templates.render(system, **context))] if system else []
    if as_text is not None:
        return [*head, _user(templates.render(as_text, **context, conversation=style.history(turns)))]
    if not head:
        raise PromptError(f"{templates.folder}: {folder}{setting.mode}.txt is missing")
    return [*head, *({"role": turn.role, "content": turn.text} for turn in turns)]


def assistant_chat_turns(templates: Templates, setting: PromptSetting, family: str = "default") -> bool:
    """Whether the assistant's prompts carry the dialogue as chat turns (its own replies as assistant
    turns), not as text in one user message."""
    return _assistant_templates(templates, setting, family)[2] is None


def _assistant_templates(
    templates: Templates, setting: PromptSetting, family: str
) -> tuple[str, str | None, str | None]:
    """The folder of the assistant's prompts for `setting` and `family`, its system template and its
    dialogue-as-text template (None where the set has none)."""
    own = f"assistant/{family}/{setting.mode}"
    folder = f"assistant/{family}/" if templates.first(f"{own}.txt", f"{own}.user.txt") else "assistant/"
    return folder, templates.first(f"{folder}{setting.mode}.txt"), templates.first(f"{folder}{setting.mode}.user.txt")


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
    style = style_named(templates.style)
    conversation = style.conversation(turns)
    if dimension == "task_completion":
        text = templates.render("judge/task_completion.txt", conversation=conversation, goal=scenario.task.goal)
    elif dimension == "personalization":
        user, task = scenario.user, scenario.task
        text = templates.render(
            "judge/personalization.txt",
            demographics=style.demographics(user, style.judge_sees_user_id),
            affinities=style.affinities(user, task),
            task=style.judge_task(task),
            interactions=style.interactions(user, task),
            situation=style.situation(scenario.situation),
            conversation=conversation,
        )
    else:
        # one prompt per rated speaker when the set has it, else one naming the speaker through `rated`
        name = templates.pick(f"judge/{dimension}.{speaker}.txt", f"judge/{dimension}.txt")
        text = templates.render(name, conversation=conversation, rated=RATED_SPEAKERS[speaker])
    return [_user(text)]


def _system(content: str) -> Message:
    return {"role": "system", "content": content}


def _user(content: str) -> Message:
    return {"role": "user", "content": content}


def _check_turns(turns: Sequence[Turn], next_role: Role | None) -> None:
    """Turns must alternate starting with the user; `next_role`, when given, is who speaks next."""
    for i, turn in enumerate(turns):
        expected = "user" if i % 2 == 0 else "assistant"
        if turn.role != expected:
            raise ValueError(
                f"turn {i} has role {turn.role!r}; turns must alternate user, assistant, ... starting with the user"
            )
    if next_role is not None and len(turns) % 2 != (0 if next_role == "user" else 1):
        last = turns[-1].role if turns else "nobody"
        raise ValueError(f"the {next_role} cannot speak next: the last turn is the {last}'s")
