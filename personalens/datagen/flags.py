"""The share of profiles the consistency check (Figure 21) flags, per domain: a table for the report
renderers (render.markdown / csv_text / latex)."""

from __future__ import annotations

from collections.abc import Mapping

from statsmodels.stats.proportion import proportion_confint

from personalens.tables.model import Column, Table
from personalens.tables.stats import Estimate


def consistency_table(counts: Mapping[str, tuple[int, int]], context: tuple[tuple[str, str], ...] = ()) -> Table:
    """One row per label (domain, cross-domain, any) from (profiles checked, profiles flagged);
    the share flagged in percent with its 95% Wilson interval."""
    rows = []
    for label, (checked, flagged) in counts.items():
        lo, hi = proportion_confint(flagged, checked, alpha=0.05, method="wilson") if checked else (float("nan"),) * 2
        share = Estimate(flagged / checked if checked else float("nan"), lo, hi, checked).scaled(100)
        rows.append(((label,), (checked, flagged, share)))
    return Table(
        name="flags",
        title="Profiles flagged by the consistency check (Figure 21)",
        row_header=("Domain",),
        columns=(
            Column("checked", "", "Profiles checked", holds="count"),
            Column("flagged", "", "Flagged", holds="count"),
            Column("share", "", "Flagged (%)", digits=1, holds="estimate"),
        ),
        rows=tuple(rows),
        context=context,
        notes=(
            "A profile is flagged in a domain when the checker labels a conflict (1) within it; "
            "'Cross-domain' counts conflicts between domains and 'Any' profiles flagged anywhere. "
            "Intervals: 95% Wilson.",
        ),
    )
