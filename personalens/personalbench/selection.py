"""The relevance stage: which of a user's attributes matter for a prompt, chosen by the model, by BM25
and by embedding similarity (the baselines)."""

from __future__ import annotations

from collections.abc import Callable

from personalens.engines.base import Embedder, Engine, Request
from personalens.errors import PersonalensError
from personalens.personalbench import formats
from personalens.personalbench.relevance import Rule, bm25_scores, cosine_scores
from personalens.personalbench.relevance import select as chosen_by
from personalens.personalbench.stage import Settings, Shard, batched, messages, seeded
from personalens.personalbench.templates import Prompts


def kept_attributes(shard: Shard) -> dict[str, list[dict]]:
    return {r["user_id"]: [a for a in r["attributes"] if a["kept"]] for r in shard.rows("extractions")}


def select(
    settings: Settings,
    prompts: Prompts,
    shard: Shard,
    load: Callable[[], Engine],
    embedder: Callable[[], Embedder] | None = None,
) -> None:
    attributes, done = kept_attributes(shard), shard.done("relevance")
    pairs = [p for p in shard.rows("pairs") if p["user_id"] in attributes]
    writer = shard.writer("relevance")
    writer.write(
        [
            r
            for p in pairs
            for r in baseline_rows(
                "bm25",
                "bm25",
                p,
                attributes[p["user_id"]],
                bm25_scores(p["prompt"], [a["statement"] for a in attributes[p["user_id"]]]),
                settings.bm25,
                done,
            )
        ]
    )
    if settings.embedding is not None:
        if embedder is None:
            raise PersonalensError(
                "personalbench: the embedding baseline is configured but no embedding model is given"
            )
        writer.write(embedding_rows(pairs, attributes, settings.embedding, embedder, done))
    todo = [
        (p, a)
        for p in pairs
        for a in attributes[p["user_id"]]
        if (p["user_id"], p["prompt_id"], a["attribute_id"], "llm") not in done
    ]

    def requests(chunk: list) -> list[Request]:
        return [
            Request(
                messages(prompts.render("relevance.txt", prompt=p["prompt"], attribute=a["statement"])),
                seeded(settings.relevance, settings.seed, p["user_id"], p["prompt_id"], a["attribute_id"]),
                formats.RELEVANCE_GRAMMAR,
            )
            for p, a in chunk
        ]

    def write(chunk: list, generations: list, engine: Engine) -> None:
        rows = []
        for (p, a), g in zip(chunk, generations):
            verdict = formats.parse_relevance(g.text)
            rows.append(
                {
                    "user_id": p["user_id"],
                    "prompt_id": p["prompt_id"],
                    "attribute_id": a["attribute_id"],
                    "method": "llm",
                    "model": engine.name,
                    "selected": verdict,
                    "score": None,
                    "parsed": verdict is not None,
                    "text": g.text,
                    "sensitive": a["sensitive"] or p["sensitive"],
                }
            )
        writer.write(rows)

    batched(todo, requests, load, "relevance", settings.progress, write)


def baseline_rows(
    method: str, model: str, pair: dict, attributes: list[dict], scores: list[float], rule: Rule, done: set[tuple]
) -> list[dict]:
    """A baseline's rows for one pair: each attribute's score and whether `rule` selects it."""
    return [
        {
            "user_id": pair["user_id"],
            "prompt_id": pair["prompt_id"],
            "attribute_id": a["attribute_id"],
            "method": method,
            "model": model,
            "selected": chosen,
            "score": score,
            "parsed": True,
            "text": "",
            "sensitive": a["sensitive"] or pair["sensitive"],
        }
        for a, score, chosen in zip(attributes, scores, chosen_by(scores, rule))
        if (pair["user_id"], pair["prompt_id"], a["attribute_id"], method) not in done
    ]


def embedding_rows(
    pairs: list[dict], attributes: dict[str, list[dict]], rule: Rule, load: Callable[[], Embedder], done: set[tuple]
) -> list[dict]:
    """The embedding baseline's rows of the pairs that lack some: every distinct prompt and statement
    embedded in one call, scored by cosine similarity."""
    pairs = [
        p
        for p in pairs
        if any(
            (p["user_id"], p["prompt_id"], a["attribute_id"], "embedding") not in done for a in attributes[p["user_id"]]
        )
    ]
    if not pairs:
        return []
    embedder = load()
    texts = list(
        dict.fromkeys([p["prompt"] for p in pairs] + [a["statement"] for p in pairs for a in attributes[p["user_id"]]])
    )
    vectors = dict(zip(texts, embedder.embed(texts)))
    return [
        r
        for p in pairs
        for r in baseline_rows(
            "embedding",
            embedder.name,
            p,
            attributes[p["user_id"]],
            cosine_scores(vectors[p["prompt"]], [vectors[a["statement"]] for a in attributes[p["user_id"]]]),
            rule,
            done,
        )
    ]


def selected_attributes(
    shard: Shard, human: frozenset[tuple[str, str, str]] | None = None
) -> dict[tuple[str, str], list[dict]]:
    """(user, prompt) -> the kept attributes the model (or, given `human`, the human majority)
    marked relevant, in attribute order."""
    chosen = (
        human
        if human is not None
        else {
            (r["user_id"], r["prompt_id"], r["attribute_id"])
            for r in shard.rows("relevance")
            if r["method"] == "llm" and r["selected"]
        }
    )
    kept = kept_attributes(shard)
    return {
        (p["user_id"], p["prompt_id"]): [
            a for a in kept.get(p["user_id"], []) if (p["user_id"], p["prompt_id"], a["attribute_id"]) in chosen
        ]
        for p in shard.rows("pairs")
    }
