"""Judges compared on the same dialogues (`compare.judges`, docs/validation.md#judge-panels): one
run's dialogues scored by two or more judges of its panel, every pair B against A, per assistant
model and prompt setting. The dialogues are identical, so a difference is the judges' alone: whether
they score alike on average, not whether they agree dialogue by dialogue (the report's agreement
table says that)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from itertools import combinations
from pathlib import Path

from personalens.compare.paired import Arm, Comparison, compare_arms
from personalens.config.judges import RunJudges
from personalens.errors import PersonalensError
from personalens.prompts.setting import setting_sort_key
from personalens.store.metrics import TABLE3, TABLE12
from personalens.store.results import Judgment
from personalens.tables.stats import Bootstrap

HEADING = (
    "A comparison of judges on the same dialogues: each difference is judge B's score minus judge A's of "
    "identical dialogues, so it is the judges', not an assistant's; it says whether they score alike on "
    "average, not whether they agree dialogue by dialogue (the report's agreement table)."
)


def judge_comparisons(
    run_dir: Path, names: Sequence[str], judgments: Sequence[Judgment], judges: RunJudges, boot: Bootstrap
) -> list[Comparison]:
    """Every pair of the judges `names` (as the run saved them: "judge" for model@judge, else its
    `judges:` entry's name) on `judgments` (keyed, all judges), B against A."""
    by_name = {j.name: j for j in judges.judges.values() if j.key in judges.per_run.get(str(run_dir), ())}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise PersonalensError(
            f"compare.judges: {run_dir} has no judge {', '.join(unknown)}; its judges are {', '.join(sorted(by_name))}"
        )
    if len(set(names)) < 2:
        raise PersonalensError(f"compare.judges: name two judges or more of {run_dir}, got {list(names)}")
    groups: dict[tuple[str, str, str], list[Judgment]] = defaultdict(list)
    for j in judgments:
        groups[(j.judge, j.assistant_model, j.setting)].append(j)
    out = []
    for a, b in combinations(dict.fromkeys(names), 2):
        ka, kb = by_name[a].key, by_name[b].key
        cells = sorted({(m, s) for _, m, s in groups}, key=lambda g: (g[0], setting_sort_key(g[1])))
        for model, setting in cells:
            arm_a = Arm(run_dir, model, setting, tuple(groups.get((ka, model, setting), ())), by_name[a].label)
            arm_b = Arm(run_dir, model, setting, tuple(groups.get((kb, model, setting), ())), by_name[b].label)
            out.append(compare_arms("judges", arm_a, arm_b, (*TABLE3, *TABLE12), boot))
    return out
