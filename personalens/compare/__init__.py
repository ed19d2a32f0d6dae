"""Paired comparisons of runs: `personalens compare RUN_A RUN_B ...` (docs/compare.md)."""

from personalens.compare.compose import build_comparison
from personalens.compare.result import ComparisonReport

__all__ = ["ComparisonReport", "build_comparison"]
