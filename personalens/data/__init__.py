"""The data layer: records, loading the official release, user selection, sharding, validation."""

from personalens.data.errors import DataError, Problem
from personalens.data.loading import domains_of, list_user_indices, load_scenarios, load_task_definitions, load_user
from personalens.data.records import (
    DOMAINS,
    SITUATION_KEYS,
    Kind,
    Role,
    Scenario,
    Situation,
    Task,
    Turn,
    UserProfile,
)
from personalens.data.selection import SUBSETS, task_kinds, user_indices
from personalens.data.sharding import assign_shards, scenario_counts, shard
from personalens.data.validate import Report, validate

__all__ = [
    "DOMAINS",
    "SITUATION_KEYS",
    "SUBSETS",
    "DataError",
    "Kind",
    "Problem",
    "Report",
    "Role",
    "Scenario",
    "Situation",
    "Task",
    "Turn",
    "UserProfile",
    "assign_shards",
    "domains_of",
    "list_user_indices",
    "load_scenarios",
    "load_task_definitions",
    "load_user",
    "scenario_counts",
    "shard",
    "task_kinds",
    "user_indices",
    "validate",
]
