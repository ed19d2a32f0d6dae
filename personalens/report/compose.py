"""`build_report`: load runs, compute the tables, write tables, figures and report.md into one folder."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from personalens.config.judges import run_judges
from personalens.data.records import with_domains
from personalens.report.completeness import incomplete_runs
from personalens.report.endings import (
    context_note,
    cut_replies,
    endings,
    found_in_prompts,
    leaked,
    stopped_replies,
    thinking,
)
from personalens.report.errors import ReportError
from personalens.report.figures import plot_by_domain, plot_by_turn
from personalens.report.html import write_html
from personalens.report.length import length_table
from personalens.report.noise import noise_table
from personalens.report.panel import PANEL_FILES, panel_markdown, panel_tables
from personalens.report.paper_tables import by_domain, by_turn, parse_failures, table3, table4, table12, table13
from personalens.report.provenance import mixed_runs
from personalens.report.reference import with_paper
from personalens.report.result import CHECK_TABLES, Report
from personalens.report.setup import RunSetup, common_fidelity, published_table3, read_setup
from personalens.report.user_dialogues import FLAGS_FILE, CheckedDialogue, checked_dialogues, write_flags
from personalens.report.user_flags import flag_counts, without_flagged
from personalens.report.user_prompts import prompt_texts
from personalens.store.results import KINDS, RunData, load_runs
from personalens.store.turns import continued_dialogues
from personalens.tables import render
from personalens.tables.render import write_tables
from personalens.tables.stats import Bootstrap


def build_report(
    run_dirs: Sequence[Path],
    out_dir: Path,
    *,
    bootstrap: int = 1000,
    seed: int = 0,
    figure5_domains: Sequence[str] = (),
    html_dialogues: int = 500,
) -> Report:
    """Report on the dialogues and judgments of `run_dirs`, written into `out_dir`; report.html's
    dialogue browser shows up to `html_dialogues` of them."""
    if bootstrap < 1:
        raise ReportError(f"bootstrap: number of resamples must be >= 1, got {bootstrap}")
    if html_dialogues < 0:
        raise ReportError(f"html_dialogues: must be >= 0, got {html_dialogues}")
    dirs = tuple(Path(d) for d in run_dirs)
    # every judge's rows (merge.json counted them all); the content leak check leaves out what each
    # dialogue's prompts were made of besides the dialogue
    data = load_runs(dirs, given={str(d): prompt_texts(d) for d in dirs})
    judges = run_judges(dirs)
    defaults = [judges.default[str(d)] for d in dirs]
    keyed = judges.keyed(data.judgments)
    checked = checked_dialogues(dirs)
    # runs of one judge each (reported side by side, judged by different models) are no panel
    panel = (
        panel_tables(keyed, defaults, judges, Bootstrap(bootstrap, seed), checked[0])
        if any(len(k) > 1 for k in judges.per_run.values())
        else None
    )
    # the report's own tables hold each run's model@judge; a panel's tables hold each judge's
    primary = judges.primary(keyed)
    noise = noise_table(keyed, Bootstrap(bootstrap, seed))
    # the release's domains, and any a lab added that the runs hold
    domains = with_domains(d for j in primary for d in j.domains)
    unknown = [d for d in figure5_domains if d not in domains]
    if unknown:
        raise ReportError(f"figure5_domains: unknown domain(s) {unknown}; the domains are {', '.join(domains)}")
    report = compute_report(
        replace(data, judgments=primary),
        dirs,
        Path(out_dir),
        Bootstrap(bootstrap, seed),
        tuple(figure5_domains),
        tuple(read_setup(d) for d in dirs),
        {str(d): continued_by_shard(d) for d in dirs},
        checked,
        self_preference=tuple(judges.self_preference(defaults)),
        incomplete=incomplete_runs(dirs, data),
    )
    panel = panel and replace(panel, agreement=with_paper(panel.agreement))
    report = replace(report, panel=panel, noise=noise)
    return replace(report, files=write_report(report, html_dialogues))


def continued_by_shard(run_dir: Path) -> dict[str, int]:
    """Per shard folder of a run, the dialogues whose turns come from more than one `generate`."""
    return {folder.name: continued_dialogues(folder) for folder in sorted((run_dir / "turns").glob("shard-*"))}


def compute_report(
    data: RunData,
    run_dirs: tuple[Path, ...],
    out_dir: Path,
    boot: Bootstrap,
    figure5_domains: tuple[str, ...],
    setups: tuple[RunSetup, ...] = (),
    continued: Mapping[str, Mapping[str, int]] | None = None,
    checked: tuple[tuple[CheckedDialogue, ...], tuple[str, ...]] = ((), ()),
    self_preference: tuple[str, ...] = (),
    incomplete: tuple[str, ...] = (),
) -> Report:
    """The tables; `setups` (one per run) give the fidelity option, which decides Figure 4's task
    kinds and whether Table 3 shows the paper's published rows (`official` only); `continued` (run ->
    shard folder -> dialogues) the dialogues resumed mid-dialogue, which the provenance note names;
    `checked` the dialogues checked by the rules of the simulated user (user_dialogues.py), and why
    the leak rule could not be checked for a run; `self_preference` lines for Table 3's notes;
    `incomplete` the runs whose merge found shards missing (completeness.py), named first."""
    j = data.judgments
    shared = common_fidelity(setups) if setups else None
    official = shared is not None and shared.option.reproduces_release
    context = context_note(data.dialogues)
    mixed = mixed_runs(data.dialogues, data.judgments, continued)
    notes = (
        tuple(f"Covers only the shards that finished: {line}." for line in incomplete)
        + ((_setup_note(setups),) if setups else ())
        + ((context,) if context else ())
        + ((f"Written in more than one go (docs/reproducibility.md): {'; '.join(mixed)}.",) if mixed else ())
        + self_preference
    )
    flagged, unchecked = checked
    unflagged, difference = without_flagged(j, flagged, boot) if flagged else (None, None)
    return Report(
        run_dirs=run_dirs,
        out_dir=out_dir,
        bootstrap=boot,
        figure5_domains=figure5_domains,
        table3=table3(j, boot, published_table3() if official else None, notes),
        table4=tuple(table4(j, boot)),
        table12=table12(j, boot),
        table13=table13(data.dialogues, boot),
        by_domain=by_domain(j, boot, shared.option.figure4_kinds if shared else KINDS),
        by_turn=by_turn(j, figure5_domains, boot),
        parse_failures=parse_failures(j),
        endings=endings(data.dialogues),
        cut_replies=cut_replies(data.dialogues, j),
        thinking=thinking(data.dialogues, j),
        stopped=stopped_replies(data.dialogues),
        leaks=leaked(data.dialogues),
        found=found_in_prompts(data.dialogues),
        setups=setups,
        mixed=mixed,
        user_flags=flag_counts(flagged, unchecked) if flagged else None,
        table3_unflagged=(unflagged,) if unflagged else (),
        flag_difference=(difference,) if difference else (),
        length=(length_table(j, flagged, boot),) if flagged else (),
        checked=flagged,
        incomplete=incomplete,
    )


def _setup_note(setups: tuple[RunSetup, ...]) -> str:
    """One line naming the fidelity option, the user-agent and judge models and whether the engines
    were batch-invariant, over the runs."""

    def names(values: set) -> str:
        return ", ".join(sorted(v or "unknown" for v in values))

    return (
        f"Fidelity option: {setups[0].option.name} (docs/fidelity.md). "
        f"User agent: {names({s.user_agent for s in setups})}. Judge: {names({s.judge for s in setups})}. "
        f"{names({s.engines for s in setups}).capitalize()} (docs/reproducibility.md)."
    )


def write_report(report: Report, html_dialogues: int = 500) -> tuple[Path, ...]:
    """Write every table, the figures, report.html and report.md; returns the paths, report.md last."""
    out = report.out_dir
    out.mkdir(parents=True, exist_ok=True)
    # Outputs that this report may not produce: drop any left by an earlier report into the same folder.
    for stale in ("table4", "figure5", "noise", *CHECK_TABLES):
        for path in out.glob(f"{stale}.*"):
            path.unlink()
    for path in [p for stem in PANEL_FILES for p in out.glob(f"{stem}*.*")]:  # a panel's, per judge
        path.unlink(missing_ok=True)
    files = [
        *write_tables([report.table3], out),
        *write_tables([report.endings], out),
        *write_tables([report.cut_replies], out),
        *write_tables([report.thinking], out),
        *write_tables([report.stopped], out),
        *write_tables(report.table4, out),
        *write_tables([report.table12], out),
        *write_tables([report.table13], out),
        *write_tables([report.by_domain], out),
        plot_by_domain(report.by_domain, out / "figure4.png"),
    ]
    if report.by_turn is not None:
        files += [*write_tables([report.by_turn], out), plot_by_turn(report.by_turn, out / "figure5.png")]
    files += write_tables([report.parse_failures], out)
    for tables in report.checks():
        files += write_tables(tables, out)
    (out / FLAGS_FILE).unlink(missing_ok=True)
    if report.checked:
        files.append(write_flags(report.checked, out / FLAGS_FILE))
    if report.panel is not None:
        files += [f for table in report.panel.all for f in write_tables([table], out)]
    files += write_tables([report.noise], out) if report.noise else []
    files.append(
        write_html(report, [f for f in files if f.suffix == ".png"], out / "report.html", dialogues=html_dialogues)
    )
    summary = out / "report.md"
    summary.write_text(report_markdown(report))
    return (*files, summary)


def report_markdown(report: Report) -> str:
    """report.md: every table, the figures and the parse-failure counts, in the paper's order."""
    parts = [
        "# PersonaLens report",
        "Runs: " + ", ".join(f"`{d}`" for d in report.run_dirs),
        *(["\n".join(f"- {s.line()}" for s in report.setups)] if report.setups else []),
        *(
            [
                "**Incomplete: the tables cover only the shards that finished** (docs/cluster.md says what to "
                "resubmit):\n" + "\n".join(f"- {line}" for line in report.incomplete)
            ]
            if report.incomplete
            else []
        ),
        *(
            [
                "**Written in more than one go**: without batch-invariant engines a resumed shard or another "
                "shard count changes some dialogues (docs/reproducibility.md; docs/outputs.md says how to tell):\n"
                + "\n".join(f"- {line}" for line in report.mixed)
            ]
            if report.mixed
            else []
        ),
        f"Cells show `mean [95% CI] (n=dialogues)`; {report.bootstrap.describe()}. "
        "TCR is in percent; P is 1-4; Nat. and Coh. are 1-5.",
        f"**Unparsed judgments: {report.unparsed} of {report.judged}**, excluded from every mean "
        "(per dimension in the last table)."
        + (
            f" **Out-of-range scores: {report.out_of_range}**, kept in the means as the released code "
            "keeps them (fidelity=official; docs/fidelity.md)."
            if report.out_of_range
            else ""
        ),
        f"**Leak check: {report.leaks} thinking markers** in the texts sent to another party, and **{report.found} "
        "thinking found in what was sent on**: replies whose thinking was found by content in their own answer or a "
        "later turn, past what their prompt showed them (both 0 unless a reasoning model's thinking reached the "
        "other party or the judge; per role in the thinking table).",
        render.markdown([report.table3]),
        render.markdown([report.endings]),
        render.markdown([report.cut_replies]),
        render.markdown([report.thinking]),
        *([render.markdown([report.stopped])] if report.stopped.rows else []),
        render.markdown(report.table4)
        if report.table4
        else "### Table 4\n\nNot shown: no assistant model was run in more than one prompt setting.\n",
        render.markdown([report.table12]),
        render.markdown([report.table13]),
        "### Figure 4: TCR and P by domain\n\n![Figure 4](figure4.png)\n",
        render.markdown([report.by_domain]),
    ]
    if report.by_turn is None:
        parts.append(
            "### Figure 5\n\nNot drawn: the runs hold no turn-level personalization judgments "
            "(judge with `judging.turn_level=true` to get them).\n"
        )
    else:
        shown = {labels[-2] for labels, _ in report.by_turn.rows}
        missing = [d for d in report.figure5_domains if d not in shown]
        parts.append(
            "### Figure 5: turn-level personalization\n\n![Figure 5](figure5.png)\n"
            + (f"\nNo turn-level SD judgments for: {', '.join(missing)}.\n" if missing else "")
        )
        parts.append(render.markdown([report.by_turn]))
    parts.append(render.markdown([report.parse_failures]))
    parts += [render.markdown(tables) for tables in report.checks()]
    if report.panel is not None:
        parts.append(panel_markdown(report.panel))
    parts += [render.markdown([report.noise])] if report.noise else []
    return "\n\n".join(p.rstrip() for p in parts) + "\n"
