"""The model stages of PersonalBench over the users of one shard: pairs, extraction, relevance,
generation and judging. Each stage plans what its table lacks, sends it to the engine in large
batched calls across users, and writes the results as Parquet part files, so a killed run resumes
where it stopped."""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from personalens import console
from personalens.data.sharding import assign_shards
from personalens.engines.base import Embedder, Engine, Request, Sampling
from personalens.engines.progress import generate_with_progress
from personalens.errors import PersonalensError
from personalens.personalbench import formats
from personalens.personalbench.extraction import Rules, review, sensitive_conversation, shown_turns
from personalens.personalbench.histories import Filters, History, group, histories
from personalens.personalbench.relevance import Rule, bm25_scores, cosine_scores
from personalens.personalbench.relevance import select as chosen_by
from personalens.personalbench.schema import TABLES
from personalens.personalbench.templates import Prompts
from personalens.personalbench.wildchat import ReadStats, read_conversations, shard_paths
from personalens.progress import Progress
from personalens.store import PartWriter, existing_values, read_table, shard_dir

STAGES = ("extract", "relevance", "generate", "judge")  # the model stages, in order
CHUNK = 512  # requests per generate call: large batches, yet results reach disk steadily


@dataclass(frozen=True)
class Settings:
    input: tuple[str, ...]
    prompts_file: str
    prompts_per_user: int  # bundled prompts paired with each user (a seeded sample); 0 = all
    filters: Filters
    rules: Rules
    bm25: Rule  # the BM25 baseline: top k with a positive score
    extraction: Sampling
    relevance: Sampling
    generation: Sampling
    judge: Sampling
    seed: int
    batch_size: int = 1024  # Parquet rows per read
    progress: bool = True
    # personalized responses from these (user, prompt, attribute) triples, the human-majority
    # relevant ones, instead of the model's selection: isolates generation from selection
    human_selection: frozenset[tuple[str, str, str]] | None = None
    embedding: Rule | None = None  # the embedding-similarity baseline, where an embedding model is configured


@dataclass(frozen=True)
class Shard:
    out_dir: Path
    index: int = 0
    count: int = 1

    def folder(self, table: str) -> Path:
        return shard_dir(self.out_dir, table, self.index, self.count)

    def writer(self, table: str) -> PartWriter:
        return PartWriter(self.folder(table), TABLES[table][0])

    def done(self, table: str) -> set[tuple]:
        return existing_values(self.folder(table), TABLES[table][1])

    def rows(self, table: str) -> list[dict]:
        found = read_table(self.folder(table))
        return [] if found is None else found.to_pylist()


def load_histories(settings: Settings, shard: Shard) -> tuple[list[History], ReadStats, dict]:
    """This shard's users; users are spread over shards by their conversation counts."""
    stats = ReadStats()
    users = group(read_conversations(shard_paths(settings.input), stats, settings.batch_size))
    kept, dropped = histories(users, settings.filters)
    assignment = assign_shards({i: len(h.conversations) for i, h in enumerate(kept)}, shard.count)
    mine = [h for i, h in enumerate(kept) if assignment[i] == shard.index]
    return mine, stats, {"users": len(users), "kept": len(kept), "dropped": dict(dropped), "this_shard": len(mine)}


def load_prompts(path: str) -> list[dict]:
    """The bundled prompt file: JSON lines with prompt_id, text and an optional sensitive flag."""
    prompts = []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as err:
        raise PersonalensError(f"personalbench.prompts_file: cannot read {path}: {err}") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
            prompts.append(
                {
                    "prompt_id": str(item["prompt_id"]),
                    "prompt": str(item["text"]),
                    "sensitive": bool(item.get("sensitive", False)),
                }
            )
        except (ValueError, KeyError, TypeError) as err:
            raise PersonalensError(f"{path} line {n}: expected a JSON object with prompt_id and text ({err})") from None
    return prompts


def pair_rows(history: History, prompts: Sequence[dict], settings: Settings) -> list[dict]:
    chosen = list(prompts)
    if 0 < settings.prompts_per_user < len(chosen):
        chosen = random.Random(f"{settings.seed}/{history.user_id}").sample(chosen, settings.prompts_per_user)
    for c in history.held_out:  # the user's own later prompt, when conversations are held out
        chosen.append(
            {
                "prompt_id": f"heldout-{c.user_turns[0].turn_identifier}",
                "prompt": c.user_turns[0].content,
                "sensitive": sensitive_conversation(c, settings.rules.sensitive_moderation),
            }
        )
    stats = {"conversations": len(history.conversations), "user_turns": len(history.user_turns)}
    return [{"user_id": history.user_id, **p, **stats} for p in sorted(chosen, key=lambda p: p["prompt_id"])]


