"""Fill the annotation sheets of a PersonalBench run as three invented annotators would, and write
them to data/personalbench/annotations/<annotator>/<stage>.csv (the bundled example annotations).

These labels are NOT human judgments: each item gets a seeded latent label (about 20% of relevance
items relevant, as in the published study), and each annotator copies it with some seeded noise, so
that agreement statistics have something to measure. They exist so that `personalens personalbench
score` runs end to end on the bundled sample. Usage, after `personalens personalbench run
personalbench=quick` and `personalens personalbench export personalbench=quick`:

    python data/personalbench/make_annotations.py runs/default/personalbench/sheets
"""

from __future__ import annotations

import csv
import random
import shutil
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent / "annotations"
ANNOTATORS = {"ann-a": 0.85, "ann-b": 0.75, "ann-c": 0.65}  # how often each follows the latent label
REASONS = ["overgeneralization", "task-context confusion", "missing evidence", "not standalone"]


def latent(stage: str, item: str) -> random.Random:
    return random.Random(f"latent/{stage}/{item}")


def answer(stage: str, item: str, annotator: str, follow: float) -> dict:
    truth, own = latent(stage, item), random.Random(f"{annotator}/{stage}/{item}")
    if stage == "attributes":
        label = truth.choices(["accept", "uncertain", "reject"], [0.45, 0.15, 0.4])[0]
        reason = truth.choice(REASONS)
        if own.random() > follow:
            label, reason = own.choice(["accept", "uncertain", "reject"]), own.choice(REASONS)
        return {"label": label, "reason": reason if label == "reject" else ""}
    if stage == "relevance":
        relevant = truth.random() < 0.2
        if own.random() > follow:
            relevant = own.random() < 0.3
        return {"label": "relevant" if relevant else "not relevant"}
    rating = truth.choice([2, 3, 3, 3, 4, 4, 5])
    if own.random() > follow:
        rating = min(5, max(1, rating + own.choice([-1, 1])))
    return {"rating": str(rating)}


def main(sheets: Path) -> None:
    if OUT.exists():
        shutil.rmtree(OUT)
    for annotator, follow in ANNOTATORS.items():
        (OUT / annotator).mkdir(parents=True)
        for stage in ("attributes", "relevance", "preference"):
            with open(sheets / f"{stage}.csv", newline="", encoding="utf-8") as f:
                reader = csv.DictReader(f)
                rows = [{**row, **answer(stage, row["item_id"], annotator, follow)} for row in reader]
                columns = reader.fieldnames
            with open(OUT / annotator / f"{stage}.csv", "w", newline="", encoding="utf-8") as f:
                writer = csv.DictWriter(f, columns)
                writer.writeheader()
                writer.writerows(rows)
    print(f"wrote {len(ANNOTATORS)} annotators' sheets to {OUT}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
