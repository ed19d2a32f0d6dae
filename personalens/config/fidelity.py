"""The fidelity option (conf/fidelity/): reproduce the released PersonaLens code (`official`) or the
paper's printed figures (`paper`). Built once from the config, or from a run's saved config, and
passed to what it shapes (docs/fidelity.md)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from personalens.errors import PersonalensError

# Runs saved before the option existed behaved as `paper` does now, with Figure 4 over SD and MD.
_BEFORE_OPTION = {"name": "paper", "figure4_kinds": ["SD", "MD"]}


@dataclass(frozen=True)
class Fidelity:
    name: str
    prompts_dir: str  # the template set (prompt.dir, when set, replaces it)
    style: str  # how profiles and histories are written into prompts (prompts/sections.py)
    verbatim: bool  # prompts keep their trailing newlines
    terminate: str  # "substring" | "word": how TERMINATE ends a dialogue
    reply_after_cap: bool  # the user agent still answers the capped assistant reply
    judge_format: str  # the judge's output layout and how it is read
    figure4_kinds: tuple[str, ...]  # the task kinds Figure 4 counts
    settings: Mapping[str, Any] = field(repr=False, default_factory=dict)  # the option as configured

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any], where: str = "fidelity") -> Fidelity:
        try:
            prompts = raw.get("prompts") or {}
            return cls(
                name=str(raw["name"]),
                prompts_dir=str(prompts.get("dir") or ""),
                style=str(prompts.get("style", raw["name"])),
                verbatim=bool(prompts.get("verbatim", False)),
                terminate=str(raw.get("terminate", "word")),
                reply_after_cap=bool(raw.get("reply_after_cap", False)),
                judge_format=str(raw.get("judge_format", raw["name"])),
                figure4_kinds=tuple(raw.get("figure4_kinds", ("SD", "MD"))),
                settings=dict(raw),
            )
        except (KeyError, TypeError, AttributeError) as err:
            raise PersonalensError(f"{where}: not a fidelity option ({err!r} missing or malformed)") from None

    @classmethod
    def from_saved(cls, saved_config: Mapping[str, Any]) -> Fidelity:
        """The option a run was made with, from its saved config (`<run>/generate.yaml`'s `config`)."""
        raw = saved_config.get("fidelity")
        return cls.from_mapping(raw if raw is not None else _BEFORE_OPTION, "saved fidelity")

    @property
    def reproduces_release(self) -> bool:
        """Whether results are comparable with the paper's printed numbers, which the released code
        produced: Table 3 then shows the paper's rows beside the run's."""
        return self.name == "official"

    def identity(self) -> dict:
        """The option as it shapes results, for fingerprints: its rules, not where its template folder
        lies (the templates' text is fingerprinted by itself)."""
        identity = dict(self.settings)
        identity["prompts"] = {k: v for k, v in (identity.get("prompts") or {}).items() if k != "dir"}
        return identity
