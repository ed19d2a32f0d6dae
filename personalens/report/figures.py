"""Figures 4 and 5 drawn from their data tables, as PNG files.

Figures are built on matplotlib's object API with the Agg canvas, so nothing depends on pyplot's
global state or on a display.
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

from personalens.tables.figures import cell_value, new_figure, save_png
from personalens.tables.model import Table
from personalens.tables.stats import Estimate


def _split_by_group(table: Table, label_width: int) -> dict[tuple[str, ...], list[tuple[tuple[str, ...], tuple]]]:
    """Rows keyed by the group labels in front of the last `label_width` row labels."""
    groups: dict[tuple[str, ...], list[tuple[tuple[str, ...], tuple]]] = defaultdict(list)
    for labels, cells in table.rows:
        groups[labels[:-label_width]].append((labels[-label_width:], cells))
    return groups


# full scale of each Figure 4 metric, so that the axes of different runs compare at a glance
_AXIS_TOP = {"TCR": 100.0, "P": 4.0}


def plot_by_domain(table: Table, path: Path) -> Path:
    """Figure 4: bars per domain for each metric column, the mean over domains as a dashed line."""
    groups = _split_by_group(table, 1)
    fig = new_figure(figsize=(6 * len(table.columns), 3.6 * len(groups)), layout="constrained")
    axes = fig.subplots(len(groups), len(table.columns), squeeze=False)
    for row_axes, (group, rows) in zip(axes, groups.items()):
        domains = [labels[0] for labels, _ in rows]
        for col, (ax, column) in enumerate(zip(row_axes, table.columns)):
            cells = [cells[col] for _, cells in rows]
            means = [cell_value(c) for c in cells]
            errors = [
                [m - c.lo if isinstance(c, Estimate) else 0 for m, c in zip(means, cells)],
                [c.hi - m if isinstance(c, Estimate) else 0 for m, c in zip(means, cells)],
            ]
            ax.bar(range(len(domains)), means, yerr=errors, capsize=2, color="tab:blue", alpha=0.8)
            shown = [m for m in means if not math.isnan(m)]
            if shown:
                ax.axhline(
                    sum(shown) / len(shown), linestyle="--", color="black", linewidth=1, label="mean over domains"
                )
                ax.legend(loc="lower right", fontsize="small")
            ax.set_xticks(range(len(domains)), domains, rotation=60, ha="right", fontsize="small")
            ax.set_ylabel(column.label)
            if column.key in _AXIS_TOP:
                ax.set_ylim(0, _AXIS_TOP[column.key] * 1.05)
            ax.set_title(" / ".join(group) if group else column.label, fontsize="medium")
    return save_png(fig, path)


def plot_by_turn(table: Table, path: Path) -> Path:
    """Figure 5: mean personalization by turn, one line per series, one panel per group."""
    groups = _split_by_group(table, 2)
    fig = new_figure(figsize=(6, 3.6 * len(groups)), layout="constrained")
    axes = fig.subplots(len(groups), 1, squeeze=False)
    for (ax,), (group, rows) in zip(axes, groups.items()):
        series: dict[str, list[tuple[int, float]]] = defaultdict(list)
        for (name, turn), cells in rows:
            series[name].append((int(turn), cell_value(cells[0])))
        for name, points in series.items():
            turns, means = zip(*sorted(points))
            ax.plot(turns, means, marker="o", label=name)
        ax.set_xlabel("turn")
        ax.set_ylabel(table.columns[0].label)
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.legend(fontsize="small")
        if group:
            ax.set_title(" / ".join(group), fontsize="medium")
    return save_png(fig, path)
