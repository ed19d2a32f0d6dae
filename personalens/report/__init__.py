"""The run report: Tables 3, 4, 12, 13, Figures 4 and 5, report.md and report.html from the Parquet
outputs of one or more runs (docs/outputs.md)."""

from personalens.report.compose import Report, build_report
from personalens.report.errors import ReportError

__all__ = ["Report", "ReportError", "build_report"]
