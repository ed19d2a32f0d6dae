"""The judges `plan` warns about: each judge of the panel (model@judge and `judges:`) whose family is
the assistant's (engines/models/family.py), with what to add (config/judges.py)."""

from __future__ import annotations

from omegaconf import DictConfig

from personalens.config.core import plain
from personalens.config.judges import cross_family_advice, panel
from personalens.engines.models.family import family_of


def self_preference(cfg: DictConfig) -> list[str]:
    """One line per judge of the assistant's family; none where no judge shares it or it is unknown."""
    assistant = plain(cfg.assistant)
    theirs = family_of(assistant)
    judges = [(member, family_of(plain(member.cfg.judge))) for member in panel(cfg)]
    lines = [
        f"Self-preference: judge {member.name} ({member.cfg.judge.name}) and assistant {assistant.get('name')} are "
        f"both of the {theirs.name} family; a judge may favour replies of its own family."
        for member, ours in judges
        if ours.shared_with(theirs)
    ]
    if lines and len(lines) == len(judges):  # no judge of another family to hold it against
        lines.append(cross_family_advice(theirs.name))
    return lines
