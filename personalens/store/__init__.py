"""The run's output store: Parquet schemas and keys, and part-file datasets that resume. Below the
pipelines, which all write through it."""

from personalens.store.parts import PartWriter, existing_values, read_table, shard_dir
from personalens.store.schema import (
    DIALOGUE_SCHEMA,
    ENDING_NAMES,
    ENDINGS,
    ID_FIELDS,
    JUDGMENT_KEY,
    JUDGMENT_SCHEMA,
    KEY_COLUMNS,
    SCORE_RANGES,
    TRACE_SCHEMA,
    TURN_TYPE,
    TURNS_SCHEMA,
)
from personalens.store.summaries import append_summary, read_summaries, spec_decode_recorded
from personalens.store.turns import continued_dialogues, partial_dialogues, stored_turns

__all__ = [
    "PartWriter",
    "existing_values",
    "read_table",
    "shard_dir",
    "DIALOGUE_SCHEMA",
    "ENDING_NAMES",
    "ENDINGS",
    "ID_FIELDS",
    "JUDGMENT_KEY",
    "JUDGMENT_SCHEMA",
    "KEY_COLUMNS",
    "SCORE_RANGES",
    "TRACE_SCHEMA",
    "TURN_TYPE",
    "TURNS_SCHEMA",
    "continued_dialogues",
    "partial_dialogues",
    "stored_turns",
    "append_summary",
    "spec_decode_recorded",
    "read_summaries",
]
