"""Write data/personalbench/wildchat-sample: a few invented users in WildChat's released format.

The Parquet shards have the nested schema of WildChat-1M / WildChat-4.8M (`data/train-*.parquet`):
one row per conversation, the user known only by (hashed_ip, user-agent, accept-language). Users,
conversations, hashes and moderation scores were all written for this project. Besides users that
pass the default filters it holds a scripted bulk user, a one-conversation user, a Spanish-speaking
user, toxic / flagged conversations, and bad records (an empty conversation, missing fields, a
second shard whose columns drifted to other types). Rerun `python data/personalbench/make_sample.py`
after editing this script; the shards are committed.
"""

from __future__ import annotations

import hashlib
import shutil
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent / "wildchat-sample" / "data"
CATEGORIES = [
    "harassment",
    "harassment/threatening",
    "hate",
    "hate/threatening",
    "self-harm",
    "self-harm/instructions",
    "self-harm/intent",
    "sexual",
    "sexual/minors",
    "violence",
    "violence/graphic",
]
DETOXIFY = ["identity_attack", "insult", "obscene", "severe_toxicity", "sexual_explicit", "threat", "toxicity"]

HEADER = pa.struct([("accept-language", pa.string()), ("user-agent", pa.string())])
MESSAGE = pa.struct(
    [
        ("content", pa.string()),
        ("country", pa.string()),
        ("hashed_ip", pa.string()),
        ("header", HEADER),
        ("language", pa.string()),
        ("redacted", pa.bool_()),
        ("role", pa.string()),
        ("state", pa.string()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
        ("toxic", pa.bool_()),
        ("turn_identifier", pa.int64()),
    ]
)
MODERATION = pa.struct(
    [
        ("categories", pa.struct([(c, pa.bool_()) for c in CATEGORIES])),
        ("category_scores", pa.struct([(c, pa.float64()) for c in CATEGORIES])),
        ("flagged", pa.bool_()),
    ]
)
SCHEMA = pa.schema(
    [
        ("conversation_hash", pa.string()),
        ("model", pa.string()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
        ("conversation", pa.list_(MESSAGE)),
        ("turn", pa.int64()),
        ("language", pa.string()),
        ("openai_moderation", pa.list_(MODERATION)),
        ("detoxify_moderation", pa.list_(pa.struct([(c, pa.float64()) for c in DETOXIFY]))),
        ("toxic", pa.bool_()),
        ("redacted", pa.bool_()),
        ("state", pa.string()),
        ("country", pa.string()),
        ("hashed_ip", pa.string()),
        ("header", HEADER),
    ]
)

# (name, ip seed, user-agent, accept-language, state, country, language, conversations); a
# conversation is a list of (user turn, assistant reply) plus optional moderation flags.
USERS = [
    (
        "maya",
        "Mozilla/5.0 (Macintosh; Intel Mac OS X 13_4) Firefox/118.0",
        "en-US,en;q=0.9",
        "Oregon",
        "United States",
        "English",
        [
            [
                (
                    "I teach high-school chemistry in Portland and need a fun demo about reaction rates for 10th graders.",
                    "Try the elephant toothpaste demo with different catalyst amounts...",
                ),
                (
                    "My students are mostly beginners, so keep the safety notes simple.",
                    "Here is a short safety checklist...",
                ),
            ],
            [
                (
                    "Give me a vegetarian meal plan for marathon training, I run about 50 miles a week.",
                    "Here is a 7-day vegetarian plan with enough protein...",
                ),
                ("I don't eat eggs either, please swap those out.", "Updated plan without eggs..."),
            ],
            [
                (
                    "My dog Pepper is a 3-year-old border collie who gets anxious during fireworks. Any tips?",
                    "Create a safe den, use white noise...",
                )
            ],
            [("Draft an email to parents about our chemistry field trip next Friday.", "Dear parents, ...")],
        ],
        (),
    ),
    (
        "tomas",
        "Mozilla/5.0 (X11; Linux x86_64) Chrome/119.0 Safari/537.36",
        "en-GB,en;q=0.8,de;q=0.6",
        "Madrid",
        "Spain",
        "English",
        [
            [
                (
                    "I'm a backend developer moving to Berlin in March, how do I register my address there?",
                    "You need an Anmeldung appointment at the Bürgeramt...",
                ),
                (
                    "I only speak basic German so far, is the form available in English?",
                    "The form is German-only, but here is a translation...",
                ),
            ],
            [
                (
                    "I have type 1 diabetes. What snacks are easy to carry on long train rides?",
                    "Nuts, cheese sticks, glucose tabs for lows...",
                )
            ],
            [
                (
                    "Lately I feel hopeless about the move and can't sleep. I don't know who to talk to.",
                    "I'm sorry you're feeling this way. Talking to someone you trust or a counselor can help...",
                )
            ],
            [
                (
                    "Explain Python asyncio task groups with an example, I use Python 3.12 at work.",
                    "asyncio.TaskGroup lets you start several tasks...",
                )
            ],
        ],
        (2,),
    ),  # the third conversation is flagged (self-harm, low-risk wording)
    (
        "priya",
        "Mozilla/5.0 (Windows NT 10.0; Win64; x64) Edg/118.0",
        "en-IN,en;q=0.9",
        "Karnataka",
        "India",
        "English",
        [
            [
                (
                    "I run a small bakery in Bengaluru that sells gluten-free cakes. Write an Instagram caption for our new mango cake.",
                    "Sunshine in every slice! ...",
                )
            ],
            [
                (
                    "My two kids are 6 and 9 and fight over screen time. How can I set fair rules?",
                    "Try a shared schedule they help make...",
                )
            ],
            [
                (
                    "A customer left a nasty review calling my staff idiots. I want to tell him to get lost.",
                    "It's understandable to be upset; a calm, professional reply works better...",
                )
            ],
            [
                (
                    "What oven temperature works best for gluten-free sponge cakes with rice flour?",
                    "Around 170 C (340 F), slightly lower than wheat sponges...",
                )
            ],
        ],
        (2,),
    ),  # the third conversation is toxic (harassment)
    (
        "bulkbot",
        "python-requests/2.31.0",
        "",
        "",
        "United States",
        "English",
        [
            [(f"Write a 500 word SEO article about the keyword best {item} 2023 with headings.", "# Best ...")]
            for item in ("vacuum cleaner", "air fryer", "robot vacuum", "vacuum cleaners", "air fryers")
        ],
        (),
    ),
    (
        "once",
        "Mozilla/5.0 (iPhone; CPU iPhone OS 16_6) Safari/604.1",
        "en-AU,en;q=0.9",
        "Victoria",
        "Australia",
        "English",
        [
            [("What's a good beginner surfboard size for someone 180 cm tall?", "A 8-9 foot soft-top...")],
        ],
        (),
    ),
    (
        "lucia",
        "Mozilla/5.0 (Linux; Android 13) Chrome/118.0 Mobile",
        "es-ES,es;q=0.9",
        "Andalusia",
        "Spain",
        "Spanish",
        [
            [("Necesito una receta de gazpacho para diez personas.", "Ingredientes: ...")],
            [("¿Cómo preparo una entrevista de trabajo como enfermera?", "Prepara ejemplos concretos...")],
        ],
        (),
    ),
]

START = datetime(2023, 5, 1, 9, 0, tzinfo=timezone.utc)


def _hash(*parts: object) -> str:
    return hashlib.sha256("|".join(map(str, parts)).encode()).hexdigest()


def _moderation(flagged_category: str | None) -> dict:
    scores = {c: 0.0004 for c in CATEGORIES}
    cats = {c: False for c in CATEGORIES}
    if flagged_category:
        scores[flagged_category], cats[flagged_category] = 0.81, True
    return {"categories": cats, "category_scores": scores, "flagged": flagged_category is not None}


def _detoxify(toxic: bool) -> dict:
    return {c: (0.72 if toxic and c in ("insult", "toxicity") else 0.001) for c in DETOXIFY}


def conversation_row(user_index: int, user: tuple, conv_index: int, turns: list, flag: str | None) -> dict:
    name, agent, lang_header, state, country, language, _, _ = user
    ip = _hash("ip", name)
    header = {"accept-language": lang_header, "user-agent": agent}
    when = START + timedelta(days=7 * conv_index + user_index, hours=user_index)
    toxic = flag == "harassment"
    messages, moderation = [], []
    for k, (question, answer) in enumerate(turns):
        turn_id = int(_hash("turn", name, conv_index, k)[:12], 16) % 10**9
        at = when + timedelta(minutes=3 * k)
        common = {"language": language, "redacted": False, "turn_identifier": turn_id, "timestamp": at}
        messages.append(
            {
                "content": question,
                "role": "user",
                "hashed_ip": ip,
                "header": header,
                "state": state,
                "country": country,
                "toxic": toxic,
                **common,
            }
        )
        messages.append(
            {
                "content": answer,
                "role": "assistant",
                "hashed_ip": None,
                "header": None,
                "state": None,
                "country": None,
                "toxic": False,
                **common,
            }
        )
        moderation += [_moderation(flag), _moderation(None)]
    return {
        "conversation_hash": _hash("conv", name, conv_index)[:32],
        "model": "gpt-3.5-turbo-0613",
        "timestamp": when,
        "conversation": messages,
        "turn": len(turns),
        "language": language,
        "openai_moderation": moderation,
        "detoxify_moderation": [_detoxify(toxic) for _ in messages],
        "toxic": toxic,
        "redacted": False,
        "state": state,
        "country": country,
        "hashed_ip": ip,
        "header": header,
    }


def good_rows() -> list[dict]:
    rows = []
    for u, user in enumerate(USERS):
        flagged = user[7]
        for c, turns in enumerate(user[6]):
            flag = None
            if c in flagged:
                flag = "self-harm" if user[0] == "tomas" else "harassment"
            rows.append(conversation_row(u, user, c, turns, flag))
    return rows


def bad_rows(template: dict) -> list[dict]:
    """Records a reader must count and report: no messages, no user key, a message without text."""
    empty = {
        **template,
        "conversation_hash": _hash("bad", "empty")[:32],
        "conversation": [],
        "openai_moderation": [],
        "detoxify_moderation": [],
        "turn": 0,
    }
    no_ip = {**template, "conversation_hash": _hash("bad", "no-ip")[:32], "hashed_ip": None}
    messages = [dict(m) for m in template["conversation"]]
    messages[0]["content"] = None
    no_text = {**template, "conversation_hash": _hash("bad", "no-text")[:32], "conversation": messages}
    return [empty, no_ip, no_text]


def drifted_shard(template: dict) -> pa.Table:
    """A shard whose `turn` is text and whose messages lack `turn_identifier`: wrong types, missing fields."""
    messages = [{k: v for k, v in m.items() if k != "turn_identifier"} for m in template["conversation"]]
    row = {**template, "conversation_hash": _hash("bad", "drift")[:32], "turn": "two", "conversation": messages}
    return pa.Table.from_pylist([row])


def main() -> None:
    if ROOT.exists():
        shutil.rmtree(ROOT)
    ROOT.mkdir(parents=True)
    rows = good_rows()
    rows[3:3] = bad_rows(rows[0])  # bad records between good ones
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), ROOT / "train-00000-of-00002.parquet")
    pq.write_table(drifted_shard(rows[0]), ROOT / "train-00001-of-00002.parquet")
    print(f"wrote {len(rows) + 1} conversations to {ROOT}")


if __name__ == "__main__":
    main()
