"""The six judged quantities of Table 5, as columns of an annotation sheet."""

from __future__ import annotations

from dataclasses import dataclass

from personalens.errors import PersonalensError


class AgreementError(PersonalensError, ValueError):
    """A bad export, sheet or option; the message names the file, row and field."""


@dataclass(frozen=True)
class SheetMetric:
    column: str  # the sheet's column, also the key of the metric in Table 5's CSV
    label: str  # Table 5's row label
    dimension: str  # the judgments' `dimension`
    speaker: str  # the judgments' `speaker` ("" for TC and P)
    scores: tuple[int, ...]  # the allowed whole-number scores
    guideline: str  # the guideline file under prompts/agreement/guidelines/

    @property
    def scale(self) -> str:
        return " or ".join(map(str, self.scores)) if len(self.scores) == 2 else f"{self.scores[0]}-{self.scores[-1]}"


# Table 5's row order. TC is judged True/False and stored as 1.0/0.0; the sheet takes 1 or 0.
METRICS: tuple[SheetMetric, ...] = (
    SheetMetric("task_completion", "Task Completion", "task_completion", "", (0, 1), "task_completion"),
    SheetMetric("personalization", "Personalization", "personalization", "", (1, 2, 3, 4), "personalization"),
    SheetMetric("naturalness_user", "Naturalness (U)", "naturalness", "user", (1, 2, 3, 4, 5), "naturalness"),
    SheetMetric("naturalness_assistant", "Naturalness (A)", "naturalness", "assistant", (1, 2, 3, 4, 5), "naturalness"),
    SheetMetric("coherence_user", "Coherence (U)", "coherence", "user", (1, 2, 3, 4, 5), "coherence"),
    SheetMetric("coherence_assistant", "Coherence (A)", "coherence", "assistant", (1, 2, 3, 4, 5), "coherence"),
)
