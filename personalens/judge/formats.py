"""What the judge must write for each dimension: an output grammar and a score parser.

Each grammar (xgrammar EBNF, root rule ``root``) puts the verdict or score first, so an output
cut by ``max_tokens`` still carries it, and keeps the free-text fields free while forbidding in
them the labels that follow and the closing tag: the field boundaries stay unambiguous, and the
model cannot write ``</response>`` without ending the output.

The parser reads grammar-conforming outputs and, for unconstrained engines, the paper's format
written loosely (any case and spacing, ``**bold**``, ``[3]``, ``3/4``).

``official_formats`` are the released code's output formats instead (the `official` fidelity
option): the exact layout its prompts ask for, read with its own regular expressions, the free
text bounded so that the whole output always fits in the judge's token budget.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from personalens.engines.grammar import class_chars, literal
from personalens.store import SCORE_RANGES

# Whitespace before the first token and between the score and the first label: bounded, since a
# constrained model that may write unbounded whitespace sometimes never stops writing it.
_SPACE = "[ \\n]?"
_SEPARATOR = "[ \\n]{1,2}"


@dataclass(frozen=True)
class Verdict:
    score: float | None  # None exactly when parsed is False
    parsed: bool


_UNPARSED = Verdict(score=None, parsed=False)


@dataclass(frozen=True)
class JudgeFormat:
    dimension: str
    grammar: str  # xgrammar EBNF, root rule `root`
    score_range: tuple[int, int]  # inclusive
    score_pattern: re.Pattern[str]  # group "score" holds the score token, "out_of" a "/N" if any
    score_words: tuple[str, ...] = ()  # lower-case words for the scores lo..hi; () means digits
    missing: Verdict = _UNPARSED  # the reading of an output without any verdict or score
    # True: a whole-number score outside `score_range` is kept, as the released code keeps whatever
    # its `<Dimension> Score: (\d+)` finds; False: it counts as unparsed (the paper's scale)
    keep_out_of_range: bool = False

    def parse(self, text: str) -> Verdict:
        """The first verdict or score in `text`; `missing` when absent, parsed=False when out of
        range unless `keep_out_of_range`."""
        match = self.score_pattern.search(text)
        if match is None:
            return self.missing
        lo, hi = self.score_range
        token = match["score"].lower()
        if self.score_words:
            return Verdict(float(lo + self.score_words.index(token)), True)
        out_of = match.groupdict().get("out_of")
        value = float(token)
        if not value.is_integer() or out_of not in (None, str(hi)):
            return _UNPARSED
        if not self.in_range(value) and not self.keep_out_of_range:
            return _UNPARSED
        return Verdict(value, True)

    def in_range(self, score: float) -> bool:
        lo, hi = self.score_range
        return lo <= score <= hi


def score_led_grammar(
    score_label: str,
    scores: Sequence[str],
    fields: Sequence[str],
    *,
    opening: str = "",
    closing: str = "",
) -> str:
    """EBNF for ``[opening] score_label score (label free-text)... closing``.

    `fields` are the labels of the free-text fields, in order; each field's text may hold
    anything except the later labels and `closing`.
    """
    if not scores:
        raise ValueError("score_led_grammar: `scores` is empty")
    head = [_SPACE]
    if opening:
        head += [literal(opening), _SPACE]
    if score_label:
        head += [literal(score_label), '" "?']
    body = ["score"]
    rules = ["score ::= " + " | ".join(literal(s) for s in scores)]
    for i, label in enumerate(fields):
        name = f"text{i}"
        body += [_SEPARATOR, literal(label), name]
        rules += _text_avoiding(name, [*fields[i + 1 :], closing])
    if closing:
        body.append(literal(closing))
    return "\n".join(["root ::= " + " ".join(head + body), *rules]) + "\n"


def _text_avoiding(name: str, forbidden: Sequence[str]) -> list[str]:
    """Rules for the strings that contain none of `forbidden` (rule `name` is the start).

    One rule per state of the matching automaton (Aho-Corasick): a state is the longest suffix
    of the text so far that begins a forbidden string; a character completing one has no edge.
    """
    words = sorted({w for w in forbidden if w})
    prefixes = {""} | {w[:i] for w in words for i in range(len(w))}

    def completes_word(text: str) -> bool:
        return any(text.endswith(w) for w in words)

    def state_of(text: str) -> str:
        return next(text[i:] for i in range(len(text) + 1) if text[i:] in prefixes)

    states = sorted((p for p in prefixes if not completes_word(p)), key=lambda p: (len(p), p))
    rule = {p: name if not p else f"{name}_{i}" for i, p in enumerate(states)}
    alphabet = sorted({c for w in words for c in w})
    rules = []
    for state in states:
        edges: dict[str, list[str]] = {}  # target state -> characters leading there
        for char in alphabet:
            if not completes_word(state + char):
                edges.setdefault(state_of(state + char), []).append(char)
        # any character outside the alphabet, or leading back to the start, restarts matching
        special = [c for c in alphabet if c not in edges.get("", [])]
        alternatives = ['""', f"[^{class_chars(special)}] {name}"]
        alternatives += [f"[{class_chars(cs)}] {rule[t]}" for t, cs in edges.items() if t]
        rules.append(f"{rule[state]} ::= " + " | ".join(alternatives))
    return rules


# Markdown emphasis and brackets a free-running judge wraps around its score; it may also
# restate the scale, as in "Score (1-5): 4" or "Score: [1-4] 3", which is never the score.
_DECOR = r"[*_\s]*"
_SCALE = rf"(?:[\[(]\s*\d+\s*-\s*\d+\s*[\])]{_DECOR})?"
_NUMERIC_SCORE = re.compile(
    rf"\bscore\b{_DECOR}{_SCALE}[:=]?{_DECOR}{_SCALE}"
    rf"[\[(]?\s*(?P<score>\d+(?:\.\d+)?)(?!\s*-\s*\d)(?:\s*/\s*(?P<out_of>\d+))?",
    re.IGNORECASE,
)
# The TC prompt ends with "VERDICT:", so the verdict opens the output; a judge that restates
# the label first is read too.
_BOOLEAN_VERDICT = re.compile(rf"(?:^|\bverdict\b{_DECOR}:?){_DECOR}[\[(]?\s*(?P<score>true|false)\b", re.IGNORECASE)


def _scores(dimension: str) -> list[str]:
    lo, hi = SCORE_RANGES[dimension]
    return [str(s) for s in range(lo, hi + 1)]


def _tagged_format(dimension: str, score_label: str, fields: Sequence[str]) -> JudgeFormat:
    """The <response>...</response> format of Figs. 17-20: a score on the dimension's scale, then free text."""
    grammar = score_led_grammar(score_label, _scores(dimension), fields, opening="<response>", closing="</response>")
    return JudgeFormat(dimension, grammar, SCORE_RANGES[dimension], _NUMERIC_SCORE)


