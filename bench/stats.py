"""How long `personalens stats` takes on a release-sized dataset (docs/performance.md).

The complete release is not bundled; this copies the users of a data root (the 3-user excerpt)
round-robin into N user directories of a temporary release layout, with the same files and
sizes as real users, and times Table 1, Tables 6-9 and Figure 3 on it.

    python bench/stats.py ../shared/personalens-data ../shared/official-code/res/schema.json --users 1500
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from release_copy import replicate

from personalens.validation.pipeline import build_stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data_root", type=Path)
    parser.add_argument("schema", type=Path)
    parser.add_argument("--users", type=int, default=1500)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = replicate(args.data_root, args.users, Path(tmp) / "data")
        started, cpu = time.perf_counter(), time.process_time()
        result = build_stats(root, "all", args.schema, Path(tmp) / "out")
        print(
            f"personalens stats on {args.users:,} users: {time.perf_counter() - started:.1f} s wall, "
            f"{time.process_time() - cpu:.1f} s CPU, {len(result.files)} files"
        )


if __name__ == "__main__":
    main()