def run(
    settings: Settings,
    prompts: Prompts,
    shard: Shard,
    engines: Callable[[], dict[str, Engine]],
    until: str = "judge",
    embedder: Callable[[], Embedder] | None = None,
) -> dict:
    """The stages for this shard up to `until`; returns the input and filter counts (also saved as JSON).
    `embedder` loads the embedding model of the embedding baseline (settings.embedding)."""
    users, stats, counts = load_histories(settings, shard)
    print(stats.format(), file=console.err())
    print(f"histories: {counts}", file=console.err())
    summary = {"input": stats.as_dict(), "histories": counts}
    path = shard.out_dir / "input" / f"shard-{shard.index:03d}-of-{shard.count:03d}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary, indent=2))

    done = shard.done("pairs")
    bundled = load_prompts(settings.prompts_file)
    shard.writer("pairs").write(
        [r for h in users for r in pair_rows(h, bundled, settings) if (r["user_id"], r["prompt_id"]) not in done]
    )
    stages = {
        "extract": lambda: extract(users, settings, prompts, shard, lambda: engines()["assistant"]),
        "relevance": lambda: select(settings, prompts, shard, lambda: engines()["assistant"], embedder),
        "generate": lambda: generate(settings, prompts, shard, lambda: engines()["assistant"]),
        "judge": lambda: judge(settings, prompts, shard, lambda: engines()["judge"]),
    }
    for name in STAGES[: STAGES.index(until) + 1]:
        stages[name]()
    return summary


def _batched(
    items: list,
    requests: Callable[[list], list[Request]],
    load: Callable[[], Engine],
    label: str,
    progress: bool,
    write: Callable[[list, list, Engine], None],
) -> None:
    if not items:
        return
    engine = load()
    bar = Progress(total=len(items), label=label, unit="request", enabled=progress)
    for start in range(0, len(items), CHUNK):
        chunk = items[start : start + CHUNK]
        generations = generate_with_progress(engine, requests(chunk), bar, remaining=len(items) - start)
        write(chunk, generations, engine)
    bar.close()


def _messages(text: str, system: str | None = None) -> list[dict]:
    return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]


def _seeded(sampling: Sampling, seed: int, *key: object) -> Sampling:
    return Sampling(
        sampling.temperature,
        sampling.max_tokens,
        sampling.top_p,
        seed=random.Random("/".join(map(str, (seed, *key)))).randrange(2**31),
        min_tokens=sampling.min_tokens,
    )


def extract(
    users: Sequence[History], settings: Settings, prompts: Prompts, shard: Shard, load: Callable[[], Engine]
) -> None:
    rules, done = settings.rules, shard.done("extractions")
    todo = [h for h in users if (h.user_id,) not in done]
    writer = shard.writer("extractions")

    def requests(chunk: list[History]) -> list[Request]:
        out = []
        for h in chunk:
            turns = shown_turns(h, rules.max_history_chars)
            text = prompts.render(
                "extract.txt", turns=turns, max_attributes=rules.max_attributes, categories=rules.categories
            )
            grammar = formats.extraction_grammar([t["id"] for t in turns], rules.categories, rules.max_attributes)
            out.append(Request(_messages(text), _seeded(settings.extraction, settings.seed, h.user_id), grammar))
        return out

    def write(chunk: list[History], generations: list, engine: Engine) -> None:
        rows = []
        for h, g in zip(chunk, generations):
            attributes = formats.parse_extraction(g.text)
            rows.append(
                {
                    "user_id": h.user_id,
                    "model": engine.name,
                    "text": g.text,
                    "parsed": attributes is not None,
                    "attributes": review(h, attributes or [], rules),
                    "completion_tokens": g.completion_tokens,
                }
            )
        writer.write(rows)

    _batched(todo, requests, load, "extract", settings.progress, write)


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
                _messages(prompts.render("relevance.txt", prompt=p["prompt"], attribute=a["statement"])),
                _seeded(settings.relevance, settings.seed, p["user_id"], p["prompt_id"], a["attribute_id"]),
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

    _batched(todo, requests, load, "relevance", settings.progress, write)


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


