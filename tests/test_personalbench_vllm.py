"""PersonalBench end to end on the embedded model, in process on the shared engine: the bundled
WildChat-format sample through every stage, grammar-constrained outputs, the BM25 and embedding
baselines (the shared embedding model), resume, annotation sheets, and the metric report from the
model outputs plus the bundled example annotations."""

from __future__ import annotations

import csv
import re
import shutil
from collections import Counter

import pytest
from personalbench_helpers import REPO, config

from personalens.personalbench import command
from personalens.personalbench.formats import personalized_rating
from personalens.personalbench.relevance import Rule, cosine_scores, select
from personalens.personalbench.sheets import load_annotations, sheet_items
from personalens.store import read_table

pytestmark = pytest.mark.vllm

ANNOTATIONS = REPO / "data" / "personalbench" / "annotations"


class Counting:
    """The real engine, counting the requests it is sent."""

    def __init__(self, engine):
        self.engine, self.name, self.requests = engine, engine.name, 0

    def generate(self, requests, on_finished=None):
        self.requests += len(requests)
        return self.engine.generate(requests, on_finished)


def rows(out, table):
    found = read_table(out / "personalbench" / table)
    return [] if found is None else found.to_pylist()


@pytest.fixture(scope="module")
def bench(engine, embedder, tmp_path_factory):
    out = tmp_path_factory.mktemp("personalbench")
    cfg = config(
        "personalbench=quick",
        f"run.out_dir={out}",
        f"personalbench.annotations={ANNOTATIONS}",
        "personalbench.bootstrap=50",
        "personalbench.embedding.path=bundled",
    )
    spy = Counting(engine)
    assert command.run(cfg, lambda: {"assistant": spy, "judge": spy}, lambda: embedder) == 0
    return out, cfg, spy, engine


def test_every_stage_writes_one_row_per_item_with_parsed_grammar_outputs(bench):
    out, cfg, spy, _ = bench
    pairs, extractions = rows(out, "pairs"), rows(out, "extractions")
    users = {p["user_id"] for p in pairs}
    assert len(users) == 3 and Counter(p["user_id"] for p in pairs) == {u: 2 for u in users}
    assert {e["user_id"] for e in extractions} == users and all(e["parsed"] for e in extractions)
    kept = {e["user_id"]: [a for a in e["attributes"] if a["kept"]] for e in extractions}
    for e in extractions:
        assert 1 <= len(e["attributes"]) <= int(cfg.personalbench.extraction.max_attributes)
        assert all(a["category"] in cfg.personalbench.extraction.categories for a in e["attributes"])
    relevance = rows(out, "relevance")
    expected = {
        (p["user_id"], p["prompt_id"], a["attribute_id"], m)
        for p in pairs
        for a in kept[p["user_id"]]
        for m in ("llm", "bm25", "embedding")
    }
    assert Counter((r["user_id"], r["prompt_id"], r["attribute_id"], r["method"]) for r in relevance) == Counter(
        expected
    )
    for r in relevance:
        if r["method"] == "llm":
            assert r["parsed"] and re.fullmatch(r"Relevant: (yes|no)\nReason: [^\n]+", r["text"])
            assert r["selected"] == r["text"].startswith("Relevant: yes")
    responses = rows(out, "responses")
    assert Counter((r["user_id"], r["prompt_id"]) for r in responses) == {
        (p["user_id"], p["prompt_id"]): 2 for p in pairs
    }
    selected = {
        (r["user_id"], r["prompt_id"], r["attribute_id"]) for r in relevance if r["method"] == "llm" and r["selected"]
    }
    for r in responses:
        assert r["text"] and (r["variant"] == "personalized" or r["attribute_ids"] == [])
        assert all((r["user_id"], r["prompt_id"], a) in selected for a in r["attribute_ids"])
    preferences = rows(out, "preferences")
    assert len(preferences) == len(pairs)
    for p in preferences:
        assert p["parsed"] and re.match(r"Preference: [1-5]\nExplicit mention: (yes|no)\nReason: ", p["text"])
        assert p["rating"] == personalized_rating(p["score"], p["personalized_first"])
    assert spy.requests == len(extractions) + len(expected) // 3 + len(responses) + len(preferences)


