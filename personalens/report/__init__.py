"""Tables, figures and report.md from the Parquet outputs of one or more runs (docs/outputs.md)."""

from personalens.report.build import Report, build_report
from personalens.report.errors import ReportError
from personalens.report.stats import Estimate, bootstrap_ci
from personalens.report.tables import Table

__all__ = ["Report", "ReportError", "build_report", "Estimate", "bootstrap_ci", "Table"]
