"""The prompts of a selection's dialogues before any dialogue text, rendered with the run's templates
(prompts/render.py, the renderer `generate` and `judge` use) and counted with each role's tokenizer
as vLLM's chat path counts them (engines/chat/token_ids.py, read from the model's files: no model, no torch)."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from statistics import fmean

from personalens.data import Scenario, Turn
from personalens.engines.chat.token_ids import ChatTokenizer, common_prefix
from personalens.engines.models.config import ModelConfig
from personalens.errors import PersonalensError
from personalens.plan.budget import Fixed
from personalens.prompts.render import SPEAKERS, assistant_messages, judge_messages, user_agent_messages
from personalens.prompts.setting import PromptSetting
from personalens.prompts.templates import Templates

# one empty exchange: the prompts' own text, and the markup of one turn of each speaker
_EXCHANGE = (Turn("user", ""), Turn("assistant", ""))
# defined: a dialogue's first exchanges, with text: what of a prompt the next one repeats
_SAID = (Turn("user", "Hello."), Turn("assistant", "Hello, how can I help?")) * 2


@dataclass(frozen=True)
class ScenarioTokens:
    key: tuple[str, str]
    kind: str
    user_first: int
    user_next: int
    assistant: int
    judge: Mapping[str, int]  # "dimension/speaker" -> tokens
    shared: Mapping[str, int]  # "user" | "assistant" | "judge" -> tokens shared with the user's other dialogues
    tail: Mapping[str, int]  # "user_first" | "user" | "assistant" -> tokens its next prompt does not repeat


def sample(scenarios: Sequence[Scenario], n: int, seed: int) -> list[Scenario]:
    """At most `n` scenarios: a seeded sample, in selection order, when there are more."""
    if len(scenarios) <= n:
        return list(scenarios)
    keep = set(random.Random(seed).sample(range(len(scenarios)), n))
    return [s for i, s in enumerate(scenarios) if i in keep]


def judged(dimensions: Sequence[str]) -> list[tuple[str, str]]:
    """The judge's prompts per dialogue: each dimension, per rated speaker where it has them."""
    return [(dim, speaker) for dim in dimensions for speaker in SPEAKERS.get(dim, ("",))]


def load_tokenizers(models: Mapping[str, ModelConfig]) -> tuple[dict[str, ChatTokenizer], dict[str, str]]:
    """Each role's tokenizer from its files, and why a role has none (an endpoint, no tokenizer.json)."""
    tokenizers, missing, loaded = {}, {}, {}
    for role, config in models.items():
        if config.engine == "server" and config.tokenizer is None:
            missing[role] = "an engine: server endpoint; set its tokenizer to a local directory to count its tokens"
            continue
        try:
            if config not in loaded:
                loaded[config] = ChatTokenizer.from_files(config)
            tokenizers[role] = loaded[config]
        except (PersonalensError, OSError, ValueError) as err:
            missing[role] = str(err)
    return tokenizers, missing


def count_prompts(
    scenarios: Sequence[Scenario],
    templates: Templates,
    setting: PromptSetting,
    family: str,
    tokenizers: Mapping[str, ChatTokenizer],
    dimensions: Sequence[str],
) -> list[ScenarioTokens]:
    """Each scenario's fixed prompt parts in tokens, each role's prompts encoded in one batch, and
    how many tokens each role's prompts share with those of another dialogue of the same user
    (`partners`)."""
    others = partners(scenarios)

    def encoded(role: str, render: Callable[[Scenario], list], share: bool = False) -> tuple[list, list]:
        """The scenarios' prompts as token ids, and with `share` their partners' too."""
        ids = tokenizers[role].encode_chats([render(s) for s in [*scenarios, *(others if share else ())]])
        return ids[: len(scenarios)], ids[len(scenarios) :]

    def counted(role: str, render: Callable[[Scenario], list]) -> tuple[list[int], list[int]]:
        mine, theirs = encoded(role, render, share=True)
        return [len(a) for a in mine], [common_prefix(a, b) for a, b in zip(mine, theirs)]

    def tails(before: list[list[int]], after: list[list[int]]) -> list[int]:
        return [len(a) - common_prefix(a, b) for a, b in zip(before, after)]

    opening, opening_others = encoded("user_agent", lambda s: user_agent_messages(templates, s, []), share=True)
    first = [len(a) for a in opening]
    shared_user = [common_prefix(a, b) for a, b in zip(opening, opening_others)]
    later = [len(a) for a in encoded("user_agent", lambda s: user_agent_messages(templates, s, _EXCHANGE))[0]]
    assistant, shared_assistant = counted(
        "assistant", lambda s: assistant_messages(templates, s, _EXCHANGE[:1], setting, family)
    )
    # what of a role's prompt its next prompt does not begin with (text after the conversation)
    said = [opening] + [
        encoded("user_agent", lambda s, k=k: user_agent_messages(templates, s, _SAID[: 2 * k]))[0] for k in (1, 2)
    ]
    asked = [
        encoded("assistant", lambda s, k=k: assistant_messages(templates, s, _SAID[:k], setting, family))[0]
        for k in (1, 3)
    ]
    tail = {"user_first": tails(said[0], said[1]), "user": tails(said[1], said[2]), "assistant": tails(*asked)}
    judge = {
        f"{dim}/{speaker}": counted(
            "judge", lambda s, d=dim, p=speaker: judge_messages(templates, d, s, _EXCHANGE, speaker=p or None)
        )
        for dim, speaker in judged(dimensions)
    }
    return [
        ScenarioTokens(
            s.key,
            s.task.kind,
            first[i],
            later[i],
            assistant[i],
            {j: n[0][i] for j, n in judge.items()},
            {
                "user": shared_user[i],
                "assistant": shared_assistant[i],
                **({"judge": fmean(n[1][i] for n in judge.values())} if judge else {}),
            },
            {k: t[i] for k, t in tail.items()},
        )
        for i, s in enumerate(scenarios)
    ]


def partners(scenarios: Sequence[Scenario]) -> list[Scenario]:
    """For each scenario, another dialogue of its user: a sampled scenario of the same user and
    another task where there is one, else its user given the next sampled scenario's task (and that
    scenario's situation); itself where the sample has no other task."""
    by_user: dict[str, list[Scenario]] = {}
    for s in scenarios:
        by_user.setdefault(s.user.user_id, []).append(s)
    out = []
    for i, s in enumerate(scenarios):
        same = (o for o in by_user[s.user.user_id] if o.task.task_id != s.task.task_id)
        later = (scenarios[(i + k) % len(scenarios)] for k in range(1, len(scenarios)))
        other = next(same, None) or next((o for o in later if o.task.task_id != s.task.task_id), s)
        out.append(other if other.user.user_id == s.user.user_id else replace(other, user=s.user))
    return out


def fixed_by_kind(rows: Sequence[ScenarioTokens]) -> dict[str, Fixed]:
    """The mean fixed parts of each kind's scenarios."""
    out = {}
    for kind in dict.fromkeys(r.kind for r in rows):  # SD first, as the data lists them
        mine = [r for r in rows if r.kind == kind]
        out[kind] = Fixed(
            fmean(r.user_first for r in mine),
            fmean(r.user_next for r in mine),
            fmean(r.assistant for r in mine),
            {j: fmean(r.judge[j] for r in mine) for j in mine[0].judge},
            {role: fmean(r.shared[role] for r in mine) for role in mine[0].shared},
            {prompt: fmean(r.tail[prompt] for r in mine) for prompt in mine[0].tail},
        )
    return out
