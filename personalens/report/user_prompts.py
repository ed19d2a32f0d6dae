"""The user agent's prompt text of a run's dialogues, rebuilt at report time for the leak check
(user_checks.leak): the template set and the data the run's saved `generate.yaml` names, the
profile of each scenario written in the set's style (prompts/render.py)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from personalens.config.fidelity import Fidelity
from personalens.config.saved import read_saved
from personalens.data import load_scenarios
from personalens.data.records import Scenario
from personalens.errors import PersonalensError
from personalens.prompts.render import user_agent_profile
from personalens.prompts.templates import Templates, load_templates
from personalens.report.user_checks import PromptSpans, spans_of, tags_of

USER_AGENT_TEMPLATES = ("user_agent/system.txt", "user_agent/initial.txt", "user_agent/next.txt")


@dataclass(frozen=True)
class RunPrompts:
    """Per scenario (user id, task id) of a run, its prompt's spans; `missing` says why there are
    none (no saved config, a data root or template folder no longer where the run had it)."""

    spans: Mapping[tuple[str, str], PromptSpans]
    missing: str = ""


def instruction_text(templates: Templates) -> str:
    """The user agent's templates with every value left out: what it was told, not about whom."""
    blank = dict.fromkeys(("demographics", "affinities", "interactions", "situation", "task", "conversation"), "")
    return "\n".join(templates.render(name, **blank) for name in USER_AGENT_TEMPLATES if name in templates.sources)


def _loaded(run_dir: Path) -> tuple[Templates, list[Scenario]] | str:
    """The template set and scenarios the run's saved generate.yaml names, or why they cannot be had."""
    saved = read_saved(run_dir).get("generate")
    if saved is None:
        return f"{run_dir}: no generate.yaml to rebuild the user agent's prompts from"
    cfg = saved.config
    try:
        option = Fidelity.from_saved(cfg)
        data, prompt = cfg.get("data") or {}, cfg.get("prompt") or {}
        templates = load_templates(
            prompt.get("dir") or option.prompts_dir or None, style=option.style, verbatim=option.verbatim
        )
        scenarios = load_scenarios(
            Path(str(data.get("root"))), data.get("users", "all"), data.get("kinds", "both"), strict=False
        )
    except (PersonalensError, ValueError, TypeError) as err:
        return f"{run_dir}: the user agent's prompts cannot be rebuilt ({err})"
    return templates, list(scenarios)


def prompt_texts(run_dir: Path) -> dict[tuple[str, str], str]:
    """Per scenario (user id, task id) of a run, what its prompts are made of besides the dialogue: every
    template of the set and the user's data as the set writes it (the profile both parties are shown),
    which the content leak check does not count (engines/chat/spans.py); none where it cannot be rebuilt."""
    loaded = _loaded(run_dir)
    if isinstance(loaded, str):
        return {}
    templates, scenarios = loaded
    told = "\n".join(templates.sources.values())
    return {s.key: "\n".join([told, *user_agent_profile(templates, s).values()]) for s in scenarios}


def run_prompts(run_dir: Path) -> RunPrompts:
    loaded = _loaded(run_dir)
    if isinstance(loaded, str):
        return RunPrompts({}, loaded)
    templates, scenarios = loaded
    told = instruction_text(templates)
    instruction, tags = spans_of(told), tags_of(told)
    spans = {}
    for scenario in scenarios:
        profile = user_agent_profile(templates, scenario)
        shown = "\n".join(v for k, v in profile.items() if k != "task")
        spans[scenario.key] = PromptSpans(instruction, spans_of(shown), tags)
    return RunPrompts(spans)
