"""Stage 2 without the model: the extraction prompt of a history, the evidence check, and the
confidence and near-duplicate filters over the attributes the model returned."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from difflib import SequenceMatcher

from personalens.personalbench.formats import Attribute
from personalens.personalbench.histories import History
from personalens.personalbench.wildchat import Conversation


@dataclass(frozen=True)
class Rules:
    categories: tuple[str, ...]
    max_attributes: int = 5
    min_confidence: float = 0.5
    duplicate_similarity: float = 0.85  # difflib ratio of normalized statements that merges two attributes
    drop_failed_evidence: bool = False  # keep them by default: humans see them and the share is reported
    max_history_chars: int = 6000  # the newest user turns that fit are shown to the model
    sensitive_categories: tuple[str, ...] = ()  # attribute categories counted as emotionally sensitive
    sensitive_moderation: tuple[str, ...] = ()  # moderation categories that mark a conversation; () = any flag


def shown_turns(history: History, max_chars: int) -> list[dict]:
    """The user's own turns, oldest first, as many of the newest as fit in `max_chars`."""
    turns, used = [], 0
    for turn in reversed(history.user_turns):
        used += len(turn.content)
        if turns and used > max_chars:
            break
        turns.append({"id": turn.turn_identifier, "text": turn.content[:max_chars]})
    return turns[::-1]


def _normalize(text: str) -> str:
    text = re.sub(r"\s+", " ", text.casefold()).strip()
    return text.strip(" \"'.…")


def evidence_ok(history: History, attribute: Attribute) -> bool:
    """Whether the quote occurs (case and spacing aside) in the user turn it cites."""
    turn = history.turn(attribute.turn_identifier)
    quote = _normalize(attribute.evidence)
    return turn is not None and bool(quote) and quote in _normalize(turn.content)


def sensitive_conversation(conversation: Conversation | None, moderation: Sequence[str]) -> bool:
    if conversation is None:
        return False
    if conversation.toxic:
        return True
    if moderation:
        return any(c in moderation for c in conversation.flagged_categories)
    return conversation.flagged


def review(history: History, attributes: Sequence[Attribute], rules: Rules) -> list[dict]:
    """Every attribute with its checks: evidence_ok, sensitive, and kept or the reason it was dropped."""
    rows, kept_texts = [], []
    for k, a in enumerate(attributes):
        ok = evidence_ok(history, a)
        reason = ""
        if a.confidence < rules.min_confidence:
            reason = "low confidence"
        elif rules.drop_failed_evidence and not ok:
            reason = "evidence not found"
        elif any(
            SequenceMatcher(None, _normalize(a.statement), t).ratio() >= rules.duplicate_similarity for t in kept_texts
        ):
            reason = "near-duplicate"
        if not reason:
            kept_texts.append(_normalize(a.statement))
        conversation, turn = history.conversation_of(a.turn_identifier), history.turn(a.turn_identifier)
        rows.append(
            {
                "attribute_id": f"{history.user_id}-a{k}",
                "statement": a.statement,
                "category": a.category,
                "confidence": a.confidence,
                "turn_identifier": a.turn_identifier,
                "evidence": a.evidence,
                "turn_text": turn.content if turn else "",
                "evidence_ok": ok,
                "kept": not reason,
                "drop_reason": reason,
                "sensitive": a.category in rules.sensitive_categories
                or sensitive_conversation(conversation, rules.sensitive_moderation),
            }
        )
    return rows
