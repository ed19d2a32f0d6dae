"""Humans in the loop: annotation sheets exported per stage (CSV to fill in, plus a self-contained
HTML page with the instructions and the items) and filled sheets read back from several annotators.

Filled sheets live in one folder per annotator: `<annotations>/<annotator>/<stage>.csv`."""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path

import jinja2

from personalens.errors import PersonalensError
from personalens.personalbench.metrics import ATTRIBUTE_LABELS, FAILURE_REASONS
from personalens.personalbench.responses import personalized_first
from personalens.personalbench.templates import DEFAULT_DIR
from personalens.store import read_table

STAGES = ("attributes", "relevance", "preference")
RELEVANCE_LABELS = {"relevant": True, "not relevant": False}
# the columns an annotator fills in, per stage
ANSWERS = {
    "attributes": ("label", "reason", "comment"),
    "relevance": ("label", "comment"),
    "preference": ("rating", "comment"),
}


def rows(out_dir: Path, table: str) -> list[dict]:
    found = read_table(Path(out_dir) / table)
    return [] if found is None else found.to_pylist()


def relevance_id(user_id: str, prompt_id: str, attribute_id: str) -> str:
    return f"{user_id}|{prompt_id}|{attribute_id}"


def pair_id(user_id: str, prompt_id: str) -> str:
    return f"{user_id}|{prompt_id}"


def sheet_items(out_dir: Path, seed: int) -> dict[str, list[dict]]:
    """The items of each stage's sheet, from a run's tables (every shard)."""
    kept = {r["user_id"]: [a for a in r["attributes"] if a["kept"]] for r in rows(out_dir, "extractions")}
    pairs = [p for p in rows(out_dir, "pairs") if p["user_id"] in kept]
    attributes = [
        {
            "item_id": a["attribute_id"],
            "user_id": u,
            "statement": a["statement"],
            "category": a["category"],
            "evidence_turn": a["turn_identifier"],
            "evidence": a["evidence"],
            "turn_text": a["turn_text"],
        }
        for u, attrs in sorted(kept.items())
        for a in attrs
    ]
    relevance = [
        {
            "item_id": relevance_id(p["user_id"], p["prompt_id"], a["attribute_id"]),
            "prompt": p["prompt"],
            "statement": a["statement"],
        }
        for p in pairs
        for a in kept[p["user_id"]]
    ]
    responses = {(r["user_id"], r["prompt_id"], r["variant"]): r["text"] for r in rows(out_dir, "responses")}
    preference = []
    for p in pairs:
        key = (p["user_id"], p["prompt_id"])
        if (*key, "generic") in responses and (*key, "personalized") in responses:
            generic, personal = responses[(*key, "generic")], responses[(*key, "personalized")]
            a, b = (personal, generic) if personalized_first(seed, *key) else (generic, personal)
            preference.append(
                {
                    "item_id": pair_id(*key),
                    "prompt": p["prompt"],
                    "attributes": " | ".join(x["statement"] for x in kept[p["user_id"]]),
                    "response_a": a,
                    "response_b": b,
                }
            )
    return {"attributes": attributes, "relevance": relevance, "preference": preference}


def export(out_dir: Path, sheets_dir: Path, seed: int) -> dict[str, int]:
    """Write `<stage>.csv` and `<stage>.html` per stage into `sheets_dir`; returns item counts."""
    sheets_dir = Path(sheets_dir)
    sheets_dir.mkdir(parents=True, exist_ok=True)
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(DEFAULT_DIR / "sheets"), autoescape=True, undefined=jinja2.StrictUndefined
    )
    counts = {}
    for stage, items in sheet_items(out_dir, seed).items():
        columns = [*(items[0] if items else {"item_id": ""}), *ANSWERS[stage]]
        with open(sheets_dir / f"{stage}.csv", "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, columns)
            writer.writeheader()
            writer.writerows({**item, **{a: "" for a in ANSWERS[stage]}} for item in items)
        html = env.get_template(f"{stage}.html").render(
            items=items, labels=ATTRIBUTE_LABELS, reasons=FAILURE_REASONS, relevance=list(RELEVANCE_LABELS)
        )
        (sheets_dir / f"{stage}.html").write_text(html, encoding="utf-8")
        counts[stage] = len(items)
    return counts


@dataclass
class Annotations:
    """Every annotator's labels by stage: attributes -> accept / uncertain / reject, relevance ->
    bool, preference -> the 1-5 rating as shown (1 = response A much better)."""

    labels: dict[str, dict[str, dict[str, object]]] = field(default_factory=lambda: {s: {} for s in STAGES})
    reasons: list[tuple[str, str]] = field(default_factory=list)  # (item, failure reason) of each rejection
    blank: int = 0  # rows left without an answer

    def annotators(self) -> list[str]:
        return sorted({a for stage in self.labels.values() for a in stage})


def load_annotations(folder: Path) -> Annotations:
    folder = Path(folder)
    if not folder.is_dir():
        raise PersonalensError(f"personalbench.annotations: no folder {folder}")
    found = Annotations()
    for annotator_dir in sorted(p for p in folder.iterdir() if p.is_dir()):
        for stage in STAGES:
            path = annotator_dir / f"{stage}.csv"
            if path.is_file():
                found.labels[stage][annotator_dir.name] = _read_sheet(path, stage, found)
    if not found.annotators():
        raise PersonalensError(f"personalbench.annotations: no filled sheets (<annotator>/<stage>.csv) in {folder}")
    return found


def _read_sheet(path: Path, stage: str, found: Annotations) -> dict[str, object]:
    labels: dict[str, object] = {}
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        missing = {"item_id", ANSWERS[stage][0]} - set(reader.fieldnames or [])
        if missing:
            raise PersonalensError(f"{path}: missing column(s) {sorted(missing)}")
        for n, row in enumerate(reader, 2):
            answer = (row[ANSWERS[stage][0]] or "").strip().lower()
            if not answer:
                found.blank += 1
                continue
            labels[row["item_id"]] = _answer(path, n, stage, answer, row, found)
    return labels


def _answer(path: Path, line: int, stage: str, answer: str, row: dict, found: Annotations) -> object:
    def bad(expected: object) -> PersonalensError:
        return PersonalensError(f"{path} line {line}: {ANSWERS[stage][0]} {answer!r}, expected one of {expected}")

    if stage == "attributes":
        if answer not in ATTRIBUTE_LABELS:
            raise bad(list(ATTRIBUTE_LABELS))
        if answer == "reject":
            reason = (row.get("reason") or "other").strip().lower() or "other"
            if reason not in FAILURE_REASONS:
                raise PersonalensError(
                    f"{path} line {line}: reason {reason!r}, expected one of {list(FAILURE_REASONS)}"
                )
            found.reasons.append((row["item_id"], reason))
        return answer
    if stage == "relevance":
        if answer not in RELEVANCE_LABELS:
            raise bad(list(RELEVANCE_LABELS))
        return RELEVANCE_LABELS[answer]
    if answer not in {"1", "2", "3", "4", "5"}:
        raise bad([1, 2, 3, 4, 5])
    return int(answer)
