"""Which assistant system prompt a run uses: the instruction mode plus the D/I/S context flags (Table 4)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Mode = Literal["vanilla", "base"]
MODES: tuple[str, ...] = ("vanilla", "base")

# Table 4's row order; the full ablation is shown under the paper's name for it.
SETTING_ORDER = ("vanilla", "base", "base+D", "base+I", "base+S", "base+D+I+S")
SETTING_LABELS = {"base+D+I+S": "base+all"}

# Label letter of each context flag, in the order labels list them.
_FLAG_LETTERS: tuple[tuple[str, str], ...] = (
    ("demographics", "D"),
    ("interactions", "I"),
    ("situation", "S"),
)


@dataclass(frozen=True)
class PromptSetting:
    mode: Mode = "base"
    demographics: bool = False  # D: the user's demographics
    interactions: bool = False  # I: past-interaction summaries of the task's domains
    situation: bool = False  # S: the user's current situation

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"prompt mode must be one of {', '.join(MODES)}, got {self.mode!r}")

    @property
    def label(self) -> str:
        """ "base", "base+I", "vanilla+D+I+S", ...: the mode, then the flags that are on, in D, I, S order."""
        letters = [letter for name, letter in _FLAG_LETTERS if getattr(self, name)]
        return "+".join([self.mode, *letters])

    @classmethod
    def from_label(cls, label: str) -> PromptSetting:
        mode, *letters = label.split("+")
        if mode not in MODES:
            raise ValueError(f"prompt setting {label!r}: must start with one of {', '.join(MODES)}")
        known = [letter for _, letter in _FLAG_LETTERS]
        # Only the canonical spelling is accepted, so one setting has exactly one label.
        if any(letter not in known for letter in letters) or letters != sorted(set(letters), key=known.index):
            raise ValueError(f"prompt setting {label!r}: flags must be among D, I, S, each once, in that order")
        flags = {name: letter in letters for name, letter in _FLAG_LETTERS}
        return cls(mode=mode, **flags)  # type: ignore[arg-type]


def setting_label(label: str) -> str:
    """A setting as tables show it: the paper's name for the full ablation."""
    return SETTING_LABELS.get(label, label)


def setting_sort_key(label: str) -> tuple[int, str]:
    """Table 4's order, then settings it does not have by label."""
    return (SETTING_ORDER.index(label), "") if label in SETTING_ORDER else (len(SETTING_ORDER), label)
