"""The prompts of a selection's dialogues before any dialogue text, rendered with the run's templates
(prompts/render.py, the renderer `generate` and `judge` use) and counted with each role's tokenizer
as vLLM's chat path counts them (engines/chat/token_ids.py, read from the model's files: no model, no torch)."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from statistics import fmean

from personalens.data import Scenario, Turn
from personalens.engines.chat.token_ids import ChatTokenizer
from personalens.engines.models.config import ModelConfig
from personalens.errors import PersonalensError
from personalens.plan.budget import Fixed
from personalens.prompts.render import SPEAKERS, assistant_messages, judge_messages, user_agent_messages
from personalens.prompts.setting import PromptSetting
from personalens.prompts.templates import Templates

# one empty exchange: the prompts' own text, and the markup of one turn of each speaker
_EXCHANGE = (Turn("user", ""), Turn("assistant", ""))


@dataclass(frozen=True)
class ScenarioTokens:
    key: tuple[str, str]
    kind: str
    user_first: int
    user_next: int
    assistant: int
    judge: Mapping[str, int]  # "dimension/speaker" -> tokens


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
    """Each scenario's fixed prompt parts in tokens, each role's prompts encoded in one batch."""

    def counted(role: str, render: Callable[[Scenario], list]) -> list[int]:
        return [len(ids) for ids in tokenizers[role].encode_chats([render(s) for s in scenarios])]

    first = counted("user_agent", lambda s: user_agent_messages(templates, s, []))
    later = counted("user_agent", lambda s: user_agent_messages(templates, s, _EXCHANGE))
    assistant = counted("assistant", lambda s: assistant_messages(templates, s, _EXCHANGE[:1], setting, family))
    judge = {
        f"{dim}/{speaker}": counted(
            "judge", lambda s, d=dim, p=speaker: judge_messages(templates, d, s, _EXCHANGE, speaker=p or None)
        )
        for dim, speaker in judged(dimensions)
    }
    return [
        ScenarioTokens(s.key, s.task.kind, first[i], later[i], assistant[i], {j: n[i] for j, n in judge.items()})
        for i, s in enumerate(scenarios)
    ]


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
        )
    return out
