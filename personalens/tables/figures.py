"""matplotlib helpers shared by every pipeline's figures: figures are built on the object API with
the Agg canvas, so nothing depends on pyplot's global state or on a display."""

from __future__ import annotations

import math
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from personalens.tables.stats import Estimate

DPI = 150


def new_figure(**kwargs: object) -> Figure:
    """A figure on the Agg canvas (no display, no pyplot state)."""
    fig = Figure(**kwargs)
    FigureCanvasAgg(fig)
    return fig


def save_png(fig: Figure, path: Path) -> Path:
    fig.savefig(path, dpi=DPI)
    return path


def cell_value(cell: object) -> float:
    """A table cell as a number to plot: an estimate's mean, NaN for anything else."""
    return cell.mean if isinstance(cell, Estimate) else math.nan
