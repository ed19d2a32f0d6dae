"""The forest plot of a comparison page: each comparison's differences B - A with their intervals,
TCR (percentage points) and the scores (points on their scale) in two panels, significant
differences (Holm) filled."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from personalens.compare.paired import Comparison, MetricDifference
from personalens.tables.figures import new_figure, save_png

_PANELS = (("TCR, percentage points", True), ("P, Nat., Coh., points", False))
_SIGNIFICANT, _OTHER = "tab:red", "tab:gray"


def _panel_rows(c: Comparison, tcr: bool) -> list[MetricDifference]:
    """The panel's rows that have a difference (a task kind without paired scenarios has none)."""
    return [r for r in c.rows if (r.metric.key == "TCR") == tcr and r.difference is not None]


def forest_plot(comparisons: Sequence[Comparison], alpha: float, path: Path) -> Path:
    """One row of two panels per comparison; a difference is a dot on its interval, filled red where
    Holm's p is below `alpha`, open grey elsewhere."""
    heights = [max(1, *(len(_panel_rows(c, tcr)) for _, tcr in _PANELS)) for c in comparisons]
    fig = new_figure(figsize=(10, 0.9 + sum(0.32 * h + 0.5 for h in heights)), layout="constrained")
    axes = fig.subplots(len(comparisons), 2, squeeze=False, gridspec_kw={"height_ratios": heights})
    for row_axes, c in zip(axes, comparisons):
        for ax, (unit, tcr) in zip(row_axes, _PANELS):
            rows = _panel_rows(c, tcr)
            ax.axvline(0, color="black", linewidth=0.8)
            if not rows:
                ax.text(0.5, 0.5, "no paired scenarios", ha="center", va="center", transform=ax.transAxes)
            for y, r in enumerate(reversed(rows)):
                d = r.difference
                color = _SIGNIFICANT if r.significant(alpha) else _OTHER
                ax.plot([d.lo, d.hi], [y, y], color=color, linewidth=2)
                ax.plot([d.mean], [y], "o", color=color, markerfacecolor=color if r.significant(alpha) else "white")
            ax.set_yticks(range(len(rows)), [f"{r.kind} {r.name}" for r in reversed(rows)], fontsize="small")
            ax.set_ylim(-0.6, len(rows) - 0.4)
            ax.set_xlabel(f"B - A ({unit})", fontsize="small")
            ax.grid(axis="x", alpha=0.3)
        row_axes[0].set_title(c.title, fontsize="medium", loc="left")
    return save_png(fig, path)
