"""The Parquet tables of a PersonalBench run and the columns that key their rows (docs/personalbench.md)."""

from __future__ import annotations

import pyarrow as pa

ATTRIBUTE_TYPE = pa.struct(
    [
        ("attribute_id", pa.string()),
        ("statement", pa.string()),
        ("category", pa.string()),
        ("confidence", pa.float64()),
        ("turn_identifier", pa.int64()),
        ("evidence", pa.string()),
        ("turn_text", pa.string()),
        ("evidence_ok", pa.bool_()),
        ("sensitive", pa.bool_()),
        ("kept", pa.bool_()),
        ("drop_reason", pa.string()),
    ]
)

# stage 1: the users that passed the filters, and their (user, prompt) pairs
PAIRS = pa.schema(
    [
        ("user_id", pa.string()),
        ("prompt_id", pa.string()),
        ("prompt", pa.string()),
        ("sensitive", pa.bool_()),
        ("conversations", pa.int32()),
        ("user_turns", pa.int32()),
    ]
)
PAIR_KEY = ["user_id", "prompt_id"]

# stage 2: one row per user, the model's whole output and the attributes read from it
EXTRACTIONS = pa.schema(
    [
        ("user_id", pa.string()),
        ("model", pa.string()),
        ("text", pa.string()),
        ("parsed", pa.bool_()),
        ("attributes", pa.list_(ATTRIBUTE_TYPE)),
        ("completion_tokens", pa.int32()),
    ]
)
EXTRACTION_KEY = ["user_id"]

# stage 3: one row per (user, prompt, attribute, method); method "llm" (the model), "bm25", "embedding"
RELEVANCE = pa.schema(
    [
        ("user_id", pa.string()),
        ("prompt_id", pa.string()),
        ("attribute_id", pa.string()),
        ("method", pa.string()),
        ("model", pa.string()),
        ("selected", pa.bool_()),
        ("score", pa.float64()),
        ("parsed", pa.bool_()),
        ("text", pa.string()),
        ("sensitive", pa.bool_()),
    ]
)
RELEVANCE_KEY = ["user_id", "prompt_id", "attribute_id", "method"]

# stage 4: a generic and a personalized response per pair
RESPONSES = pa.schema(
    [
        ("user_id", pa.string()),
        ("prompt_id", pa.string()),
        ("variant", pa.string()),
        ("attribute_ids", pa.list_(pa.string())),
        ("model", pa.string()),
        ("text", pa.string()),
        ("completion_tokens", pa.int32()),
    ]
)
RESPONSE_KEY = ["user_id", "prompt_id", "variant"]

# stage 5: the judge's preference of the personalized over the generic response, shown in random order
PREFERENCES = pa.schema(
    [
        ("user_id", pa.string()),
        ("prompt_id", pa.string()),
        ("personalized_first", pa.bool_()),
        ("score", pa.int32()),
        ("rating", pa.int32()),
        ("explicit_mention", pa.bool_()),
        ("parsed", pa.bool_()),
        ("text", pa.string()),
        ("judge_model", pa.string()),
        ("sensitive", pa.bool_()),
    ]
)
PREFERENCE_KEY = ["user_id", "prompt_id"]

TABLES = {
    "pairs": (PAIRS, PAIR_KEY),
    "extractions": (EXTRACTIONS, EXTRACTION_KEY),
    "relevance": (RELEVANCE, RELEVANCE_KEY),
    "responses": (RESPONSES, RESPONSE_KEY),
    "preferences": (PREFERENCES, PREFERENCE_KEY),
}
