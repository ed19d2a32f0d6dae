"""`build_comparison`: load runs, check that they are comparable, compute every comparison, correct its
p-values over the family asked for, and write compare.md, compare.csv, compare.tex, power.csv,
power.tex, the forest plot and compare.html into one folder."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import replace
from itertools import combinations
from pathlib import Path

from personalens.compare.comparable import CHECKS, mismatches, recorded, refusal
from personalens.compare.figure import forest_plot
from personalens.compare.judges import HEADING as JUDGES_HEADING
from personalens.compare.judges import judge_comparisons
from personalens.compare.length import scenario_lengths, with_length_control
from personalens.compare.page import write_page
from personalens.compare.paired import FAMILIES, Arm, Comparison, compare_arms, correct
from personalens.compare.power import PowerPlan
from personalens.compare.result import Accepted, ComparisonReport
from personalens.config.judges import RunJudges, run_judges
from personalens.errors import PersonalensError
from personalens.prompts.setting import setting_sort_key
from personalens.store.metrics import TABLE3, TABLE4, TABLE12
from personalens.store.replies import reply_words
from personalens.store.results import load_runs
from personalens.tables import render
from personalens.tables.render import write_tables
from personalens.tables.stats import Bootstrap

BASE = "base"


def build_comparison(
    run_dirs: Sequence[Path],
    out_dir: Path,
    *,
    bootstrap: int = 2000,
    seed: int = 0,
    allow: Sequence[str] = (),
    alpha: float = 0.05,
    family: str = "all",
    power: PowerPlan | None = None,
    judges: Sequence[str] = (),
) -> ComparisonReport:
    """Every pair of `run_dirs` (B against A, A the earlier one) on Table 3's and Table 12's metrics,
    and every prompt setting of a run against its `base` on Table 4's, Holm-corrected over `family`
    (paired.FAMILIES), with power tables for `power` (by default 80%, no planned differences);
    written into `out_dir`. With `judges` (names of one run's judges), that run's dialogues under
    every pair of them instead (compare/judges.py). Each run's tables hold its model@judge's rows."""
    power = power or PowerPlan()
    unknown = [a for a in allow if a not in CHECKS]
    if unknown:
        raise PersonalensError(f"compare.allow: unknown check(s) {unknown}; the checks are {', '.join(CHECKS)}")
    if bootstrap < 1:
        raise PersonalensError(f"compare.bootstrap: number of resamples must be >= 1, got {bootstrap}")
    if not 0.0 < alpha < 1.0:
        raise PersonalensError(f"compare.alpha: must be between 0 and 1, got {alpha}")
    if family not in FAMILIES:
        raise PersonalensError(f"compare.family: {family!r} is none of {', '.join(FAMILIES)}")
    _check_power(power)
    dirs = tuple(Path(d) for d in run_dirs)
    if not dirs:
        raise PersonalensError("compare: no runs given (personalens compare RUN_A RUN_B ...)")
    missing = [str(d) for d in dirs if not d.is_dir()]
    if missing:
        raise PersonalensError(f"compare: run directory {', '.join(missing)} does not exist")
    if len({d.resolve() for d in dirs}) < len(dirs):
        raise PersonalensError(f"compare: a run directory is given twice ({', '.join(map(str, dirs))})")
    if judges and len(dirs) != 1:
        raise PersonalensError(
            f"compare.judges compares the judges of one run's dialogues: give one run, not {len(dirs)}"
        )
    # the comparability of every pair is settled before any Parquet file is read
    checked = [(str(a), str(b), mismatches(recorded(a), recorded(b))) for a, b in combinations(dirs, 2)]
    refused = refusal(checked, allow)
    if refused:
        raise PersonalensError(refused)
    boot = Bootstrap(bootstrap, seed)
    panel = run_judges(dirs)
    if judges:
        keyed = panel.keyed(load_runs(dirs, dialogues=False).judgments)
        comparisons = judge_comparisons(dirs[0], judges, keyed, panel, boot)
        named = [j.key for j in panel.judges.values() if j.name in judges]
        notes = [JUDGES_HEADING, *panel.self_preference(named)]
        return _written(dirs, out_dir, boot, alpha, comparisons, family, power, [], notes)
    arms = {d: _arms(d, panel) for d in dirs}
    comparisons: list[Comparison] = []
    notes: list[str] = []
    for a, b in combinations(dirs, 2):
        pairs, note = _paired_arms(arms[a], arms[b])
        comparisons += [compare_arms("runs", x, y, (*TABLE3, *TABLE12), boot) for x, y in pairs]
        notes += [note] if note else []
    for d in dirs:
        comparisons += [compare_arms("settings", x, y, TABLE4, boot) for x, y in _setting_pairs(arms[d])]
    words = {str(d): reply_words(d) for d in dirs}
    comparisons = [
        with_length_control(
            c, *(scenario_lengths(words[str(x.run_dir)], x.assistant_model, x.setting) for x in (c.a, c.b)), boot
        )
        for c in comparisons
    ]
    if not comparisons:
        raise PersonalensError(
            "compare: nothing to compare: give two or more runs, or a run with several prompt settings "
            "including base, or compare.judges=[A,B] for one run's judges" + (f" ({'; '.join(notes)})" if notes else "")
        )
    notes += panel.self_preference([panel.default[str(d)] for d in dirs])
    return _written(dirs, out_dir, boot, alpha, comparisons, family, power, checked, notes)


def _written(
    dirs: tuple[Path, ...],
    out_dir: Path,
    boot: Bootstrap,
    alpha: float,
    comparisons: list[Comparison],
    family: str,
    power: PowerPlan,
    checked: list[tuple[str, str, list]],
    notes: list[str],
) -> ComparisonReport:
    """The comparisons Holm-corrected over `family`, written into `out_dir`."""
    result = ComparisonReport(
        run_dirs=dirs,
        out_dir=Path(out_dir),
        bootstrap=boot,
        alpha=alpha,
        comparisons=correct(comparisons, family),
        family=family,
        power=power,
        accepted=tuple(Accepted(a, b, m) for a, b, found in checked for m in found),
        notes=tuple(notes),
    )
    return replace(result, files=write_comparison(result))


def _check_power(power: PowerPlan) -> None:
    keys = sorted({m.key for m in (*TABLE3, *TABLE12)})
    if not 0.0 < power.target < 1.0:
        raise PersonalensError(f"compare.power.target: must be between 0 and 1, got {power.target}")
    for key, difference in power.differences:
        if key not in keys:
            raise PersonalensError(
                f"compare.power.differences: unknown metric {key!r}; the metrics are {', '.join(keys)}"
            )
        if difference == 0:
            raise PersonalensError(f"compare.power.differences: {key}: no number of users finds a difference of 0")


def _arms(run_dir: Path, panel: RunJudges) -> list[Arm]:
    """The run's judgments of its model@judge by assistant model and prompt setting."""
    groups = defaultdict(list)
    for j in panel.primary(load_runs([run_dir], dialogues=False).judgments):
        groups[(j.assistant_model, j.setting)].append(j)
    return [
        Arm(run_dir, model, setting, tuple(js))
        for (model, setting), js in sorted(groups.items(), key=lambda g: (g[0][0], setting_sort_key(g[0][1])))
    ]


def _paired_arms(a: list[Arm], b: list[Arm]) -> tuple[list[tuple[Arm, Arm]], str | None]:
    """Which arms of two runs meet: the only one of each, whatever their settings; else those of the
    same prompt setting (and model count) in both."""
    if len(a) == 1 and len(b) == 1:
        return [(a[0], b[0])], None
    by_setting_a, by_setting_b = defaultdict(list), defaultdict(list)
    for arm in a:
        by_setting_a[arm.setting].append(arm)
    for arm in b:
        by_setting_b[arm.setting].append(arm)
    shared = sorted(by_setting_a.keys() & by_setting_b.keys(), key=setting_sort_key)
    pairs = [
        (by_setting_a[s][0], by_setting_b[s][0]) for s in shared if len(by_setting_a[s]) == len(by_setting_b[s]) == 1
    ]
    if pairs:
        return pairs, None
    return (
        [],
        f"{a[0].run} and {b[0].run} hold several prompt settings and none in common, so no pair of them is compared",
    )


def _setting_pairs(arms: list[Arm]) -> list[tuple[Arm, Arm]]:
    """Table 4 inside a run: each other setting of a model against that model's `base`."""
    by_model = defaultdict(dict)
    for arm in arms:
        by_model[arm.assistant_model][arm.setting] = arm
    return [
        (settings[BASE], arm)
        for model, settings in sorted(by_model.items())
        if BASE in settings and len(settings) > 1
        for setting, arm in settings.items()
        if setting != BASE
    ]


def write_comparison(result: ComparisonReport) -> tuple[Path, ...]:
    """compare.csv, compare.tex, the forest plot, compare.html and compare.md (last)."""
    out = result.out_dir
    out.mkdir(parents=True, exist_ok=True)
    files = [*write_tables(result.tables, out, formats=("csv", "tex"))]
    files += write_tables(result.power_tables, out, formats=("csv", "tex"))
    figure = forest_plot(result.comparisons, result.alpha, out / "forest.png")
    files += [figure, write_page(result, figure, out / "compare.html")]
    summary = out / "compare.md"
    summary.write_text(comparison_markdown(result), encoding="utf-8")
    return (*files, summary)


def comparison_markdown(result: ComparisonReport) -> str:
    accepted = [f"**{a.label.capitalize()}:** {a.line()}." for a in result.accepted]
    parts = [
        "# PersonaLens comparison",
        *(["\n".join(f"- {line}" for line in accepted)] if accepted else []),
        "Runs: " + ", ".join(f"`{d}`" for d in result.run_dirs),
        *result.heading_lines(),
        "![Differences B - A with their intervals](forest.png)",
        render.markdown(result.tables),
        "## Power",
        render.markdown(result.power_tables),
    ]
    return "\n\n".join(p.rstrip() for p in parts) + "\n"
