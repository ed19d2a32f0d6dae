"""`Report`: a run report's tables and where they were written (what compose.py returns and
html.py draws)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from personalens.report.panel import PanelTables
from personalens.report.setup import RunSetup
from personalens.report.user_dialogues import CheckedDialogue
from personalens.tables import render
from personalens.tables.model import Table
from personalens.tables.stats import Bootstrap

# the file stems of the checks' tables, which a report of runs without dialogues does not write
CHECK_TABLES = ("user_flags", "table3_unflagged", "table3_flag_difference", "length_score")


@dataclass(frozen=True)
class Report:
    run_dirs: tuple[Path, ...]
    out_dir: Path
    bootstrap: Bootstrap
    figure5_domains: tuple[str, ...]
    table3: Table
    table4: tuple[Table, ...]  # one per assistant model run in several prompt settings; empty if none
    table12: Table
    table13: Table
    by_domain: Table  # Figure 4's numbers
    by_turn: Table | None  # Figure 5's numbers; None without turn-level judgments
    parse_failures: Table
    endings: Table  # how dialogues ended, per run and kind (endings.py)
    cut_replies: Table  # replies cut at max_tokens, per run and role
    thinking: Table  # reasoning models' thinking tokens, replies stopped in thinking, the leak check
    stopped: Table  # the replies stopped inside their thinking, per model (endings.stopped_replies)
    leaks: int  # thinking markers in texts sent to another party (the leak check; 0 unless thinking leaked)
    found: int  # replies whose thinking was found by content in later prompts (0 unless thinking leaked)
    setups: tuple[RunSetup, ...] = ()  # per run: fidelity option and models
    mixed: tuple[str, ...] = ()  # runs resumed or written under several shard counts (provenance.py)
    # the checks of the simulated user (user_flags.py) and length against score (length.py); per judge
    user_flags: Table | None = None
    table3_unflagged: tuple[Table, ...] = ()
    flag_difference: tuple[Table, ...] = ()
    length: tuple[Table, ...] = ()
    checked: tuple[CheckedDialogue, ...] = ()  # every dialogue's flags and reply length (user_dialogues.py)
    incomplete: tuple[str, ...] = ()  # runs whose last merge found shards missing, and why (completeness.py)
    files: tuple[Path, ...] = ()  # everything written, report.md last
    panel: PanelTables | None = None  # a judge panel's tables (panel.py); None with one judge
    noise: Table | None = None  # where Table 3's noise comes from (noise.py); None without trials or judgings twice

    def checks(self) -> list[list[Table]]:
        """The checks' tables, each file's tables together: flags, Table 3 without the flagged
        dialogues, the difference, length against score."""
        groups = [[self.user_flags] if self.user_flags else [], list(self.table3_unflagged)]
        return [tables for tables in (*groups, list(self.flag_difference), list(self.length)) if tables]

    def table3_markdown(self) -> str:
        return render.markdown([self.table3])

    def leak_line(self) -> str:
        """The leak checks in one line, printed beside Table 3 as a Markdown note (in italics, as
        the table's notes are), so that stdout stays one Markdown document."""
        return f"_Leak check: {self.leaks} thinking markers sent on, {self.found} thinking found in what was sent on._"

    @property
    def unparsed(self) -> int:
        """Judgments left out of every mean because their output did not parse."""
        return self._failure_total("_unparsed")

    @property
    def out_of_range(self) -> int:
        """Scores off their dimension's scale kept in the means (fidelity=official only)."""
        return self._failure_total("_out_of_range")

    @property
    def judged(self) -> int:
        return self._failure_total("_judged")

    def _failure_total(self, suffix: str) -> int:
        table = self.parse_failures
        return sum(
            c
            for _, cells in table.rows
            for c, col in zip(cells, table.columns)
            if col.key.endswith(suffix) and isinstance(c, int)
        )
