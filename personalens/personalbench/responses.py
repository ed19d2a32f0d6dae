"""The response stages: generic and personalized responses to each prompt, then the pairwise judge."""

from __future__ import annotations

import random
from collections.abc import Callable

from personalens.engines.base import Engine, Request
from personalens.personalbench import formats
from personalens.personalbench.selection import kept_attributes, selected_attributes
from personalens.personalbench.stage import Settings, Shard, batched, messages, seeded
from personalens.personalbench.templates import Prompts


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
                    messages(p["prompt"], system),
                    seeded(settings.generation, settings.seed, p["user_id"], p["prompt_id"]),
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

    batched(todo, requests, load, "generate", settings.progress, write)


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
                    messages(text),
                    seeded(settings.judge, settings.seed, "judge", p["user_id"], p["prompt_id"]),
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

    batched(todo, requests, load, "judge", settings.progress, write)
