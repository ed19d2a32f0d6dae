"""`personalbench score`: run outputs plus filled annotation sheets -> metric tables (md / csv / tex)
broken down into emotionally sensitive contexts and the rest, through the report renderers."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from personalens.personalbench import metrics as M
from personalens.personalbench.formats import personalized_rating
from personalens.personalbench.sheets import Annotations, pair_id, relevance_id, rows
from personalens.tables import render
from personalens.tables.model import Cell, Column, Table
from personalens.tables.render import write_tables
from personalens.tables.stats import Bootstrap

SUBSETS = (("all", "all"), ("sensitive", "sensitive"), ("rest", "rest"))
COLUMNS = tuple(Column(key, "", label, 3, "estimate") for key, label in SUBSETS)


@dataclass(frozen=True)
class RunItems:
    """A run's model outputs keyed like the sheets' items, with each item's sensitive flag."""

    model: str
    attributes: dict[str, bool]  # attribute id -> sensitive
    evidence_ok: dict[str, bool]
    selections: dict[str, dict[str, bool]]  # method -> relevance item -> selected
    relevance_sensitive: dict[str, bool]
    judge: dict[str, int]  # pair -> judge rating of the personalized response (1-5)
    mentions: dict[str, bool]
    personalized_first: dict[str, bool]
    preference_sensitive: dict[str, bool]
    unparsed: dict[str, int]  # stage -> model outputs that did not parse


def run_items(out_dir: Path) -> RunItems:
    extractions = rows(out_dir, "extractions")
    attributes = [a for r in extractions for a in r["attributes"] if a["kept"]]
    selections: dict[str, dict[str, bool]] = {}
    sensitive, unparsed_relevance = {}, 0
    for r in rows(out_dir, "relevance"):
        item = relevance_id(r["user_id"], r["prompt_id"], r["attribute_id"])
        sensitive[item] = r["sensitive"]
        if r["parsed"]:
            selections.setdefault(r["method"], {})[item] = r["selected"]
        else:
            unparsed_relevance += 1
    prefs = rows(out_dir, "preferences")
    models = sorted({r["model"] for r in extractions})
    return RunItems(
        model=", ".join(models) or Path(out_dir).name,
        attributes={a["attribute_id"]: a["sensitive"] for a in attributes},
        evidence_ok={a["attribute_id"]: a["evidence_ok"] for r in extractions for a in r["attributes"]},
        selections=selections,
        relevance_sensitive=sensitive,
        judge={pair_id(r["user_id"], r["prompt_id"]): r["rating"] for r in prefs if r["parsed"]},
        mentions={pair_id(r["user_id"], r["prompt_id"]): r["explicit_mention"] for r in prefs if r["parsed"]},
        personalized_first={pair_id(r["user_id"], r["prompt_id"]): r["personalized_first"] for r in prefs},
        preference_sensitive={pair_id(r["user_id"], r["prompt_id"]): r["sensitive"] for r in prefs},
        unparsed={
            "extraction": sum(not r["parsed"] for r in extractions),
            "relevance": unparsed_relevance,
            "judging": sum(not r["parsed"] for r in prefs),
        },
    )


def _restrict(labels: Mapping, keep: Callable[[object], bool]) -> dict:
    return {k: v for k, v in labels.items() if keep(k)}


def _subset(flags: Mapping[str, bool], subset: str) -> Callable[[object], bool]:
    if subset == "all":
        return lambda item: item in flags
    wanted = subset == "sensitive"
    return lambda item: item in flags and flags[item] == wanted


@dataclass(frozen=True)
class Scores:
    tables: tuple[Table, ...]
    unmatched: dict[str, int]  # stage -> annotations naming no item of the run


def score(run: RunItems, notes: Annotations, boot: Bootstrap, others: Sequence[RunItems] = ()) -> Scores:
    """The metric tables of one run (`others`: more models' runs, for model-model kappa)."""
    known = {"attributes": run.attributes, "relevance": run.relevance_sensitive, "preference": run.personalized_first}
    unmatched = {
        stage: sum(item not in known[stage] for labels in notes.labels[stage].values() for item in labels)
        for stage in known
    }
    # human A/B scores as ratings of the personalized response, like the judge's
    humans_pref = {
        a: {
            i: personalized_rating(v, run.personalized_first[i])
            for i, v in labels.items()
            if i in run.personalized_first
        }
        for a, labels in notes.labels["preference"].items()
    }
    extraction, relevance, preference = {}, {}, {}
    for subset, _ in SUBSETS:
        keep = _subset(run.attributes, subset)
        extraction[subset] = M.extraction(
            {a: _restrict(l, keep) for a, l in notes.labels["attributes"].items()},
            [reason for item, reason in notes.reasons if keep(item)],
            [ok for item, ok in run.evidence_ok.items() if keep(item)],
            boot,
        )
        keep = _subset(run.relevance_sensitive, subset)
        relevance[subset] = M.relevance(
            {a: _restrict(l, keep) for a, l in notes.labels["relevance"].items()},
            {m: _restrict(s, keep) for m, s in run.selections.items()},
            boot,
            models={r.model: _restrict(r.selections.get("llm", {}), keep) for r in (run, *others)},
        )
        keep = _subset(run.preference_sensitive, subset)
        preference[subset] = M.preference(
            {a: _restrict(l, keep) for a, l in humans_pref.items()},
            _restrict(run.judge, keep),
            _restrict(run.mentions, keep),
            boot,
        )
    context = (("model", run.model),)
    note = "sensitive: emotionally sensitive contexts (moderation-flagged or toxic conversations, sensitive categories)"
    tables = (
        _table("extraction", "PersonalBench attribute extraction", ("metric",), extraction, context, note),
        _table(
            "relevance",
            "PersonalBench relevance selection vs the human majority",
            ("method", "metric"),
            relevance,
            context,
            note,
        ),
        _table("preference", "PersonalBench personalized vs generic responses", ("metric",), preference, context, note),
    )
    return Scores(tables, unmatched)


