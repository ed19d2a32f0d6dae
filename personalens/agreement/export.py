"""`agreement export`: a seeded, SD/MD-stratified sample of a run's dialogues as an annotation sheet
(CSV) with a self-contained guide page (HTML), the judge's scores left out of both."""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import jinja2
import numpy as np

from personalens.agreement.metrics import METRICS, AgreementError
from personalens.config import fingerprint
from personalens.data.records import Scenario
from personalens.paths import PROJECT_ROOT
from personalens.prompts.sections import affinities_text, demographics_text, interactions_text, situation_text
from personalens.store import KEY_COLUMNS, read_table

TEMPLATE_DIR = PROJECT_ROOT / "prompts" / "agreement"
MANIFEST = "export.json"
SHEET = "sheet.csv"
GUIDE = "guide.html"
# A sheet's identifying columns (filled in by the export), then one column per metric, then free notes.
ID_COLUMNS = ("export_id", "item", *KEY_COLUMNS, "kind", "domains")
NOTES_COLUMN = "notes"
SHEET_COLUMNS = (*ID_COLUMNS, *(m.column for m in METRICS), NOTES_COLUMN)
KINDS = ("SD", "MD")


@dataclass(frozen=True)
class Export:
    export_id: str
    out_dir: Path
    items: tuple[dict, ...]  # per sheet row: item number, KEY_COLUMNS, kind, domains

    @property
    def files(self) -> tuple[Path, ...]:
        return tuple(self.out_dir / name for name in (SHEET, GUIDE, MANIFEST))


