"""A role's sampling as it runs: the protocol's entry, the model card's values of the role's model over it
(a model config's `sampling:` block), and an explicit `protocol.<role>.KEY=...` override over both; where
each value came from; and the request budget of a reasoning role, its thinking budget beside the
protocol's answer budget (docs/models.md)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from personalens.config.core import plain, sampling_identity
from personalens.errors import PersonalensError

# where a role's sampling value came from
PROTOCOL, MODEL, OVERRIDE = "protocol", "model card", "override"
# the values a model card may set over the protocol's (engines/models/sampling.py VALUES); max_tokens is
# always the protocol's
KEYS = ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "repetition_penalty", "thinking_budget")


@dataclass(frozen=True)
class RoleSampling:
    section: dict[str, Any]  # the protocol entry as the role runs with it; max_tokens the answer's
    origins: dict[str, str]  # per value set: PROTOCOL, MODEL or OVERRIDE
    source: str | None = None  # the model card the MODEL values follow
    greedy_warning: str | None = None  # the card's reason against greedy decoding

    @property
    def from_model(self) -> bool:
        return MODEL in self.origins.values()

    @property
    def request_max_tokens(self) -> int:
        """The most tokens a reply generates: its thinking, at most the budget, then its answer, at most
        max_tokens (engines/chat/budget.py makes them two requests)."""
        return int(self.section["max_tokens"]) + int(self.section.get("thinking_budget") or 0)

    def identity(self) -> Any:
        """The role's sampling as a fingerprint holds it: as before model cards carried sampling where
        every value is the protocol's (runs started then still resume); else the values, their origins and,
        with a thinking budget, the reply's most tokens and its answer's apart (runs whose answer the
        budget's unspent tokens could lengthen were saved without `answer_max_tokens`, and do not resume)."""
        if not self.from_model and not self.section.get("thinking_budget"):
            return sampling_identity(self.section)
        budget = (
            {"request_max_tokens": self.request_max_tokens, "answer_max_tokens": int(self.section["max_tokens"])}
            if self.section.get("thinking_budget")
            else {}
        )
        return {**sampling_identity(self.section), "origins": dict(sorted(self.origins.items())), **budget}

    def record(self) -> dict[str, Any]:
        """What the saved config and the report's setup say of it."""
        card = {"source": self.source} if self.from_model else {}
        return {**self.section, "origins": dict(sorted(self.origins.items())), **card}


def overridden(role: str, overrides: Sequence[str]) -> set[str]:
    """The keys of `protocol.<role>` that command-line overrides set (`protocol.assistant.temperature=0`;
    a whole `protocol.assistant={...}` sets every key)."""
    out: set[str] = set()
    for item in overrides:
        key = item.split("=", 1)[0].lstrip("+~")
        if key == f"protocol.{role}":
            out.update(KEYS)
        elif key.startswith(f"protocol.{role}."):
            out.add(key.split(".", 2)[2])
    return out


def resolve(protocol: Mapping[str, Any], model: Mapping[str, Any], explicit: set[str]) -> RoleSampling:
    """`protocol` (the role's entry) with `model` (a model's `sampling:` block) over it and the
    `explicit` keys kept as the protocol has them."""
    values = {k: v for k, v in plain(model).items() if k in KEYS and v is not None} if model else {}
    section = dict(plain(protocol))
    origins = {k: OVERRIDE if k in explicit else PROTOCOL for k, v in section.items() if k in KEYS and v is not None}
    for key, value in values.items():
        if key not in explicit:
            section[key], origins[key] = value, MODEL
    notes = model or {}
    return RoleSampling(section, origins, notes.get("source"), notes.get("greedy_warning"))


def hydra_overrides() -> list[str]:
    """The running Hydra app's command-line overrides (none outside one)."""
    from hydra.core.hydra_config import HydraConfig

    return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []


def role_sampling(cfg: Any, role: str) -> RoleSampling:
    """The role's sampling from the config and this command's overrides."""
    model = cfg[role].get("sampling")
    try:
        from personalens.engines.models.sampling import model_sampling

        model_sampling(plain(model), f"{role}")
    except PersonalensError as err:
        raise PersonalensError(f"model@{err}") from None
    return resolve(cfg.protocol[role], plain(model) or {}, overridden(role, hydra_overrides()))


def notes(role: str, model: str, chosen: RoleSampling, parser: str | None) -> list[str]:
    """What a command says once about a role's sampling: greedy decoding against the model card's advice
    (quoted), a reasoning role without a thinking budget."""
    out = []
    if float(chosen.section["temperature"]) == 0 and chosen.greedy_warning:
        how = "as overridden" if chosen.origins.get("temperature") == OVERRIDE else "from the protocol"
        out.append(
            f"{role}: {model} decodes greedily (temperature 0, {how}); its card ({chosen.source}) says: "
            f'"{chosen.greedy_warning}"'
        )
    if parser and chosen.section.get("thinking_budget") is None:
        out.append(
            f"{role}: {model} is a reasoning model without a thinking budget: its thinking counts against "
            f"max_tokens={chosen.section['max_tokens']}, and a reply that thinks that long ends its dialogue "
            f"`thinking`; set {role}.sampling.thinking_budget (docs/models.md)"
        )
    return out