def _table(name: str, title: str, header: tuple[str, ...], by_subset: dict, context: tuple, note: str) -> Table:
    nested = header == ("method", "metric")
    layout = by_subset["all"]
    keys = [(m, k) for m, metrics in layout.items() for k in metrics] if nested else [(k,) for k in layout]

    def cell(subset: str, key: tuple) -> Cell:
        found = by_subset[subset]
        for part in key:
            found = found.get(part) if isinstance(found, dict) else None
        return found

    body = tuple((key, tuple(cell(s, key) for s, _ in SUBSETS)) for key in keys)
    return Table(name, title, header, COLUMNS, body, context=context, notes=(note,))


def counts_table(
    summary: Mapping[str, object], run: RunItems, notes: Annotations, unmatched: Mapping[str, int]
) -> Table:
    """What was read, dropped, not parsed, and annotations that matched nothing: nothing vanishes silently."""
    entries = [(("input", k), v) for k, v in summary.items()]
    entries += [(("unparsed model outputs", k), v) for k, v in run.unparsed.items()]
    entries += [(("annotations", "annotators"), len(notes.annotators())), (("annotations", "blank rows"), notes.blank)]
    entries += [(("annotations not matching an item", k), v) for k, v in unmatched.items()]
    return Table(
        "counts",
        "PersonalBench counts",
        ("what", "detail"),
        (Column("n", "", "n", holds="count"),),
        tuple((labels, (int(v),)) for labels, v in entries),
        context=(("model", run.model),),
    )


def input_summary(out_dir: Path) -> dict[str, int]:
    """Records read and dropped, summed over the shards' input files."""
    total: dict[str, int] = {}
    for path in sorted((Path(out_dir) / "input").glob("shard-*.json")):
        data = json.loads(path.read_text())
        for key, value in [
            ("records", data["input"]["rows"]),
            ("conversations", data["input"]["conversations"]),
            *((f"bad: {k}", v) for k, v in data["input"]["bad"].items()),
            ("users", data["histories"]["users"]),
            ("users kept", data["histories"]["this_shard"]),
            *((f"users dropped: {k}", v) for k, v in data["histories"]["dropped"].items()),
        ]:
            total[key] = total.get(key, 0) + value
    shards = len(list((Path(out_dir) / "input").glob("shard-*.json")))
    # every shard reads every record and drops the same users; only its kept users are its own
    return {k: (v if k == "users kept" else v // max(shards, 1)) for k, v in total.items()}


def selection_figure(relevance: Table, path: Path) -> Path:
    """Selection rate of the humans and of each method, all / sensitive / rest, with 95% intervals:
    over-retrieval at a glance."""
    from personalens.tables.figures import cell_value, new_figure, save_png

    bars = [
        (labels[0], cells)
        for labels, cells in relevance.rows
        if labels[1] in ("selection rate", "human selection rate")
    ]
    fig = new_figure(figsize=(6, 3.2), layout="constrained")
    ax = fig.add_subplot()
    width = 0.8 / max(len(bars), 1)
    for k, (method, cells) in enumerate(bars):
        xs = [i + (k - (len(bars) - 1) / 2) * width for i in range(len(SUBSETS))]
        means = [cell_value(c) for c in cells]
        errors = [
            [max(c.mean - c.lo, 0) if c else 0 for c in cells],
            [max(c.hi - c.mean, 0) if c else 0 for c in cells],
        ]
        ax.bar(xs, means, width, yerr=errors, capsize=3, label=method)
    ax.set_xticks(range(len(SUBSETS)), [label for _, label in SUBSETS])
    ax.set_ylim(0, 1)
    ax.set_ylabel("share of attributes selected")
    ax.set_title(f"Relevance selection ({dict(relevance.context).get('model', '')})", fontsize=9)
    ax.legend(fontsize=8)
    return save_png(fig, path)


def write(tables: Sequence[Table], out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    written = [selection_figure(t, out_dir / "selection.png") for t in tables if t.name == "relevance"]
    for table in tables:
        written += write_tables([table], out_dir, formats=("csv", "tex"))
    report = out_dir / "report.md"
    report.write_text("# PersonalBench report\n\n" + render.markdown(tables), encoding="utf-8")
    return [*written, report]
