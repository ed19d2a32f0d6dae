"""Data problems: where they are (file, field path or line) and the one exception type for them."""

from __future__ import annotations

from dataclasses import dataclass, field

from personalens.errors import PersonalensError


@dataclass(frozen=True)
class Problem:
    file: str  # relative to the data root, e.g. "profile/user3/tasks.json"
    location: str  # field path ('"Task 4"."situations"."Device"'), "line 3", or "" for the whole file
    message: str

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


@dataclass
class Problems:
    """Collects problems; validation keeps them all, loading raises them as one DataError."""

    items: list[Problem] = field(default_factory=list)

    def add(self, file: str, location: str, message: str) -> None:
        self.items.append(Problem(file, location, message))

    def __len__(self) -> int:
        return len(self.items)

    def raise_if_any(self, root: object) -> None:
        if not self.items:
            return
        lines = [str(p) for p in self.items[:_SHOWN_IN_ERROR]]
        hidden = len(self.items) - len(lines)
        if hidden:
            lines.append(f"... and {hidden} more; run `personalens validate {root}` to list them all")
        raise DataError(f"invalid data in {root}:\n  " + "\n  ".join(lines), tuple(self.items))
