"""The report's exception for inputs a user can fix: missing or malformed run outputs, bad options."""

from personalens.errors import PersonalensError


class ReportError(PersonalensError, ValueError):
    """A message naming the run directory, file or option and what is wrong with it.

    A PersonalensError, so the CLI shows it as one line rather than a traceback."""
