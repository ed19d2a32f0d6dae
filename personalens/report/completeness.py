"""Which runs of a report are incomplete, from the merge.json their last `personalens merge` wrote
(store/merge_status.py): the report covers what finished and names the shards that did not, and why.
A merge whose row counts differ from the rows the report read is older than the shards; the report
says so rather than repeat it."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from personalens.store.merge_status import STATUS_FILE, read_merge_status
from personalens.store.results import RunData


def incomplete_runs(run_dirs: Sequence[Path], data: RunData) -> tuple[str, ...]:
    """One line per run whose last merge found it incomplete, or whose merge is older than its rows."""
    dialogues = Counter(d.run for d in data.dialogues)
    judgments = Counter(j.run for j in data.judgments)
    lines = []
    for run in map(str, run_dirs):
        status = read_merge_status(Path(run))
        if status is None:
            continue
        found = (status.get("dialogues"), status.get("judgments"))
        if found != (dialogues[run], judgments[run]):
            lines.append(
                f"`{run}`: its {STATUS_FILE} counted {found[0]} dialogues and {found[1]} judgments, the report read "
                f"{dialogues[run]} and {judgments[run]}: run `personalens merge` again to check that it is complete"
            )
        elif not status.get("complete", False):
            rerun = status.get("rerun") or ""
            lines.append(
                f"`{run}`: INCOMPLETE, {found[0]} of {status.get('expected_dialogues')} dialogues: "
                + "; ".join(status.get("problems", []))
                + (f". Re-run shard(s) {rerun} (on SLURM: ARRAY={rerun} slurm/submit.sh ...)" if rerun else "")
            )
    return tuple(lines)