def export(
    run_dir: Path,
    load_scenarios: Callable[[list[int]], Iterable[Scenario]],
    out_dir: Path,
    *,
    dialogues: int,
    seed: int,
) -> Export:
    """Draw `dialogues` dialogues of `run_dir` and write sheet.csv, guide.html and export.json into `out_dir`.

    `load_scenarios(user_indices)` gives the scenarios of those users, for the context the judge saw."""
    rows = _dialogues(Path(run_dir))
    chosen = draw(rows, dialogues, seed)
    scenarios = {s.key: s for s in load_scenarios(sorted({d["user_index"] for d in chosen}))}
    keys = [[d[c] for c in KEY_COLUMNS] for d in chosen]
    export_id = fingerprint({"run_ids": sorted({d["run_id"] for d in chosen}), "keys": keys, "seed": seed})
    items = tuple(
        {"item": i, **{c: d[c] for c in KEY_COLUMNS}, "kind": d["kind"], "domains": list(d["domains"])}
        for i, d in enumerate(chosen, start=1)
    )
    out_dir = Path(out_dir)
    _refuse_other_export(out_dir, export_id)
    contexts = [_context(d, scenarios, run_dir) for d in chosen]
    out_dir.mkdir(parents=True, exist_ok=True)
    _write_sheet(out_dir / SHEET, export_id, items)
    (out_dir / GUIDE).write_text(guide_html(export_id, items, chosen, contexts), encoding="utf-8")
    manifest = {
        "export_id": export_id,
        "run_dir": str(Path(run_dir).resolve()),
        "seed": seed,
        "dialogues": len(items),
        "items": list(items),
    }
    (out_dir / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    return Export(export_id, out_dir, items)


def draw(rows: Sequence[dict], n: int, seed: int) -> list[dict]:
    """`n` dialogues, SD and MD in proportion to the run (largest remainder; each present kind gets at
    least one when n allows), drawn without replacement with `seed` and shown in a seeded random order."""
    if n < 1:
        raise AgreementError(f"agreement.dialogues must be >= 1, got {n}")
    if n > len(rows):
        raise AgreementError(f"agreement.dialogues is {n} but the run holds only {len(rows)} dialogues")
    # A fixed order first, so the draw does not depend on how the rows are spread over part files.
    pools = {
        k: sorted((r for r in rows if r["kind"] == k), key=lambda r: tuple(r[c] for c in KEY_COLUMNS)) for k in KINDS
    }
    sizes = _allocate({k: len(p) for k, p in pools.items() if p}, n)
    rng = np.random.default_rng(seed)
    chosen = [pools[k][i] for k in KINDS if sizes.get(k) for i in rng.choice(len(pools[k]), sizes[k], replace=False)]
    return [chosen[i] for i in rng.permutation(len(chosen))]


def _allocate(counts: dict[str, int], n: int) -> dict[str, int]:
    total = sum(counts.values())
    quotas = {k: n * c / total for k, c in counts.items()}
    sizes = {k: int(q) for k, q in quotas.items()}
    if n >= len(counts):
        sizes = {k: max(s, 1) for k, s in sizes.items()}
    for k in sorted(quotas, key=lambda k: quotas[k] - int(quotas[k]), reverse=True):
        if sum(sizes.values()) >= n:
            break
        if sizes[k] < counts[k]:
            sizes[k] += 1
    return sizes


def _dialogues(run_dir: Path) -> list[dict]:
    table = read_table(run_dir / "dialogues")
    if table is None:
        raise AgreementError(
            f"{run_dir / 'dialogues'} holds no dialogues: run `personalens generate` "
            "(or `personalens run`) with this run.out_dir first"
        )
    return table.to_pylist()


def _refuse_other_export(out_dir: Path, export_id: str) -> None:
    path = out_dir / MANIFEST
    if path.exists():
        previous = json.loads(path.read_text(encoding="utf-8")).get("export_id")
        if previous != export_id:
            raise AgreementError(
                f"{path} belongs to export {previous}, whose sheets annotators may be filling; "
                "choose another agreement.out_dir for a new export"
            )


def _context(d: dict, scenarios: Mapping[tuple[str, str], Scenario], run_dir: Path) -> dict[str, str]:
    """What the judge saw besides the conversation (the goal for TC, the profile for P)."""
    scenario = scenarios.get((d["user_id"], d["task_id"]))
    if scenario is None:
        raise AgreementError(
            f"{run_dir}: dialogue {d['user_id']}/{d['task_id']} has no scenario in the data; "
            "export with the run's data.root"
        )
    user, domains = scenario.user, scenario.task.domains
    return {
        "Goal": scenario.task.goal,
        "Task description": scenario.task.description,
        "Demographic profile": demographics_text(user),
        "User preferences": affinities_text(user, domains),
        "Past interaction history": interactions_text(user, domains),
        "Current context": situation_text(scenario.situation),
    }


def _write_sheet(path: Path, export_id: str, items: Sequence[dict]) -> None:
    # utf-8 with a byte-order mark, so that spreadsheet programs detect the encoding
    with open(path, "w", newline="", encoding="utf-8-sig") as f:
        writer = csv.writer(f)
        writer.writerow(SHEET_COLUMNS)
        for item in items:
            writer.writerow(
                [
                    export_id,
                    item["item"],
                    *(item[c] for c in KEY_COLUMNS),
                    item["kind"],
                    "; ".join(item["domains"]),
                    *([""] * len(METRICS)),
                    "",
                ]
            )


def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATE_DIR),
        undefined=jinja2.StrictUndefined,
        autoescape=jinja2.select_autoescape(["html"]),
        trim_blocks=True,
        lstrip_blocks=True,
    )


def guide_html(
    export_id: str, items: Sequence[dict], dialogues: Sequence[dict], contexts: Sequence[Mapping[str, str]]
) -> str:
    env = _environment()
    guidelines = {m.guideline: env.get_template(f"guidelines/{m.guideline}.txt").render().strip() for m in METRICS}
    return env.get_template("guide.html").render(
        export_id=export_id,
        metrics=METRICS,
        guidelines=guidelines,
        columns=SHEET_COLUMNS,
        sheet=SHEET,
        entries=[
            {"item": item, "turns": d["turns"], "context": ctx} for item, d, ctx in zip(items, dialogues, contexts)
        ],
    )
