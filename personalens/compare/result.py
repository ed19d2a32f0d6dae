"""`ComparisonReport`: the comparisons of a `compare` invocation and where they were written (what
compose.py returns and page.py draws)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from personalens.compare.comparable import Mismatch
from personalens.compare.paired import Comparison
from personalens.compare.tables import comparison_table
from personalens.tables.model import Table
from personalens.tables.stats import Bootstrap

# below this many users a percentile bootstrap cannot reach its coverage (docs/compare.md)
FEW_USERS = 10


@dataclass(frozen=True)
class Accepted:
    """A difference between two runs that `compare.allow` accepted; the page's heading names it."""

    a: str
    b: str
    mismatch: Mismatch

    def line(self) -> str:
        return self.mismatch.line(self.a, self.b)


@dataclass(frozen=True)
class ComparisonReport:
    run_dirs: tuple[Path, ...]
    out_dir: Path
    bootstrap: Bootstrap
    alpha: float
    comparisons: tuple[Comparison, ...]
    accepted: tuple[Accepted, ...] = ()
    notes: tuple[str, ...] = ()  # run pairs not compared, and why
    files: tuple[Path, ...] = ()

    @property
    def tables(self) -> tuple[Table, ...]:
        return tuple(comparison_table(c, self.alpha) for c in self.comparisons)

    def few_users(self) -> list[Comparison]:
        return [c for c in self.comparisons if c.users < FEW_USERS]

    def heading_lines(self) -> list[str]:
        """What the page and compare.md say before the tables: the method, the comparisons on too few
        users, the run pairs not compared."""
        lines = [
            f"Differences are B - A over the scenarios both sides scored, a scenario's trials averaged first; "
            f"{self.bootstrap.describe()}. p-values are Holm-corrected across the metrics of one comparison "
            f"(statsmodels); rows with a corrected p below {self.alpha:g} are marked.",
        ]
        lines += [
            f"{c.title}: only {c.users} users; with fewer than {FEW_USERS} the interval falls short of its "
            "coverage and the p-values are not reliable (docs/compare.md)."
            for c in self.few_users()
        ]
        return lines + list(self.notes)
