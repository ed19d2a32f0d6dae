"""The Parquet schemas of a run's tables and the columns that key their rows (docs/outputs.md)."""

from __future__ import annotations

import pyarrow as pa

TURN_TYPE = pa.struct(
    [
        ("role", pa.string()),
        ("text", pa.string()),
        ("prompt_tokens", pa.int32()),
        ("completion_tokens", pa.int32()),
        ("finish_reason", pa.string()),  # "stop" | "length" (cut at max_tokens); null in older runs
        # a reasoning model's thinking before the answer in `text`, and its tokens (of completion_tokens;
        # null where the engine saw thinking without counting it); absent in older runs
        ("reasoning", pa.string()),
        ("reasoning_tokens", pa.int32()),
    ]
)

# columns that identify a dialogue and travel with every judgment of it
ID_FIELDS = [
    ("run_id", pa.string()),
    ("user_id", pa.string()),
    ("user_index", pa.int32()),
    ("task_id", pa.string()),
    ("kind", pa.string()),
    ("domains", pa.list_(pa.string())),
    ("setting", pa.string()),
    ("trial", pa.int32()),
    ("assistant_model", pa.string()),
    ("user_model", pa.string()),
]
KEY_COLUMNS = ["user_id", "task_id", "setting", "trial"]

DIALOGUE_SCHEMA = pa.schema(
    ID_FIELDS
    + [
        ("seed", pa.int64()),
        ("turns", pa.list_(TURN_TYPE)),
        ("rounds", pa.int32()),
        ("ended", pa.string()),  # terminated | max_rounds | context | thinking | failed (simulate/dialogue.py)
        ("error", pa.string()),  # the engine's message when it refused a request of the dialogue
        ("opening_terminate", pa.bool_()),
        ("seconds", pa.float64()),
        ("config_hash", pa.string()),
        ("session_started", pa.float64()),  # the writing invocation's start (its trace rows' too)
        # the reply that stopped inside its thinking (ended "thinking"): its role, tokens and thinking, finish_reason
        # "thinking" and no text; never sent on nor judged (null otherwise, and in older runs)
        ("stopped_turn", TURN_TYPE),
    ]
)

# one row per turn of `generate`, appended as each lockstep step ends (continuous: as they finish),
# so that a stopped shard resumes its unfinished dialogues from their stored turns
# (personalens/store/turns.py); a dialogue's row in DIALOGUE_SCHEMA still holds all its turns
TURNS_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        *((c, pa.string()) for c in KEY_COLUMNS[:3]),
        ("trial", pa.int32()),
        ("index", pa.int32()),  # the turn's place in its dialogue, from 0 (the user agent's opening)
        *((f.name, f.type) for f in TURN_TYPE),
        ("said_terminate", pa.bool_()),  # a user reply that said TERMINATE (the word is removed from `text`)
        ("session_started", pa.float64()),  # the `generate` invocation that simulated the turn
        # the invocation that stored the turn this one answers (turn index - 1): the same one, or, at a
        # resumed dialogue's first new turn, the one whose stored turns it resumed from; null for an
        # opening and in turns stored before the column existed (store/turns.py reads the chains)
        ("follows_session", pa.float64()),
    ]
)

# how a dialogue ended (its `ended`; personalens/simulate/dialogue.py), and how summaries and the
# report name each ending
ENDINGS = ("terminated", "max_rounds", "context", "thinking", "failed")
ENDING_NAMES = {
    "terminated": "TERMINATE",
    "max_rounds": "round cap",
    "context": "context full",
    "thinking": "stopped in thinking",
    "failed": "failed (refused by the engine)",
}

# one row per batched generate call of `generate` (personalens/simulate/trace.py); a resumed run
# appends its calls under its own `session_started`
TRACE_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("session_started", pa.float64()),
        ("step", pa.int32()),
        ("call", pa.int32()),
        ("model", pa.string()),
        ("roles", pa.list_(pa.string())),
        ("requests", pa.int32()),
        ("prompt_tokens", pa.int64()),
        ("cached_tokens", pa.int64()),
        ("completion_tokens", pa.int64()),
        ("started", pa.float64()),
        ("seconds", pa.float64()),
        ("first_finished", pa.float64()),
        ("last_finished", pa.float64()),
        ("tail", pa.float64()),
        ("reported", pa.int32()),
        ("context_ended", pa.int32()),
        ("refused", pa.int32()),
        ("cut", pa.int32()),
        ("cohort", pa.int32()),
        ("engine", pa.int32()),
    ]
)

JUDGMENT_SCHEMA = pa.schema(
    ID_FIELDS
    + [
        ("dimension", pa.string()),
        ("speaker", pa.string()),
        ("turn", pa.int32()),
        ("score", pa.float64()),
        ("parsed", pa.bool_()),
        ("judge_text", pa.string()),
        ("judge_model", pa.string()),
        ("prompt_hash", pa.string()),
        # "stop" | "length" | "thinking" (stopped inside its thinking); null when the judge refused the request
        ("finish_reason", pa.string()),
        ("failure", pa.string()),  # why there is no valid score (null when parsed): docs/outputs.md
        # a reasoning judge's thinking (never parsed for the score) and its tokens
        ("judge_reasoning", pa.string()),
        ("reasoning_tokens", pa.int32()),
        ("session_started", pa.float64()),  # the writing invocation's start
        # the judge that wrote it: the fingerprint of its model, sampling, templates and options (the
        # digest its saved judge config holds); null in runs written before judge panels, whose rows
        # all belong to the run's one judge (judge.yaml)
        ("judge_key", pa.string()),
    ]
)
# a judgment of one judge; a panel's judges each hold their own rows under their `judge_key`
JUDGMENT_KEY = KEY_COLUMNS + ["dimension", "speaker", "turn"]

# The scale of each judge dimension (inclusive): the judge's grammars and parsers and the report's
# out-of-range count read it here. Under fidelity=official a parsed score may lie outside it, as the
# released code keeps whatever number its regex finds (docs/fidelity.md).
SCORE_RANGES: dict[str, tuple[int, int]] = {
    "task_completion": (0, 1),
    "personalization": (1, 4),
    "naturalness": (1, 5),
    "coherence": (1, 5),
}