def test_embedding_baseline_scores_the_sample_by_cosine_and_selects_by_the_rule(bench, embedder):
    out, cfg, _, _ = bench
    pairs = {(p["user_id"], p["prompt_id"]): p["prompt"] for p in rows(out, "pairs")}
    kept = {e["user_id"]: [a for a in e["attributes"] if a["kept"]] for e in rows(out, "extractions")}
    found = {
        (r["user_id"], r["prompt_id"], r["attribute_id"]): r
        for r in rows(out, "relevance")
        if r["method"] == "embedding"
    }
    e = cfg.personalbench.embedding
    rule = Rule(int(e.top_k), float(e.min_similarity))
    for (user, prompt_id), prompt in pairs.items():
        attrs = kept[user]
        got = [found[(user, prompt_id, a["attribute_id"])] for a in attrs]
        scores = [r["score"] for r in got]
        assert all(r["model"] == "all-MiniLM-L6-v2" and r["parsed"] for r in got)
        assert all(-1.0 <= s <= 1.0 for s in scores)
        # the scores are the cosines of the model's embeddings, embedded here one pair at a time
        vectors = embedder.embed([prompt, *(a["statement"] for a in attrs)])
        assert scores == pytest.approx(cosine_scores(vectors[0], vectors[1:]), abs=0.02)
        chosen = [r["selected"] for r in got]
        assert chosen == select(scores, rule) and sum(chosen) <= rule.top_k
        assert all(s > rule.above for s, c in zip(scores, chosen) if c)
    assert len(found) == sum(len(kept[u]) for u, _ in pairs)


def test_a_rerun_resumes_and_regenerates_only_what_is_missing(bench, embedder):
    out, cfg, _, engine = bench
    spy = Counting(engine)

    class NoEmbedding:
        name = embedder.name

        def embed(self, texts):
            raise AssertionError("every embedding row is written: nothing to embed")

    assert command.run(cfg, lambda: {"assistant": spy, "judge": spy}, lambda: NoEmbedding()) == 0
    assert spy.requests == 0
    before = {(p["user_id"], p["prompt_id"]): p["rating"] for p in rows(out, "preferences")}
    shutil.rmtree(out / "personalbench" / "preferences")  # as if killed before judging
    assert command.run(cfg, lambda: {"assistant": spy, "judge": spy}, lambda: NoEmbedding()) == 0
    assert spy.requests == len(before)
    # the same judgments again, once each; a rating itself may differ, as a temperature-0 reply can
    # when the engine's batch or prefix cache differs (docs/reproducibility.md)
    again = [((p["user_id"], p["prompt_id"]), p["rating"]) for p in rows(out, "preferences")]
    assert sorted(k for k, _ in again) == sorted(before)
    assert {r for _, r in again} - {None} <= {1, 2, 3, 4, 5}  # None: not parsed


def test_sheets_and_report_from_model_outputs_and_bundled_annotations(bench, capsys):
    out, cfg, _, _ = bench
    assert command.export(cfg) == 0
    sheets = out / "personalbench" / "sheets"
    items = sheet_items(out / "personalbench", int(cfg.seed))
    for stage, expected in items.items():
        with open(sheets / f"{stage}.csv", newline="") as f:
            assert [r["item_id"] for r in csv.DictReader(f)] == [i["item_id"] for i in expected]
        assert "<table>" in (sheets / f"{stage}.html").read_text()

    assert command.score(cfg) == 0
    report = out / "personalbench" / "report"
    assert {p.name for p in report.iterdir()} >= {
        "report.md",
        "extraction.csv",
        "relevance.tex",
        "preference.csv",
        "counts.csv",
        "selection.png",
        "report.html",
    }
    with open(report / "relevance.csv", newline="") as f:
        relevance = {(r["method"], r["metric"]): r for r in csv.DictReader(f)}
    for method in ("llm", "bm25", "embedding"):
        assert 0 <= float(relevance[(method, "F1")]["all_mean"]) <= 1
    assert "all-MiniLM-L6-v2" in (report / "report.html").read_text()
    notes = load_annotations(ANNOTATIONS)
    assert notes.annotators() == ["ann-a", "ann-b", "ann-c"]
    with open(report / "counts.csv", newline="") as f:
        counts = {(r["what"], r["detail"]): int(r["n"]) for r in csv.DictReader(f)}
    for stage in ("attributes", "relevance", "preference"):
        known = {i["item_id"] for i in items[stage]}
        unmatched = sum(i not in known for labels in notes.labels[stage].values() for i in labels)
        assert counts[("annotations not matching an item", stage)] == unmatched
    # pairs do not depend on model outputs: every bundled preference rating finds its item
    assert counts[("annotations not matching an item", "preference")] == 0
    assert counts[("input", "bad: empty conversation")] == 1 and counts[("input", "users kept")] == 3
    with open(report / "preference.csv", newline="") as f:
        cells = {r["metric"]: r for r in csv.DictReader(f)}
    assert 1 <= float(cells["human preference (1-5)"]["all_mean"]) <= 5
    assert int(cells["human preference (1-5)"]["all_n"]) == len(items["preference"])
    assert "PersonalBench relevance selection" in capsys.readouterr().out
