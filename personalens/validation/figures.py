"""Figure 3: the demographic bar charts, drawn on matplotlib's object API (no pyplot, no display)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from personalens.tables.figures import new_figure, save_png


def plot_demographics(panels: Sequence[tuple[str, Sequence[tuple[str, int]]]], total: int, path: Path) -> Path:
    """One horizontal bar chart of participant shares (%) per (title, [(value, count), ...]) panel."""
    fig = new_figure(figsize=(12, 3.2 * ((len(panels) + 1) // 2)), layout="constrained")
    axes = fig.subplots((len(panels) + 1) // 2, 2, squeeze=False).ravel()
    for ax, (title, counts) in zip(axes, panels):
        labels = [value for value, _ in counts][::-1]  # largest on top
        shares = [100.0 * count / total if total else 0.0 for _, count in counts][::-1]
        ax.barh(range(len(labels)), shares, color="tab:blue", alpha=0.8)
        ax.set_yticks(range(len(labels)), labels, fontsize="small")
        ax.set_xlabel("% of participants")
        ax.set_title(title, fontsize="medium")
    for ax in axes[len(panels) :]:
        ax.set_visible(False)
    fig.suptitle(f"Figure 3: demographics of the {total} selected users")
    return save_png(fig, path)
