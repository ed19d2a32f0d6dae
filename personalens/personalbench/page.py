"""PersonalBench's report.html: the score tables (all / sensitive / rest, with intervals), the
selection figure, and a browser of the model outputs per (user, prompt) pair: the user's attributes
with their evidence, each method's relevance decision, the generic and personalized responses, and
the judge's and the annotators' ratings. Rendered from templates/personalbench.html with the toolkit's page
pieces (tables/page.py), from a run's tables (every shard) and the filled annotation sheets."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from personalens.personalbench.formats import personalized_rating
from personalens.personalbench.sheets import Annotations, pair_id, relevance_id, rows
from personalens.tables.model import Table
from personalens.tables.page import figure_view, render_page, script_json, table_view
from personalens.tables.stats import Bootstrap

FIGURE_TITLES = {"selection": "Selection rate of the humans and each method (over-retrieval at a glance)"}


@dataclass(frozen=True)
class Browsable:
    pairs: tuple[dict, ...]  # JSON-ready, one per (user, prompt)
    total: int  # pairs in the run


def browsable(out_dir: Path, notes: Annotations, limit: int, seed: int) -> Browsable:
    """The pairs of a run with everything each stage produced for them and the humans' labels;
    a seeded sample of `limit` pairs when the run holds more."""
    pairs = sorted(rows(out_dir, "pairs"), key=lambda p: (p["user_id"], p["prompt_id"]))
    total = len(pairs)
    if total > limit:
        pairs = [pairs[i] for i in sorted(np.random.default_rng(seed).choice(total, limit, replace=False))]
    users = {p["user_id"] for p in pairs}
    attributes = {r["user_id"]: r["attributes"] for r in rows(out_dir, "extractions") if r["user_id"] in users}
    decisions: dict[str, dict[str, dict]] = defaultdict(dict)
    for r in rows(out_dir, "relevance"):
        if r["user_id"] in users:
            decisions[relevance_id(r["user_id"], r["prompt_id"], r["attribute_id"])][r["method"]] = {
                "selected": r["selected"],
                "score": r["score"],
                "text": r["text"],
                "model": r["model"],
            }
    responses = {
        (r["user_id"], r["prompt_id"], r["variant"]): r for r in rows(out_dir, "responses") if r["user_id"] in users
    }
    judged = {pair_id(r["user_id"], r["prompt_id"]): r for r in rows(out_dir, "preferences") if r["user_id"] in users}
    reasons: dict[str, list[str]] = defaultdict(list)
    for item, reason in notes.reasons:
        reasons[item].append(reason)

    def humans(stage: str, item: str) -> dict[str, object]:
        return {a: labels[item] for a, labels in sorted(notes.labels[stage].items()) if item in labels}

    out = []
    for p in pairs:
        pid = pair_id(p["user_id"], p["prompt_id"])
        judge = judged.get(pid)
        personalized = responses.get((p["user_id"], p["prompt_id"], "personalized"))
        out.append(
            {
                "user": p["user_id"],
                "prompt_id": p["prompt_id"],
                "prompt": p["prompt"],
                "sensitive": p["sensitive"],
                "attributes": [
                    {
                        "id": a["attribute_id"],
                        "statement": a["statement"],
                        "category": a["category"],
                        "confidence": a["confidence"],
                        "turn": a["turn_identifier"],
                        "evidence": a["evidence"],
                        "turn_text": a["turn_text"],
                        "evidence_ok": a["evidence_ok"],
                        "kept": a["kept"],
                        "drop_reason": a["drop_reason"] or "",
                        "sensitive": a["sensitive"],
                        "labels": humans("attributes", a["attribute_id"]),
                        "reasons": reasons.get(a["attribute_id"], []),
                        "relevance": decisions.get(relevance_id(p["user_id"], p["prompt_id"], a["attribute_id"]), {}),
                        "relevant": humans("relevance", relevance_id(p["user_id"], p["prompt_id"], a["attribute_id"])),
                    }
                    for a in attributes.get(p["user_id"], [])
                ],
                "generic": (responses.get((p["user_id"], p["prompt_id"], "generic")) or {}).get("text"),
                "personalized": personalized and personalized["text"],
                "used": list(personalized["attribute_ids"]) if personalized else [],
                "judge": judge
                and {
                    "rating": judge["rating"],
                    "score": judge["score"],
                    "parsed": judge["parsed"],
                    "personalized_first": judge["personalized_first"],
                    "explicit_mention": judge["explicit_mention"],
                    "text": judge["text"],
                },
                # the annotators rated A against B as shown; as ratings of the personalized response, like the judge's
                "ratings": {
                    a: personalized_rating(v, judge["personalized_first"]) for a, v in humans("preference", pid).items()
                }
                if judge
                else {},
            }
        )
    return Browsable(tuple(out), total)


def write_html(
    out_dir: Path,
    tables: Sequence[Table],
    figures: Sequence[Path],
    notes: Annotations,
    path: Path,
    *,
    bootstrap: Bootstrap,
    items: int = 500,
) -> Path:
    """Write PersonalBench's report.html for the run in `out_dir`, browsing up to `items` pairs."""
    browse = browsable(out_dir, notes, items, bootstrap.seed)
    methods = sorted(
        {m for p in browse.pairs for a in p["attributes"] for m in a["relevance"]}, key=lambda m: (m != "llm", m)
    )
    model = next((dict(t.context).get("model") for t in tables if dict(t.context).get("model")), "")
    return render_page(
        Path(__file__).parent / "templates",
        "personalbench.html",
        path,
        out_dir=str(out_dir),
        model=model,
        bootstrap=bootstrap,
        annotators=notes.annotators(),
        tables=[table_view(t) for t in tables],
        figures=[figure_view(f) for f in figures],
        titles=FIGURE_TITLES,
        shown=len(browse.pairs),
        total=browse.total,
        pairs_json=script_json(browse.pairs),
        methods_json=script_json(methods),
    )
