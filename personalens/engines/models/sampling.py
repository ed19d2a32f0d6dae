"""A model's own sampling (a model config's `sampling:` block): the values its model card gives, applied
to whatever role the model plays over the protocol's, with the card named as their source and the
card's reason against greedy decoding (docs/models.md)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from personalens.errors import PersonalensError

# the keys a model's sampling may set, with the types they take; the protocol's caps (max_tokens) are
# never the model's
VALUES = {
    "temperature": (int, float),
    "top_p": (int, float),
    "top_k": (int,),
    "min_p": (int, float),
    "presence_penalty": (int, float),
    "repetition_penalty": (int, float),
    "thinking_budget": (int,),
}
NOTES = ("source", "greedy_warning")


@dataclass(frozen=True)
class ModelSampling:
    # the values set (nulls left out), sorted (name, value) pairs: configs are hashable
    values: tuple[tuple[str, Any], ...] = ()
    source: str | None = None  # where the values come from: the model card, named
    # the card's reason not to decode greedily; quoted in a warning when the role's temperature is 0
    greedy_warning: str | None = None

    @property
    def as_dict(self) -> dict[str, Any]:
        return dict(self.values)


def model_sampling(raw: Any, where: str) -> ModelSampling:
    """The `sampling:` block of a model config, checked: known keys, numbers where numbers go, a
    source named whenever a value is set."""
    if raw is None:
        return ModelSampling()
    if not isinstance(raw, Mapping):
        raise PersonalensError(f"{where}.sampling: expected a mapping such as {{temperature: 0.6, top_k: 20}}")
    unknown = sorted(set(raw) - set(VALUES) - set(NOTES))
    if unknown:
        cap = " (max_tokens is the protocol's: protocol.<role>.max_tokens)" if "max_tokens" in unknown else ""
        raise PersonalensError(f"{where}.sampling: unknown key(s) {unknown}{cap}; known: {[*VALUES, *NOTES]}")
    values = {}
    for key, value in raw.items():
        if key in NOTES or value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, VALUES[key]) or value < 0:
            raise PersonalensError(f"{where}.sampling.{key}: expected a number >= 0 or null, got {value!r}")
        values[key] = value
    for note in NOTES:
        if raw.get(note) is not None and not isinstance(raw[note], str):
            raise PersonalensError(f"{where}.sampling.{note}: expected text or null, got {raw[note]!r}")
    if values and not raw.get("source"):
        raise PersonalensError(f"{where}.sampling: values {sorted(values)} need a source (the model card they follow)")
    return ModelSampling(tuple(sorted(values.items())), raw.get("source"), raw.get("greedy_warning"))
