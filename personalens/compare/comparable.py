"""Whether two runs may be compared: what each run's saved `generate.yaml` and `judge.yaml` record
(config/saved.py) about everything except the assistant and its prompt setting, and the differences
named, so that a comparison is refused unless each difference is explicitly allowed."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from personalens.config.core import model_identity
from personalens.config.fidelity import Fidelity
from personalens.config.saved import SavedStep, read_saved

# what must be the same for a difference to be the assistant's (or its prompt setting's), by the
# name `compare.allow` takes
CHECKS = {
    "judge": "judge model",
    "user_agent": "user agent model",
    "fidelity": "fidelity option",
    "protocol": "protocol (round caps, sampling, judge sampling)",
    "templates": "prompt templates",
    "selection": "scenario selection (data root, users, kinds)",
}
# what belongs to the assistant under test: compared whatever it is, and named where it differs
ASSISTANT = {"assistant": "the assistant's own settings (its sampling, thinking budget and chat_template_kwargs)"}
# the assistant's protocol entry's keys that are its own rather than the protocol's (its cap, max_tokens, is)
_ASSISTANT_OWN = {
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "presence_penalty",
    "repetition_penalty",
    "thinking_budget",
    "origins",
    "request_max_tokens",
    "answer_max_tokens",
}
_SHOWN = 4  # differing settings named per check


@dataclass(frozen=True)
class Mismatch:
    check: str  # a key of CHECKS
    detail: str  # what differs, with both values

    def line(self, a: str, b: str) -> str:
        if self.check in ASSISTANT:
            return f"{a} and {b} differ in {ASSISTANT[self.check]}, which belong to the assistant under test: {self.detail}"
        return f"{a} and {b} differ in {CHECKS[self.check]}: {self.detail}"


def recorded(run_dir: Path) -> dict[str, Any]:
    """What the run's saved configs record for each check (None where they do not say)."""
    saved = read_saved(run_dir)
    gen, jud = saved.get("generate"), saved.get("judge")
    fidelity = [Fidelity.from_saved(s.config).identity() for s in (gen, jud) if s is not None]
    return {
        "judge": _part(jud, "judge", lambda c: model_identity(c["judge"])),
        "user_agent": _part(gen, "user_agent", lambda c: model_identity(c["user_agent"])),
        "fidelity": fidelity[0] if fidelity else None,
        "protocol": None
        if gen is None or jud is None
        else {
            "dialogue": _without_assistants_own(
                _part(gen, "protocol", lambda c: {k: v for k, v in c["protocol"].items() if k != "judge"})
            ),
            "judge": _part(jud, "sampling", lambda c: c["protocol"]["judge"]),
        },
        "templates": None if gen is None or jud is None else _templates(gen, jud),
        "assistant": None if gen is None else _assistants_own(gen),
        "selection": None
        if gen is None
        else {
            "data_root": _part(gen, "data_root", lambda c: str(Path(c["data"]["root"]).resolve())),
            "users": gen.config.get("data", {}).get("users"),
            "kinds": gen.config.get("data", {}).get("kinds"),
        },
    }


def _without_assistants_own(protocol: Any) -> Any:
    """The dialogue protocol less what belongs to the assistant: its entry keeps max_tokens alone."""
    if not isinstance(protocol, Mapping) or not isinstance(protocol.get("assistant"), Mapping):
        return protocol
    kept = {k: v for k, v in protocol["assistant"].items() if k not in _ASSISTANT_OWN}
    return {**protocol, "assistant": kept}


def _assistants_own(gen: SavedStep) -> dict[str, Any]:
    """The assistant's sampling as it ran (with where each value came from) and its template kwargs."""
    entry = _part(gen, "protocol", lambda c: c["protocol"]) or {}
    own = entry.get("assistant") if isinstance(entry, Mapping) else None
    shown = _ASSISTANT_OWN - {"origins", "request_max_tokens", "answer_max_tokens"}  # the values, not the rule
    sampling = {k: v for k, v in (own or {}).items() if k in shown and v is not None}
    kwargs = (gen.config.get("assistant") or {}).get("chat_template_kwargs") or {}
    return {"sampling": sampling, "chat_template_kwargs": dict(kwargs)}


def _part(step: SavedStep | None, key: str, from_config) -> Any:
    """A fingerprinted part as saved, or rebuilt from the saved config for runs saved before parts
    were kept (None when the config lacks it too)."""
    if step is None:
        return None
    if key in step.parts:
        return step.parts[key]
    try:
        return from_config(step.config)
    except (KeyError, TypeError, AttributeError):
        return None


def _templates(gen: SavedStep, jud: SavedStep) -> dict[str, Any]:
    """The templates' text fingerprints; for runs saved before they were kept, the template folder's
    name (the same name in two checkouts of different versions may hold different text)."""
    if "templates" in gen.parts and "templates" in jud.parts:
        return {"text": [gen.parts["templates"], jud.parts["templates"]]}
    fidelity = Fidelity.from_saved(gen.config)
    folder = (gen.config.get("prompt") or {}).get("dir") or fidelity.prompts_dir
    return {"folder (text not recorded)": Path(str(folder)).name}


def mismatches(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[Mismatch]:
    """The checks on which two runs' records differ, each with what differs."""
    out = []
    for check in (*CHECKS, *ASSISTANT):
        va, vb = a.get(check), b.get(check)
        if va is None or vb is None:
            missing = " and ".join(side for side, v in (("A", va), ("B", vb)) if v is None)
            out.append(Mismatch(check, f"not recorded for run {missing} (no generate.yaml / judge.yaml)"))
        elif va != vb:
            out.append(Mismatch(check, _describe(va, vb, None if check in ASSISTANT else _SHOWN)))
    return out


def _describe(a: Any, b: Any, shown: int | None = _SHOWN) -> str:
    # a model's name first: "name: 'SmolLM2-135M-Instruct' vs 'Llama-3.1-8B-Instruct'; dtype: ..."
    found = sorted(_leaf_differences(a, b), key=lambda d: d[0].rsplit(".", 1)[-1] != "name")
    diffs = [f"{key or 'value'}: {x!r} vs {y!r}" for key, x, y in found]
    limit = len(diffs) if shown is None else shown
    return "; ".join(diffs[:limit]) + (f"; and {len(diffs) - limit} more" if len(diffs) > limit else "")


def _leaf_differences(a: Any, b: Any, prefix: str = "") -> list[tuple[str, Any, Any]]:
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        out = []
        for key in sorted(set(a) | set(b), key=str):
            out += _leaf_differences(a.get(key), b.get(key), f"{prefix}.{key}" if prefix else str(key))
        return out
    return [] if a == b else [(prefix, a, b)]


def refusal(pairs: Sequence[tuple[str, str, list[Mismatch]]], allowed: Sequence[str]) -> str | None:
    """The message refusing the comparison when some pair differs in a check not in `allowed`."""
    refused = [(a, b, m) for a, b, found in pairs for m in found if m.check not in allowed and m.check in CHECKS]
    if not refused:
        return None
    lines = [m.line(a, b) for a, b, m in refused]
    checks = sorted({m.check for _, _, m in refused})
    return (
        "the runs are not comparable: "
        + " | ".join(lines)
        + f". Compare runs that differ only in the assistant or its prompt setting, or accept the difference "
        f"with compare.allow=[{','.join(checks)}] (the page then says so in its heading)"
    )
