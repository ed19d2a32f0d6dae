"""A role's sampling as it runs, by one rule (docs/models.md#sampling-one-rule): a value the config writes
(a protocol or experiment file, a panel entry, the command line) is the role's; a protocol key left null
(or left out) takes the model's own (its model config's `sampling:` block, its card's), else the paper's.
The caps (max_tokens) are always the protocol's. Each value keeps where it came from; a reasoning role's
request carries its thinking budget beside the protocol's answer budget."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from personalens.config.core import plain, sampling_identity
from personalens.errors import PersonalensError

# where a role's sampling value came from
CONFIG, MODEL, PAPER = "config", "model card", "paper"
# the values a model card may set where the protocol leaves them null (engines/models/sampling.py VALUES);
# max_tokens is always the protocol's
KEYS = ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "repetition_penalty", "thinking_budget")
# the paper's sampling per role (its §4 setup: the user agent at temperature 0.5, the assistant and the judge
# at 0, "other inference parameters" each model's defaults: top_p 1.0, vLLM's and the release's Claude calls',
# which send none); the released code sends the same temperatures (src/generate_dialogue.py,
# src/evaluate_dialogue.py)
PAPERS = {
    "user_agent": {"temperature": 0.5, "top_p": 1.0},
    "assistant": {"temperature": 0.0, "top_p": 1.0},
    "judge": {"temperature": 0.0, "top_p": 1.0},
}
# the origins as fingerprints have named them since model cards carried sampling, so runs whose values are
# unchanged keep their fingerprint: a value the config sets was an explicit override, the paper's the protocol's
_FINGERPRINTED = {CONFIG: "override", MODEL: MODEL, PAPER: "protocol"}


@dataclass(frozen=True)
class RoleSampling:
    section: dict[str, Any]  # the protocol entry as the role runs with it; max_tokens the answer's
    origins: dict[str, str]  # per value set: CONFIG, MODEL or PAPER
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
        """The role's sampling as a fingerprint holds it: the values alone where none is the card's and no
        thinking budget is set (as before model cards carried sampling, so such runs still resume); else the
        values, their origins and, with a thinking budget, the reply's most tokens and its answer's apart
        (runs whose answer the budget's unspent tokens could lengthen were saved without `answer_max_tokens`,
        and do not resume)."""
        if not self.from_model and not self.section.get("thinking_budget"):
            return sampling_identity(self.section)
        budget = (
            {"request_max_tokens": self.request_max_tokens, "answer_max_tokens": int(self.section["max_tokens"])}
            if self.section.get("thinking_budget")
            else {}
        )
        origins = {k: _FINGERPRINTED[v] for k, v in sorted(self.origins.items())}
        return {**sampling_identity(self.section), "origins": origins, **budget}

    def record(self) -> dict[str, Any]:
        """What the saved config and the report's setup say of it."""
        card = {"source": self.source} if self.from_model else {}
        return {**self.section, "origins": dict(sorted(self.origins.items())), **card}


def resolve(role: str, protocol: Mapping[str, Any] | None, model: Mapping[str, Any] | None) -> RoleSampling:
    """The role's protocol entry (`protocol.<role>`), its null or absent keys filled from `model` (a model
    config's `sampling:` block), else from the paper's values. A null max_tokens is refused: the answer's cap
    is the protocol's, never a model's."""
    section = dict(plain(protocol) or {})
    if section.get("max_tokens") is None:
        raise PersonalensError(
            f"protocol.{role}.max_tokens: {section.get('max_tokens')!r}: the answer's cap is the protocol's "
            "(a number of tokens; the paper's is 800); no model config sets it"
        )
    card = {k: v for k, v in (plain(model) or {}).items() if k in KEYS and v is not None}
    paper = PAPERS.get(role, {})
    origins = {}
    for key in KEYS:
        if section.get(key) is not None:
            origins[key] = CONFIG
        elif key in card:
            section[key], origins[key] = card[key], MODEL
        elif key in paper:
            section[key], origins[key] = paper[key], PAPER
    notes = model or {}
    return RoleSampling(section, origins, notes.get("source"), notes.get("greedy_warning"))