def generate(settings: Settings, prompts: Prompts, shard: Shard, load: Callable[[], Engine]) -> None:
    selected, done = selected_attributes(shard, settings.human_selection), shard.done("responses")
    users = kept_attributes(shard)
    pairs = [p for p in shard.rows("pairs") if p["user_id"] in users]
    todo = [(p, v) for p in pairs for v in ("generic", "personalized") if (p["user_id"], p["prompt_id"], v) not in done]
    writer = shard.writer("responses")

    def attrs(p: dict, variant: str) -> list[dict]:
        return selected[(p["user_id"], p["prompt_id"])] if variant == "personalized" else []

    def requests(chunk: list) -> list[Request]:
        out = []
        for p, v in chunk:
            system = (
                prompts.render("generic.txt")
                if v == "generic"
                else prompts.render("personalized.txt", attributes=[a["statement"] for a in attrs(p, v)])
            )
            # both variants of a pair share a seed: they differ only by what is known about the user
            out.append(
                Request(
                    _messages(p["prompt"], system),
                    _seeded(settings.generation, settings.seed, p["user_id"], p["prompt_id"]),
                    formats.RESPONSE_GRAMMAR,
                )
            )
        return out

    def write(chunk: list, generations: list, engine: Engine) -> None:
        writer.write(
            [
                {
                    "user_id": p["user_id"],
                    "prompt_id": p["prompt_id"],
                    "variant": v,
                    "attribute_ids": [a["attribute_id"] for a in attrs(p, v)],
                    "model": engine.name,
                    "text": g.text,
                    "completion_tokens": g.completion_tokens,
                }
                for (p, v), g in zip(chunk, generations)
            ]
        )

    _batched(todo, requests, load, "generate", settings.progress, write)


def personalized_first(seed: int, user_id: str, prompt_id: str) -> bool:
    """The side the personalized response is shown on, to the judge and to annotators alike."""
    return random.Random(f"{seed}/order/{user_id}/{prompt_id}").random() < 0.5


def judge(settings: Settings, prompts: Prompts, shard: Shard, load: Callable[[], Engine]) -> None:
    responses = {(r["user_id"], r["prompt_id"], r["variant"]): r for r in shard.rows("responses")}
    attributes, done = kept_attributes(shard), shard.done("preferences")
    selected = selected_attributes(shard, settings.human_selection)
    todo = [
        p
        for p in shard.rows("pairs")
        if (p["user_id"], p["prompt_id"]) not in done
        and all((p["user_id"], p["prompt_id"], v) in responses for v in ("generic", "personalized"))
    ]
    writer = shard.writer("preferences")

    def sides(p: dict) -> tuple[str, str]:
        gen, per = (responses[(p["user_id"], p["prompt_id"], v)]["text"] for v in ("generic", "personalized"))
        return (per, gen) if personalized_first(settings.seed, p["user_id"], p["prompt_id"]) else (gen, per)

    def requests(chunk: list) -> list[Request]:
        out = []
        for p in chunk:
            a, b = sides(p)
            text = prompts.render(
                "judge.txt",
                prompt=p["prompt"],
                response_a=a,
                response_b=b,
                attributes=[x["statement"] for x in attributes.get(p["user_id"], [])],
            )
            out.append(
                Request(
                    _messages(text),
                    _seeded(settings.judge, settings.seed, "judge", p["user_id"], p["prompt_id"]),
                    formats.PREFERENCE_GRAMMAR,
                )
            )
        return out

    def write(chunk: list, generations: list, engine: Engine) -> None:
        rows = []
        for p, g in zip(chunk, generations):
            first = personalized_first(settings.seed, p["user_id"], p["prompt_id"])
            verdict = formats.parse_preference(g.text)
            used = selected.get((p["user_id"], p["prompt_id"]), [])
            rows.append(
                {
                    "user_id": p["user_id"],
                    "prompt_id": p["prompt_id"],
                    "personalized_first": first,
                    "score": verdict and verdict.score,
                    "rating": verdict and formats.personalized_rating(verdict.score, first),
                    "explicit_mention": verdict and verdict.explicit_mention,
                    "parsed": verdict is not None,
                    "text": g.text,
                    "judge_model": engine.name,
                    "sensitive": p["sensitive"] or any(a["sensitive"] for a in used),
                }
            )
        writer.write(rows)

    _batched(todo, requests, load, "judge", settings.progress, write)
