"""Reading filled annotation sheets, with an error naming the file, row and field of every mistake."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from personalens.agreement.export import ID_COLUMNS, MANIFEST, SHEET_COLUMNS
from personalens.agreement.metrics import METRICS, AgreementError
from personalens.store import KEY_COLUMNS


@dataclass(frozen=True)
class Manifest:
    export_id: str
    items: tuple[dict, ...]


@dataclass(frozen=True)
class Sheet:
    annotator: str  # the file's stem
    scores: Mapping[int, Mapping[str, int]]  # item -> metric column -> score


def read_manifest(export_dir: Path) -> Manifest:
    path = Path(export_dir) / MANIFEST
    if not path.is_file():
        raise AgreementError(
            f"{path} not found: agreement.out_dir must be the folder that `personalens agreement export` wrote"
        )
    data = json.loads(path.read_text(encoding="utf-8"))
    return Manifest(data["export_id"], tuple(data["items"]))


def read_sheets(paths: Sequence[Path], manifest: Manifest) -> list[Sheet]:
    paths = [Path(p) for p in paths]
    if len(paths) < 2:
        raise AgreementError(f"agreement.sheets needs the filled sheets of two or more annotators, got {len(paths)}")
    stems = [p.stem for p in paths]
    repeated = sorted({s for s in stems if stems.count(s) > 1})
    if repeated:
        raise AgreementError(
            f"agreement.sheets: annotators are named by file name, and {', '.join(repeated)} appears more than once"
        )
    return [read_sheet(p, manifest) for p in paths]


def read_sheet(path: Path, manifest: Manifest) -> Sheet:
    if not path.is_file():
        raise AgreementError(f"sheet {path} not found")
    with open(path, newline="", encoding="utf-8-sig") as f:
        text = f.read()
    try:  # spreadsheet programs in some locales save with ';' or tabs
        dialect = csv.Sniffer().sniff(text.partition("\n")[0], delimiters=",;\t")
    except csv.Error:
        dialect = csv.excel
    rows = list(csv.reader(io.StringIO(text), dialect=dialect))
    header = rows[0] if rows else []
    missing = [c for c in SHEET_COLUMNS if c not in header]
    if missing:
        raise AgreementError(
            f"{path}: missing column(s) {', '.join(missing)}; keep the header row of the exported sheet"
        )
    items = {int(item["item"]): item for item in manifest.items}
    scores: dict[int, dict[str, int]] = {}
    first_row: dict[int, int] = {}
    for line, values in enumerate(rows[1:], start=2):  # the spreadsheet's row numbers: the header is row 1
        if not any(v.strip() for v in values):
            continue  # a blank line
        row = dict(zip(header, values + [""] * (len(header) - len(values))))
        where = f"{path}: row {line}"
        if row["export_id"] != manifest.export_id:
            raise AgreementError(
                f"{where}, field export_id: {row['export_id']!r} is not this export "
                f"({manifest.export_id}); the sheet belongs to another export"
            )
        item = _item(row, items, where)
        if item in scores:
            raise AgreementError(f"{where}, field item: duplicate row for item {item} (first at row {first_row[item]})")
        first_row[item] = line
        scores[item] = {m.column: _score(row[m.column], m, f"{where}, field {m.column}") for m in METRICS}
    absent = sorted(set(items) - set(scores))
    if absent:
        first = items[absent[0]]
        raise AgreementError(
            f"{path}: missing dialogue(s): item(s) {', '.join(map(str, absent))} "
            f"(e.g. item {absent[0]}: {first['user_id']}/{first['task_id']}) have no row"
        )
    return Sheet(path.stem, scores)


def _item(row: dict, items: Mapping[int, dict], where: str) -> int:
    try:
        item = int(row["item"])
    except ValueError:
        raise AgreementError(f"{where}, field item: {row['item']!r} is not an item number") from None
    if item not in items:
        raise AgreementError(f"{where}, field item: the export has no item {item} (it has 1-{len(items)})")
    for column in KEY_COLUMNS:  # the row must still describe the exported dialogue
        if str(row[column]).strip() != str(items[item][column]):
            raise AgreementError(
                f"{where}, field {column}: {row[column]!r} but item {item} of the export has "
                f"{items[item][column]!r}; leave the columns {', '.join(ID_COLUMNS)} unchanged"
            )
    return item


def _score(text: str | None, metric, where: str) -> int:
    text = (text or "").strip()
    try:
        value = float(text)  # a spreadsheet may save 3 as 3.0
    except ValueError:
        value = float("nan")
    if value not in metric.scores:
        shown = repr(text) if text else "empty"
        raise AgreementError(f"{where}: {shown} is out of range; {metric.label} takes a whole number {metric.scale}")
    return int(value)