def role_sampling(cfg: Any, role: str) -> RoleSampling:
    """The role's sampling from the config: its protocol entry and its model config's `sampling:`."""
    model = cfg[role].get("sampling")
    try:
        from personalens.engines.models.sampling import model_sampling

        model_sampling(plain(model), f"{role}")
    except PersonalensError as err:
        raise PersonalensError(f"model@{err}") from None
    return checked(role, resolve(role, cfg.protocol.get(role), plain(model) or {}))


@dataclass(frozen=True)
class Rule:
    """What a sampling value must be (vLLM's SamplingParams refuses anything else), and whether null
    is legal once resolved (vLLM's default, or no thinking budget)."""

    whole: bool
    low: float
    high: float | None = None
    low_open: bool = False
    nullable: bool = False

    def refuses(self, value: Any) -> bool:
        number = isinstance(value, int) if self.whole else isinstance(value, (int, float))
        if isinstance(value, bool) or not number or not math.isfinite(value):
            return True
        return (
            value < self.low or (self.low_open and value == self.low) or (self.high is not None and value > self.high)
        )

    def describe(self) -> str:
        kind = "a whole number" if self.whole else "a number"
        low = f"> {self.low:g}" if self.low_open else f">= {self.low:g}"
        span = f"{low} and <= {self.high:g}" if self.high is not None else low
        return f"{kind} {span}{' or null' if self.nullable else ''}"


RULES = {
    "temperature": Rule(False, 0, 2),
    "top_p": Rule(False, 0, 1, low_open=True),
    "max_tokens": Rule(True, 1),
    "thinking_budget": Rule(True, 0, nullable=True),
    "top_k": Rule(True, -1, nullable=True),
    "min_p": Rule(False, 0, 1, nullable=True),
    "presence_penalty": Rule(False, -2, 2, nullable=True),
    "repetition_penalty": Rule(False, 0, low_open=True, nullable=True),
}


def checked(role: str, chosen: RoleSampling) -> RoleSampling:
    """`chosen` once every source has filled what it sets: each value of `protocol.<role>` known and
    in its range, and a value that no source set (null, or removed from the protocol) refused where
    a request needs one; one line naming the key."""
    section = chosen.section
    unknown = sorted(set(section) - set(RULES))
    if unknown:
        raise PersonalensError(f"protocol.{role}: unknown key(s) {unknown}; known: {list(RULES)}")
    for key, rule in RULES.items():
        value = section.get(key)
        if value is None and rule.nullable:
            continue
        if value is None:
            how = "removed" if key not in section else "null"
            raise PersonalensError(
                f"protocol.{role}.{key}: {how}, and neither the protocol nor the role's model config sets it; "
                f"expected {rule.describe()}"
            )
        if rule.refuses(value):
            raise PersonalensError(f"protocol.{role}.{key}: expected {rule.describe()}, got {value!r}")
    return chosen


def notes(role: str, model: str, chosen: RoleSampling, parser: str | None, fidelity: str = "") -> list[str]:
    """What a command says once about a role's sampling: greedy decoding against the model card's advice
    (quoted), a reasoning role without a thinking budget, and under fidelity=official a user agent or judge
    that runs with its card's values instead of the released code's."""
    out = []
    if float(chosen.section["temperature"]) == 0 and chosen.greedy_warning:
        how = "as the config sets it" if chosen.origins.get("temperature") == CONFIG else "the paper's"
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
    if fidelity == "official" and role in ("user_agent", "judge") and chosen.from_model:
        release = ", ".join(f"{k} {v}" for k, v in PAPERS[role].items())
        out.append(
            f"{role}: {model} takes sampling from its card ({chosen.source}) where the config leaves it null, not "
            f"the released code's ({release}), under fidelity=official: rows are not the release's protocol; "
            f"`personalens roles` shows each value, protocol.{role}.KEY=... sets it (docs/models.md)"
        )
    return out
