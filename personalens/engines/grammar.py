"""Pieces of the EBNF (GBNF) grammars that constrain engine outputs (xgrammar reads them), shared by
the judge's formats and the data builder's grammars."""

from __future__ import annotations

from collections.abc import Sequence

LITERAL_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}
_CLASS_ESCAPES = {**LITERAL_ESCAPES, "]": "\\]", "[": "\\[", "^": "\\^", "-": "\\-"}


def literal(text: str) -> str:
    """An EBNF string literal matching exactly `text`."""
    return '"' + "".join(LITERAL_ESCAPES.get(c, c) for c in text) + '"'


def class_chars(chars: Sequence[str]) -> str:
    """`chars` escaped for use inside an EBNF character class `[...]`."""
    return "".join(_CLASS_ESCAPES.get(c, c) for c in chars)
