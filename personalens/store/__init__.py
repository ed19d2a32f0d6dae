"""The run's output store: Parquet schemas and keys, part-file datasets that resume, and the
progress display of long batch work. Below `simulate` and `judge`, which both write through it."""

from personalens.store.parts import PartWriter, existing_values, read_table, shard_dir
from personalens.store.progress import Progress, prompt_usage
from personalens.store.schema import DIALOGUE_SCHEMA, ID_FIELDS, JUDGMENT_KEY, JUDGMENT_SCHEMA, KEY_COLUMNS, TURN_TYPE

__all__ = [
    "PartWriter",
    "existing_values",
    "read_table",
    "shard_dir",
    "Progress",
    "prompt_usage",
    "DIALOGUE_SCHEMA",
    "ID_FIELDS",
    "JUDGMENT_KEY",
    "JUDGMENT_SCHEMA",
    "KEY_COLUMNS",
    "TURN_TYPE",
]
