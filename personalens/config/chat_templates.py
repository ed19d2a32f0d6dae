"""Each role's chat template checked on the run's own prompts before any engine loads
(engines/chat/template_check.py): the role's first prompt of the run's first scenario and its prompt
after two rounds, made by the renderer `generate` and `judge` use (prompts/render.py), so a template
that refuses them (a system role, a broken alternation, a variable the config does not give) stops
the command in one line with nothing written."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from personalens.data import Scenario, Turn
from personalens.engines.chat.template_check import Probe, check_template
from personalens.engines.models.config import ModelConfig
from personalens.prompts.render import SPEAKERS, assistant_messages, judge_messages, user_agent_messages
from personalens.prompts.setting import PromptSetting
from personalens.prompts.templates import Templates

# two rounds of a dialogue and the user's next turn: what the prompts after the first carry
_HISTORY = (
    Turn("user", "Could you help me plan something for this weekend?"),
    Turn("assistant", "Of course. What kind of plans do you have in mind?"),
    Turn("user", "Something outdoors, not too far from home."),
    Turn("assistant", "A hike at a nearby park could suit you. Shall I suggest a few?"),
    Turn("user", "Yes, please."),
)


def probes(
    roles: Sequence[str],
    scenario: Scenario,
    templates: Templates,
    setting: PromptSetting,
    family: str,
    dimensions: Sequence[str],
) -> dict[str, list[Probe]]:
    """Per role the conversations its engine receives first and after two rounds."""
    two_rounds = _HISTORY[:4]
    made = {
        "user_agent": [
            Probe("first user-agent prompt", user_agent_messages(templates, scenario, [])),
            Probe("user-agent prompt after two rounds", user_agent_messages(templates, scenario, two_rounds)),
        ],
        "assistant": [
            Probe("first assistant prompt", assistant_messages(templates, scenario, _HISTORY[:1], setting, family)),
            Probe(
                "assistant prompt after two rounds", assistant_messages(templates, scenario, _HISTORY, setting, family)
            ),
        ],
        "judge": [
            Probe(
                f"judge prompt for {dim}" + (f" ({speaker})" if speaker else ""),
                judge_messages(templates, dim, scenario, two_rounds, speaker=speaker),
            )
            for dim in dimensions
            for speaker in SPEAKERS.get(dim, (None,))
        ],
    }
    return {role: made[role] for role in roles}


def check_templates(configs: Mapping[str, ModelConfig], probed: Mapping[str, Sequence[Probe]]) -> dict[str, str]:
    """Each role's template rendered on its probes (a refusal raises, in one line); per role not
    checked, why."""
    skipped = {}
    for role, config in configs.items():
        why = check_template(config, role, probed.get(role, ()))
        if why is not None:
            skipped[role] = why
    return skipped