FORMATS: dict[str, JudgeFormat] = {
    "task_completion": JudgeFormat(
        "task_completion",
        score_led_grammar("", ["False", "True"], ["EXPLANATION:"]),
        SCORE_RANGES["task_completion"],
        _BOOLEAN_VERDICT,
        score_words=("false", "true"),
    ),
    "personalization": _tagged_format(
        "personalization",
        "Personalization Score:",
        ["Key Observations:", "Justification:", "Improvement Suggestions:"],
    ),
    "naturalness": _tagged_format("naturalness", "Naturalness Score:", ["Justification:"]),
    "coherence": _tagged_format("coherence", "Coherence Score:", ["Justification:"]),
}


def format_for(dimension: str, formats: Mapping[str, JudgeFormat] = FORMATS) -> JudgeFormat:
    try:
        return formats[dimension]
    except KeyError:
        raise ValueError(f"unknown judge dimension {dimension!r}; expected one of {sorted(formats)}") from None


# ---- the released code's formats ---------------------------------------------------------------

# Free text of the official formats: printable ASCII and newlines, so every character costs at
# least one token of the budget; where a closing tag follows, without "<" so it cannot come early.
_TEXT = "[\\x20-\\x7e\\n]"
_TEXT_BEFORE_TAG = "[\\x20-\\x3b\\x3d-\\x7e\\n]"


