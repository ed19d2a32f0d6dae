"""The roles of a command as it will run them, resolved once from the config: per role its model, its
sampling with where each value came from (config/sampling.py), and the request it sends (the answer's
cap, the thinking budget); with the fidelity option, for `plan`, `generate`, `judge` and `personalens roles`
alike. Nothing is loaded."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from personalens.config.sampling import KEYS, RoleSampling, notes, role_sampling
from personalens.errors import PersonalensError

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from personalens.engines.base import Sampling

ROLES = ("user_agent", "assistant", "judge")


@dataclass(frozen=True)
class Role:
    role: str  # user_agent, assistant or judge
    name: str  # the role, or "judge <name>" for a further judge of a panel
    model: str  # its model config's name
    parser: str | None  # its reasoning parser
    sampling: RoleSampling
    request: Sampling  # what each of its requests carries
    notes: tuple[str, ...]  # what a command says once about it (config/sampling.py notes)

    def as_dict(self) -> dict[str, Any]:
        values = {k: self.sampling.section.get(k) for k in KEYS if k in self.sampling.origins}
        return {
            "model": self.model,
            "reasoning_parser": self.parser,
            "sampling": {k: {"value": v, "from": self.sampling.origins[k]} for k, v in values.items()},
            "answer_max_tokens": int(self.sampling.section["max_tokens"]),
            "request_max_tokens": self.sampling.request_max_tokens,
            "thinking_budget_sent": self.request.thinking_budget,
            "card": self.sampling.source if self.sampling.from_model else None,
        }


@dataclass(frozen=True)
class Roles:
    fidelity: str
    roles: tuple[Role, ...]

    def as_dict(self) -> dict[str, Any]:
        return {"fidelity": self.fidelity, "roles": {r.name: r.as_dict() for r in self.roles}}

    @property
    def notes(self) -> list[str]:
        """What the roles call for, each line once (a panel's judges of one model share theirs)."""
        return list(dict.fromkeys(line for r in self.roles for line in r.notes))


def lines(resolved: dict[str, Any]) -> list[str]:
    """The roles as a person reads them, from Roles.as_dict() (plan.json's `roles`)."""
    out = [
        f"roles under fidelity={resolved['fidelity']}: each value's origin is `config` (written in a config file, "
        "an experiment, a panel entry or on the command line), `model card` (the model config's sampling, where "
        "the protocol leaves it null) or `paper` (where neither sets it; docs/models.md)"
    ]
    for name, r in resolved["roles"].items():
        values = ", ".join(f"{k} {v['value']} ({v['from']})" for k, v in r["sampling"].items())
        budget = r["sampling"].get("thinking_budget", {}).get("value")
        request = f"a reply of at most {r['request_max_tokens']:,} tokens" + (
            f" (thinking budget {budget:,}, then the answer in a request of its own)" if budget else ""
        )
        parser = f" (reasoning parser {r['reasoning_parser']})" if r["reasoning_parser"] else ""
        out += [
            f"  {name}: {r['model']}{parser}",
            f"    {values}; answer max_tokens {r['answer_max_tokens']:,} (protocol); {request}",
            *([f"    card: {r['card']}"] if r["card"] else []),
        ]
    return out


def role(cfg: DictConfig, role: str, name: str | None = None) -> Role:
    """One role as it will run, checked: values vLLM takes, and a thinking budget only where the role's model
    names a reasoning parser (vLLM counts thinking between that parser's markers, and refuses the budget
    without one)."""
    from personalens.engines.base import sampling_from

    chosen = role_sampling(cfg, role)
    parser = cfg[role].get("reasoning_parser")
    try:
        # max_tokens the answer's, thinking_budget the thinking's: engines/chat/budget.py holds each
        request = sampling_from(chosen.section)
    except PersonalensError as err:
        raise PersonalensError(f"protocol.{role}.{err}") from None
    budget = chosen.section.get("thinking_budget")
    if budget is not None and not parser:
        raise PersonalensError(
            f"protocol.{role}.thinking_budget={budget}: model {cfg[role].name} has no reasoning_parser, "
            "which a thinking budget needs to know where its thinking ends; set one or leave it null"
        )
    said = notes(role, str(cfg[role].name), chosen, parser, str(cfg.fidelity.name))
    return Role(role, name or role, str(cfg[role].name), parser, chosen, request, tuple(said))


def roles(cfg: DictConfig, names: Sequence[str] = ROLES) -> Roles:
    """The roles of `names`, the judge followed by the further judges of its panel (`judges`)."""
    from personalens.config.judges import panel

    out = [role(cfg, r) for r in names]
    if "judge" in names:
        out += [role(j.cfg, "judge", f"judge {j.name}") for j in panel(cfg)[1:]]
    return Roles(str(cfg.fidelity.name), tuple(out))
