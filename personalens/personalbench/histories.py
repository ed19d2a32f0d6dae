"""Stage 1: conversations grouped into per-user histories, filtered by the config's rules."""

from __future__ import annotations

import hashlib
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from difflib import SequenceMatcher

from personalens.personalbench.wildchat import Conversation, Turn, UserKey


@dataclass(frozen=True)
class Filters:
    languages: tuple[str, ...] = ("English",)  # empty: any language
    min_conversations: int = 2
    min_user_turns: int = 3
    # scripted / bulk users: share of a user's opening prompts that nearly repeat another of them
    max_duplicate_share: float = 0.5
    duplicate_similarity: float = 0.8  # difflib ratio of normalized prompts counted as "nearly repeats"
    max_conversations: int = 50  # the most recent ones are kept
    holdout: int = 0  # the last N conversations' opening prompts become this user's prompts


@dataclass(frozen=True)
class History:
    user_id: str
    user: UserKey
    conversations: tuple[Conversation, ...]  # oldest first
    held_out: tuple[Conversation, ...] = ()

    @property
    def user_turns(self) -> tuple[Turn, ...]:
        return tuple(t for c in self.conversations for t in c.user_turns)

    def turn(self, turn_identifier: int) -> Turn | None:
        return next((t for t in self.user_turns if t.turn_identifier == turn_identifier), None)

    def conversation_of(self, turn_identifier: int) -> Conversation | None:
        return next(
            (c for c in self.conversations if any(t.turn_identifier == turn_identifier for t in c.user_turns)), None
        )


def user_id(key: UserKey) -> str:
    """A short stable id for the key (the hashed IP alone is shared by users behind one address)."""
    return (
        "u"
        + hashlib.sha256("\x1f".join((key.hashed_ip, key.user_agent, key.accept_language)).encode()).hexdigest()[:12]
    )


def group(conversations: Iterable[Conversation]) -> dict[UserKey, list[Conversation]]:
    users: dict[UserKey, list[Conversation]] = defaultdict(list)
    for c in conversations:
        users[c.user].append(c)
    return users


def _normalize(text: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"\d+", "#", text.lower())).strip()


def duplicate_share(prompts: Sequence[str], similarity: float) -> float:
    """The share of `prompts` that are near-identical (difflib ratio >= similarity) to another one."""
    texts = [_normalize(p) for p in prompts]
    repeated = [
        any(i != j and SequenceMatcher(None, a, b).ratio() >= similarity for j, b in enumerate(texts))
        for i, a in enumerate(texts)
    ]
    return sum(repeated) / len(texts) if texts else 0.0


def histories(users: dict[UserKey, list[Conversation]], filters: Filters) -> tuple[list[History], Counter]:
    """The users that pass `filters`, by user id, and the number dropped for each reason."""
    kept, dropped = [], Counter()
    for key, conversations in users.items():
        convs = sorted(conversations, key=lambda c: (c.timestamp, c.conversation_hash))
        if filters.languages:
            convs = [c for c in convs if c.language in filters.languages]
        convs = convs[-filters.max_conversations :] if filters.max_conversations > 0 else convs
        held_out = convs[len(convs) - filters.holdout :] if filters.holdout else []
        convs = convs[: len(convs) - len(held_out)]
        reason = _drop_reason(convs, filters)
        if reason:
            dropped[reason] += 1
        else:
            kept.append(History(user_id(key), key, tuple(convs), tuple(held_out)))
    return sorted(kept, key=lambda h: h.user_id), dropped


def _drop_reason(convs: list[Conversation], filters: Filters) -> str | None:
    if not convs:
        return "language"
    if len(convs) < filters.min_conversations:
        return "too few conversations"
    if sum(len(c.user_turns) for c in convs) < filters.min_user_turns:
        return "too few user turns"
    openings = [c.user_turns[0].content for c in convs]
    if duplicate_share(openings, filters.duplicate_similarity) > filters.max_duplicate_share:
        return "near-identical prompts (scripted or bulk user)"
    return None
