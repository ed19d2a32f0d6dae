"""`ComparisonReport`: the comparisons of a `compare` invocation and where they were written (what
compose.py returns and page.py draws)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from personalens.compare.comparable import ASSISTANT, Mismatch
from personalens.compare.paired import FAMILIES, Comparison
from personalens.compare.power import PowerPlan
from personalens.compare.tables import comparison_table, power_table
from personalens.tables.model import Table
from personalens.tables.stats import Bootstrap

# below this many users the expanded percentile interval falls short of its coverage (docs/compare.md)
FEW_USERS = 10


@dataclass(frozen=True)
class Accepted:
    """A difference between two runs that `compare.allow` accepted; the page's heading names it."""

    a: str
    b: str
    mismatch: Mismatch

    def line(self) -> str:
        return self.mismatch.line(self.a, self.b)

    @property
    def label(self) -> str:
        """How the page and the terminal introduce it: the assistant's own settings are compared by design."""
        return "assistants set up differently" if self.mismatch.check in ASSISTANT else "compared despite a difference"


@dataclass(frozen=True)
class ComparisonReport:
    run_dirs: tuple[Path, ...]
    out_dir: Path
    bootstrap: Bootstrap
    alpha: float
    comparisons: tuple[Comparison, ...]
    family: str = "all"  # compare.family: which tests were corrected together (paired.FAMILIES)
    power: PowerPlan = PowerPlan()
    accepted: tuple[Accepted, ...] = ()
    notes: tuple[str, ...] = ()  # run pairs not compared, and why
    files: tuple[Path, ...] = ()

    @property
    def tables(self) -> tuple[Table, ...]:
        return tuple(comparison_table(c, self.alpha, self.assistant_differences(c)) for c in self.comparisons)

    def assistant_differences(self, c: Comparison) -> tuple[str, ...]:
        """The lines naming how the assistants of a comparison's two runs were set up differently."""
        runs = {str(c.a.run_dir), str(c.b.run_dir)}
        return tuple(
            f"Assistants set up differently: {a.mismatch.detail}."
            for a in self.accepted
            if a.mismatch.check in ASSISTANT and {a.a, a.b} == runs and c.kind == "runs"
        )

    @property
    def power_tables(self) -> tuple[Table, ...]:
        return tuple(power_table(c, self.alpha, self.power) for c in self.comparisons)

    def few_users(self) -> list[Comparison]:
        return [c for c in self.comparisons if c.users < FEW_USERS]

    def heading_lines(self) -> list[str]:
        """What the page and compare.md say before the tables: the method, the comparisons on too few
        users, the run pairs not compared."""
        lines = [
            f"Differences are B - A over the scenarios both sides scored, a scenario's trials averaged first; "
            f"{self.bootstrap.describe()}. p-values are two-sided t-tests over the same users with their "
            "cluster-robust standard error (no resampling floor). " + self.family_line(),
        ]
        lines += [
            f"{c.title}: only {c.users} users; with fewer than {FEW_USERS} the interval falls short of its "
            "coverage, so it and the p-value can disagree: mark by Holm's p (docs/compare.md)."
            for c in self.few_users()
        ]
        return lines + list(self.notes)

    def family_line(self) -> str:
        """Which tests were Holm-corrected together, and how many each family holds."""
        tests = sum(c.tests for c in self.comparisons)
        if self.family == "none":
            return (
                f"No correction (compare.family=none): each of the {tests} tests is marked where its own p is "
                f"below {self.alpha:g}, so when nothing differs about {self.alpha * tests:.2g} of them are marked."
            )
        sizes = " or ".join(map(str, sorted({c.family for c in self.comparisons if c.tests})))
        across = ", none across comparisons" if self.family == "comparison" and len(self.comparisons) > 1 else ""
        return (
            f"Holm's correction over {FAMILIES[self.family]} (compare.family={self.family}): families of {sizes} "
            f"tests{across}, {tests} tests in all; rows with a corrected p below {self.alpha:g} are marked."
        )
