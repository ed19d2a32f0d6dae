"""Which assistant system prompt a run uses: the instruction mode plus the D/I/S context flags (Table 4)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Mode = Literal["vanilla", "base"]
MODES: tuple[str, ...] = ("vanilla", "base")

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
