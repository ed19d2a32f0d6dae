"""The model stages of PersonalBench over the users of one shard: pairs, extraction, relevance,
generation and judging. Each stage plans what its table lacks, sends it to the engine in large
batched calls across users, and writes the results as Parquet part files, so a killed run resumes
where it stopped."""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from pathlib import Path

from personalens import console
from personalens.data import files
from personalens.data.sharding import assign_shards
from personalens.engines.base import Embedder, Engine, Request
from personalens.errors import PersonalensError
from personalens.personalbench import formats
from personalens.personalbench.extraction import review, sensitive_conversation, shown_turns
from personalens.personalbench.histories import History, group, histories
from personalens.personalbench.responses import generate, judge
from personalens.personalbench.selection import select
from personalens.personalbench.stage import STAGES, UNTIL, Settings, Shard, batched, messages, seeded
from personalens.personalbench.templates import Prompts
from personalens.personalbench.wildchat import ReadStats, read_conversations, shard_paths


def load_histories(settings: Settings, shard: Shard) -> tuple[list[History], ReadStats, dict]:
    """This shard's users; users are spread over shards by their conversation counts."""
    stats = ReadStats()
    users = group(read_conversations(shard_paths(settings.input), stats, settings.batch_size))
    kept, dropped = histories(users, settings.filters)
    assignment = assign_shards({i: len(h.conversations) for i, h in enumerate(kept)}, shard.count)
    mine = [h for i, h in enumerate(kept) if assignment[i] == shard.index]
    return mine, stats, {"users": len(users), "kept": len(kept), "dropped": dict(dropped), "this_shard": len(mine)}


def load_prompts(path: str) -> list[dict]:
    """The bundled prompt file: JSON lines with prompt_id (a string or an integer), text (a string)
    and an optional sensitive flag (true or false); at least one, no prompt_id twice."""
    prompts = []
    lines: dict[str, int] = {}
    text, warnings = files.read_text(Path(path), path)  # a DataError names the file (bad UTF-8, not a file, ...)
    for n, line in files.json_lines(text):
        item, more = files.loads(line, path, n)
        warnings += more
        problem = _prompt_problem(item)
        if problem:
            raise PersonalensError(f"{path} line {n}: {problem}")
        prompt_id = str(item["prompt_id"])
        if prompt_id in lines:
            raise PersonalensError(f"{path} line {n}: prompt_id {prompt_id!r} is also on line {lines[prompt_id]}")
        lines[prompt_id] = n
        prompts.append({"prompt_id": prompt_id, "prompt": item["text"], "sensitive": item.get("sensitive", False)})
    if not prompts:
        raise PersonalensError(f"{path}: no prompts (expected JSON lines with prompt_id and text)")
    for warning in warnings:
        print(f"warning: {warning}", file=console.err())
    return prompts


def _prompt_problem(item: object) -> str | None:
    expected = "expected a JSON object with prompt_id (a string or an integer), text (a string) and an optional"
    expected += " sensitive (true or false)"
    if not isinstance(item, dict):
        return f"{expected}, not {type(item).__name__}"
    for key in ("prompt_id", "text"):
        if key not in item:
            return f"{expected}: no {key}"
    if isinstance(item["prompt_id"], bool) or not isinstance(item["prompt_id"], (str, int)) or item["prompt_id"] == "":
        return f"{expected}: prompt_id is {json.dumps(item['prompt_id'])[:80]}"
    if not isinstance(item["text"], str) or not item["text"].strip():
        return f"{expected}: text is {json.dumps(item['text'])[:80]}"
    if not isinstance(item.get("sensitive", False), bool):
        return f"{expected}: sensitive is {json.dumps(item['sensitive'])[:80]}"
    return None


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
    `until="read"` reads the shards and the prompts file, writes the counts and the (user, prompt)
    pairs, and stops before any model is loaded. `embedder` loads the embedding model of the
    embedding baseline (settings.embedding)."""
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
    if until == "read":
        print(
            f"personalbench: until=read: {len(users)} users, {len(bundled)} prompts read; no model stage run",
            file=console.err(),
        )
    for name in STAGES[: UNTIL.index(until)]:  # UNTIL is ("read", *STAGES)
        stages[name]()
    return summary


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
            out.append(Request(messages(text), seeded(settings.extraction, settings.seed, h.user_id), grammar))
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

    batched(todo, requests, load, "extract", settings.progress, write)
