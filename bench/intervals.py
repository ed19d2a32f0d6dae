"""How much wider the report's intervals became when they began to resample users (docs/outputs.md).

Every estimate cell of Tables 3, 4, 12, 13, the by-domain table and Figure 5's table is computed
three ways on the same runs, with the same resamples and seed: resampling dialogues with the plain
percentile interval (the reports before), resampling users with the plain percentile interval, and
resampling users with the expanded percentile interval (the reports now). Printed per table: the
cells compared and the median (and range) of each method's width over the old width.

    python bench/intervals.py runs/default
    python tests/synthetic_runs.py /tmp/synthetic50 --users 50 && python bench/intervals.py /tmp/synthetic50
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

from personalens.report.compose import compute_report
from personalens.store.results import load_runs
from personalens.tables.model import Table
from personalens.tables.stats import Bootstrap, Estimate

METHODS = {
    "dialogues, plain (before)": Bootstrap(by_user=False, expanded=False),
    "users, plain": Bootstrap(expanded=False),
    "users, expanded (now)": Bootstrap(),
}


def widths(table: Table) -> dict[tuple, float]:
    return {
        (labels, col.key): cell.hi - cell.lo
        for labels, cells in table.rows
        for cell, col in zip(cells, table.columns)
        if isinstance(cell, Estimate) and not np.isnan(cell.lo)
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", type=Path, nargs="+")
    parser.add_argument("--resamples", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    data = load_runs(args.runs)
    users = len({j.scenario.user_id for j in data.judgments})
    print(f"{len(data.dialogues)} dialogues of {users} users in {', '.join(map(str, args.runs))}\n")
    tables: dict[str, dict[str, dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, boot in METHODS.items():
            boot = Bootstrap(args.resamples, args.seed, boot.by_user, boot.expanded)
            report = compute_report(data, tuple(args.runs), Path(tmp), boot, ())
            shown = [report.table3, *report.table4, report.table12, report.table13, report.by_domain]
            for table in [*shown, *([report.by_turn] if report.by_turn else [])]:
                key = table.title.split(":")[0]
                tables.setdefault(key, {}).setdefault(name, {}).update(widths(table))
    old = next(iter(METHODS))
    print("| table | cells | " + " | ".join(f"{m}: median x (range)" for m in list(METHODS)[1:]) + " |")
    print("|---|---:|" + "---:|" * (len(METHODS) - 1))
    every: dict[str, list[float]] = {m: [] for m in METHODS}
    for key, by_method in tables.items():
        base = {cell: w for cell, w in by_method[old].items() if w > 0}
        parts = []
        for method in list(METHODS)[1:]:
            ratios = [by_method[method][cell] / w for cell, w in base.items()]
            every[method] += ratios
            parts.append(f"{np.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})" if ratios else "-")
        print(f"| {key} | {len(base)} | " + " | ".join(parts) + " |")
    parts = [f"{np.median(r):.2f} ({min(r):.2f}-{max(r):.2f})" for r in list(every.values())[1:]]
    print(f"| all | {len(every[list(METHODS)[1]])} | " + " | ".join(parts) + " |")


if __name__ == "__main__":
    main()
