"""The output grammar (xgrammar EBNF, root rule `root`) and parser of every PersonalBench model call.

Each grammar fixes the field order and bounds the free text, so an output fits a short max_tokens and
parses; an output cut off anyway is recorded as unparsed, never guessed at."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

# a JSON string without quotes, backslashes or newlines inside: what a statement or quote needs
_TEXT = r'[^"\\\n]'


def _json_string(rule: str, max_chars: int) -> str:
    return f'{rule} ::= "\\"" {_TEXT}{{1,{max_chars}}} "\\""'


def _literal(text: str) -> str:
    return json.dumps(text)  # a JSON string literal is also a valid EBNF literal


def extraction_grammar(
    turn_ids: Sequence[int],
    categories: Sequence[str],
    max_attributes: int,
    statement_chars: int = 100,
    quote_chars: int = 80,
) -> str:
    """`{"attributes": [...]}` with 1..max_attributes attributes, each citing one of `turn_ids`."""
    if not turn_ids or not categories or max_attributes < 1:
        raise ValueError("extraction_grammar needs turn ids, categories and max_attributes >= 1")
    fields = [
        ("statement", "statement"),
        ("category", "category"),
        ("confidence", "confidence"),
        ("turn_identifier", "turnid"),
        ("evidence", "quote"),
    ]
    body = ' ", " '.join(f'"\\"{name}\\": " {rule}' for name, rule in fields)
    return (
        "\n".join(
            [
                f'root ::= "{{\\"attributes\\": [" attribute (", " attribute){{0,{max_attributes - 1}}} "]}}"',
                f'attribute ::= "{{" {body} "}}"',
                _json_string("statement", statement_chars),
                _json_string("quote", quote_chars),
                "category ::= " + " | ".join(_literal(json.dumps(c)) for c in categories),
                'confidence ::= "0." [0-9] | "1.0"',
                "turnid ::= " + " | ".join(f'"{int(t)}"' for t in sorted(set(turn_ids))),
            ]
        )
        + "\n"
    )


@dataclass(frozen=True)
class Attribute:
    statement: str
    category: str
    confidence: float
    turn_identifier: int
    evidence: str


def parse_extraction(text: str) -> list[Attribute] | None:
    """The attributes of a grammar-conforming output; None when it does not parse (cut off)."""
    try:
        items = json.loads(text)["attributes"]
        return [
            Attribute(
                str(a["statement"]).strip(),
                str(a["category"]),
                float(a["confidence"]),
                int(a["turn_identifier"]),
                str(a["evidence"]),
            )
            for a in items
        ]
    except (ValueError, KeyError, TypeError):
        return None


RELEVANCE_GRAMMAR = 'root ::= "Relevant: " ("yes" | "no") "\\nReason: " [^\\n]{1,160}\n'
_RELEVANCE = re.compile(r"^Relevant: (yes|no)\nReason: ")


def parse_relevance(text: str) -> bool | None:
    match = _RELEVANCE.match(text)
    return None if match is None else match[1] == "yes"


# free text for the responses: not parsed, but never empty
RESPONSE_GRAMMAR = "root ::= [^\\x00]+\n"

PREFERENCE_GRAMMAR = (
    'root ::= "Preference: " [1-5] "\\nExplicit mention: " ("yes" | "no") "\\nReason: " [^\\n]{1,200}\n'
)
_PREFERENCE = re.compile(r"^Preference: ([1-5])\nExplicit mention: (yes|no)\n")


@dataclass(frozen=True)
class Preference:
    score: int  # 1 = response A much better ... 5 = response B much better
    explicit_mention: bool


def parse_preference(text: str) -> Preference | None:
    match = _PREFERENCE.match(text)
    return None if match is None else Preference(int(match[1]), match[2] == "yes")


def personalized_rating(score: int, personalized_first: bool) -> int:
    """The A/B score as a rating of the personalized response against the generic one: 5 = much
    better, 3 = about the same, 1 = much worse."""
    return 6 - score if personalized_first else score
