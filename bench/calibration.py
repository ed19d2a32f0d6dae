"""The paired comparison's error rates by number of users (docs/compare.md): seeded synthetic runs
(tests/synthetic_runs.py) through `compare`'s resampling, for the expanded percentile interval of
`compare` and the plain percentile interval beside it.

For each number of users: the share of A/A comparisons (two runs drawn alike, each with its own
effect per user) whose t-test over users has p < 0.05 and whose 95% interval (expanded or plain)
excludes 0; and, for comparisons with a true improvement of 0.3 on P, the share whose interval
covers 0.3 and whose p < 0.05.

    python bench/calibration.py --draws 2000 --users 5 10 20 50
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the synthetic runs' generator
from synthetic_runs import aa_pair, better_pair  # noqa: E402

from personalens.tables.stats import Bootstrap, clustered_mean, interval  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--draws", type=int, default=2000)
    parser.add_argument("--users", type=int, nargs="+", default=[5, 10, 20, 50])
    parser.add_argument("--resamples", type=int, default=1000)
    args = parser.parse_args()
    boot = Bootstrap(args.resamples, 0)
    print(
        "| users | A/A: p < 0.05 | A/A: expanded interval excludes 0 | A/A: plain interval excludes 0 "
        "| +0.3: expanded covers | +0.3: plain covers | +0.3: p < 0.05 | seconds |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for users in args.users:
        started = time.perf_counter()
        counts = np.zeros(6)
        for seed in range(args.draws):
            a, b, owner = aa_pair(np.random.default_rng(100_000 + seed), users)
            rep = boot.replicates(b - a, users=owner.tolist())
            lo, hi = interval(rep)
            plo, phi = interval(rep, expanded=False)
            p = clustered_mean(b - a, owner.tolist()).p()
            counts[:3] += [p < 0.05, not lo <= 0 <= hi, not plo <= 0 <= phi]
            a, b, owner = better_pair(np.random.default_rng(200_000 + seed), users, 0.3)
            rep = boot.replicates(b - a, users=owner.tolist())
            lo, hi = interval(rep)
            plo, phi = interval(rep, expanded=False)
            counts[3:] += [lo <= 0.3 <= hi, plo <= 0.3 <= phi, clustered_mean(b - a, owner.tolist()).p() < 0.05]
        shares = " | ".join(f"{100 * c / args.draws:.1f}%" for c in counts)
        print(f"| {users} | {shares} | {time.perf_counter() - started:.0f} |")


if __name__ == "__main__":
    main()
