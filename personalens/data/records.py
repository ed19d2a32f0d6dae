"""Typed records for the PersonaLens data: users, tasks, situations, scenarios, turns."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

# The 20 domains of the release, in the order the paper lists them.
DOMAINS: tuple[str, ...] = (
    "Alarm",
    "Books",
    "Buses",
    "Calendar",
    "Events",
    "Finance",
    "Flights",
    "Games",
    "Hotels",
    "Media",
    "Messaging",
    "Movies",
    "Music",
    "Rental Cars",
    "Restaurants",
    "Services",
    "Shopping",
    "Sports",
    "Train",
    "Travel",
)


def with_domains(added: Iterable[str]) -> tuple[str, ...]:
    """The domains of a data root that adds `added` to the release's (a lab extending the benchmark):
    the release's 20 in the paper's order, then the added ones in name order, so that every reader
    of the same root sees the same order whatever order it found them in."""
    return DOMAINS + tuple(sorted(set(added) - set(DOMAINS)))


# Situation keys exactly as the release spells them, in the order they are shown to models.
SITUATION_KEYS: tuple[str, ...] = ("Location", "Device", "Time of Day", "Day of the Week", "Environment")

Kind = Literal["SD", "MD"]
Role = Literal["user", "assistant"]
AffinityValue = str | tuple[str, ...]


@dataclass(frozen=True)
class UserProfile:
    index: int  # 7 for "user7"
    user_id: str  # "user7"
    demographics: Mapping[str, str]  # release order, *without* user_id
    interests: Mapping[str, int]  # domain -> 0/1
    affinities: Mapping[str, Mapping[str, AffinityValue]]  # domain -> preference type -> value
    interactions: Mapping[str, str]  # domain -> past-interaction summary


@dataclass(frozen=True)
class Task:
    task_id: str  # "SD-Rental Cars-task-1" or "MD-task-3"
    kind: Kind
    description: str
    user_intent: str
    goal: str
    domains: tuple[str, ...]  # one for SD, 2-5 for MD
    affinity_types: tuple[str, ...]


@dataclass(frozen=True)
class Situation:
    location: str
    device: str
    time_of_day: str
    day_of_week: str
    environment: str

    def items(self) -> tuple[tuple[str, str], ...]:
        """(release key, value) pairs in the release's order."""
        return tuple(
            zip(SITUATION_KEYS, (self.location, self.device, self.time_of_day, self.day_of_week, self.environment))
        )


@dataclass(frozen=True)
class Scenario:
    """One user x one task assigned to that user, with the user's situation for it."""

    user: UserProfile
    task: Task
    situation: Situation

    @property
    def key(self) -> tuple[str, str]:
        return (self.user.user_id, self.task.task_id)


@dataclass(frozen=True)
class Turn:
    role: Role
    text: str
