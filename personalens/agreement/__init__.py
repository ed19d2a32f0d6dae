"""Judge-human agreement (the paper's Table 5): export annotation sheets for a seeded, SD/MD-stratified
sample of a run's dialogues, then score filled sheets with Fleiss' kappa among the annotators and
Cohen's kappa between each annotator and the judge (docs/agreement.md)."""

from personalens.agreement.export import Export, export
from personalens.agreement.metrics import METRICS, AgreementError
from personalens.agreement.score import score_sheets

__all__ = ["AgreementError", "Export", "METRICS", "export", "score_sheets"]