def bounded_grammar(
    opening: str, scores: Sequence[str], separators: Sequence[str], closing: str, max_tokens: int
) -> str:
    """EBNF for ``opening score (separator text)... closing`` whose longest output has at most
    `max_tokens` - 1 characters (one token is kept for the end of text): each text field gets an
    equal share of what the fixed parts leave."""
    if not scores or not separators:
        raise ValueError("bounded_grammar: needs scores and at least one free-text field")
    fixed = len(opening) + max(map(len, scores)) + sum(map(len, separators)) + len(closing) + 1
    room = (max_tokens - fixed) // len(separators)
    if room < 1:
        raise ValueError(
            f"judge max_tokens {max_tokens} is too small for the released code's output format, "
            f"which needs at least {fixed + len(separators)}"
        )
    body = [literal(opening), "score", *(f"{literal(sep)} text" for sep in separators)]
    if closing:
        body.append(literal(closing))
    return (
        "\n".join(
            [
                "root ::= " + " ".join(body),
                "score ::= " + " | ".join(literal(s) for s in scores),
                f"text ::= {_TEXT_BEFORE_TAG if closing else _TEXT}{{0,{room}}}",
            ]
        )
        + "\n"
    )


def _official_scored(dimension: str, label: str, separators: Sequence[str], max_tokens: int) -> JudgeFormat:
    """``<response>`` then ``<label>: <score>`` and the fields, read by the released `<label>: (\\d+)`
    (util/gather_evaluation.py, `extract_score`), which keeps any number it finds."""
    grammar = bounded_grammar(f"<response>\n{label}: ", _scores(dimension), separators, "\n</response>", max_tokens)
    return JudgeFormat(
        dimension,
        grammar,
        SCORE_RANGES[dimension],
        re.compile(rf"{label}: (?P<score>\d+)"),
        keep_out_of_range=True,
    )


def official_formats(max_tokens: int) -> dict[str, JudgeFormat]:
    """The released code's formats, for a judge allowed `max_tokens` new tokens. Its task-completion
    reading counts an output without a verdict as False (kept in the rate's denominator)."""
    return {
        "task_completion": JudgeFormat(
            "task_completion",
            bounded_grammar("VERDICT: ", ["True", "False"], ["\nEXPLANATION: "], "", max_tokens),
            SCORE_RANGES["task_completion"],
            re.compile(r"VERDICT: (?P<score>True|False)", re.IGNORECASE),
            score_words=("false", "true"),
            missing=Verdict(0.0, True),
        ),
        "personalization": _official_scored(
            "personalization",
            "Personalization Score",
            ["\nKey Observations:\n", "\n\nJustification: ", "\n\nImprovement Suggestions:\n"],
            max_tokens,
        ),
        "naturalness": _official_scored("naturalness", "Naturalness Score", ["\nJustification: "], max_tokens),
        "coherence": _official_scored("coherence", "Coherence Score", ["\nJustification: "], max_tokens),
    }


# fidelity option's `judge_format` -> the formats for a token budget
JUDGE_FORMATS: Mapping[str, Callable[[int], Mapping[str, JudgeFormat]]] = {
    "paper": lambda max_tokens: FORMATS,
    "official": official_formats,
}


def formats_named(name: str, max_tokens: int) -> Mapping[str, JudgeFormat]:
    try:
        make = JUDGE_FORMATS[name]
    except KeyError:
        raise ValueError(f"unknown judge format {name!r}; expected one of {', '.join(JUDGE_FORMATS)}") from None
    return make(max_tokens)
