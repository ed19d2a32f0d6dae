"""Data problems: where they are (file, field path or line) and the one exception type for them.

A problem is an error (a real fault: the data cannot be read as meant) or a warning (a quirk of the
official release that its own code tolerates; the loader reads through it the same way). Warnings
carry a kind, by which they are grouped when shown, so 1,500 users do not print hundreds of lines."""

from __future__ import annotations

from dataclasses import dataclass, field

from personalens.errors import PersonalensError


@dataclass(frozen=True)
class Problem:
    file: str  # relative to the data root, e.g. "profile/user3/tasks.json"
    location: str  # field path ('"Task 4"."situations"."Device"'), "line 3", or "" for the whole file
    message: str
    kind: str | None = None  # set for warnings only: the quirk, as shown in the grouped summary

    @property
    def is_warning(self) -> bool:
        return self.kind is not None

    def __str__(self) -> str:
        return f"{self.file}: {self.location}: {self.message}" if self.location else f"{self.file}: {self.message}"


class DataError(PersonalensError, ValueError):
    """Bad data on disk or a bad data selection; the message names the file and field.

    A PersonalensError, so the CLI shows it as a message rather than a traceback."""

    def __init__(self, message: str, problems: tuple[Problem, ...] = ()):
        super().__init__(message)
        self.problems = problems


# A loader that meets many faults (e.g. in 1,500 users) shows this many and points to `validate`.
_SHOWN_IN_ERROR = 20
# locations listed for each kind of warning in the grouped summary
_SHOWN_PER_WARNING = 3


@dataclass
class Problems:
    """Collects problems; validation keeps them all, loading raises them as one DataError."""

    items: list[Problem] = field(default_factory=list)

    def add(self, file: str, location: str, message: str, kind: str | None = None) -> None:
        self.items.append(Problem(file, location, message, kind))

    def __len__(self) -> int:
        return len(self.items)

    def errors(self, strict: bool = False) -> list[Problem]:
        """The faults; with `strict`, warnings count as faults too (for data authors)."""
        return [p for p in self.items if strict or not p.is_warning]

    @property
    def warnings(self) -> list[Problem]:
        return [p for p in self.items if p.is_warning]

    def raise_if_any(self, root: object, strict: bool = False) -> None:
        errors = self.errors(strict)
        if not errors:
            return
        lines = [str(p) for p in errors[:_SHOWN_IN_ERROR]]
        hidden = len(errors) - len(lines)
        if hidden:
            lines.append(f"... and {hidden} more; run `personalens validate {root}` to list them all")
        raise DataError(f"invalid data in {root}:\n  " + "\n  ".join(lines), tuple(errors))


def summarize_warnings(warnings: list[Problem] | tuple[Problem, ...]) -> list[str]:
    """One line per kind of warning (count, first few locations), in order of first appearance."""
    groups: dict[str, list[Problem]] = {}
    for warning in warnings:
        groups.setdefault(warning.kind or "", []).append(warning)
    lines = []
    for kind, items in groups.items():
        shown = "; ".join(str(p) for p in items[:_SHOWN_PER_WARNING])
        more = f"; and {len(items) - _SHOWN_PER_WARNING} more" if len(items) > _SHOWN_PER_WARNING else ""
        lines.append(f"warning: {kind} ({len(items)}): {shown}{more}")
    return lines
