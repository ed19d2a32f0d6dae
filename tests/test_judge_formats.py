"""Judge output grammars (checked with xgrammar itself, no tokenizer) and score parsing."""

from __future__ import annotations

from functools import cache

import pytest
import xgrammar as xg
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from personalens.judge.formats import FORMATS, Verdict, format_for, score_led_grammar

# The paper's formats (Figs. 16-20), spelled out here independently of the module under test.
LABELS = {
    "task_completion": ("", ["EXPLANATION:"]),
    "personalization": (
        "Personalization Score:",
        ["Key Observations:", "Justification:", "Improvement Suggestions:"],
    ),
    "naturalness": ("Naturalness Score:", ["Justification:"]),
    "coherence": ("Coherence Score:", ["Justification:"]),
}
IN_RANGE = {
    "task_completion": {"True": 1.0, "False": 0.0},
    "personalization": {str(s): float(s) for s in range(1, 5)},
    "naturalness": {str(s): float(s) for s in range(1, 6)},
    "coherence": {str(s): float(s) for s in range(1, 6)},
}


def render(dimension: str, score: str, texts: list[str], sep: str = "\n\n") -> str:
    score_label, fields = LABELS[dimension]
    body = "".join(f"{sep}{label} {text}" for label, text in zip(fields, texts))
    if dimension == "task_completion":
        return f" {score}{body}"
    return f"<response>{score_label} {score}{body}</response>"


@cache
def compiled(grammar: str) -> xg.CompiledGrammar:
    # An empty vocabulary: the matcher then checks strings, which is all these tests need.
    compiler = xg.GrammarCompiler(xg.TokenizerInfo([]), cache_enabled=False)
    return compiler.compile_grammar(xg.Grammar.from_ebnf(grammar))


def accepts(grammar: str, text: str, *, complete: bool = True) -> bool:
    """Whether `text` is a complete output of `grammar` (or, complete=False, a prefix of one)."""
    matcher = xg.GrammarMatcher(compiled(grammar), terminate_without_stop_token=True)
    # is_terminated: the output may end here (the engine would then only allow end-of-text)
    return matcher.accept_string(text) and (matcher.is_terminated() or not complete)


WELL_FORMED = [
    ("task_completion", " True\nEXPLANATION: The assistant booked the table for 7 pm.", 1.0),
    ("task_completion", "False\n\nEXPLANATION: No alarm was set;\nthe user gave up.", 0.0),
    ("task_completion", " False EXPLANATION:", 0.0),
    (
        "personalization",
        '<response>Personalization Score: 3\nKey Observations: - Recalled the "quiet" '
        "preference\n- Missed the vegan diet (see turn 2).\n\nJustification: Proactive, "
        "but asked for the time again: 07:30 was known.\n\nImprovement Suggestions: "
        "Use past <bookings> & defaults; avoid re-asking.</response>",
        3.0,
    ),
    (
        "personalization",
        "<response>\nPersonalization Score: 1 Key Observations: none. Justification: It "
        "asked for everything.\nImprovement Suggestions: — recall the café order.\n</response>",
        1.0,
    ),
    (
        "naturalness",
        "<response>Naturalness Score: 4\n\nJustification: Mostly fluent; one reply reads "
        "like a list (1., 2., 3.) and repeats 'Sure!'.\nOtherwise natural: ¿Qué tal? "
        "naïve résumé 東京.</response>",
        4.0,
    ),
    ("naturalness", "<response>Naturalness Score:5\nJustification:</response>", 5.0),
    (
        "coherence",
        "<response>Coherence Score: 2\n\nJustification: The user asks for a flight, then "
        "for a recipe -> off-topic.\n\n\tScore would be higher if it stayed on task."
        "</response>",
        2.0,
    ),
]


@pytest.mark.parametrize("dimension,text,score", WELL_FORMED)
def test_well_formed_outputs_are_accepted_and_parsed(dimension, text, score):
    fmt = format_for(dimension)
    assert accepts(fmt.grammar, text)
    assert fmt.parse(text) == Verdict(score, True)


@pytest.mark.parametrize("dimension,text,score", WELL_FORMED)
def test_an_output_cut_short_is_a_prefix_but_not_complete(dimension, text, score):
    fmt = format_for(dimension)
    cut = text[: len(text) - 3]
    assert accepts(fmt.grammar, cut, complete=False)
    # The TC output may stop anywhere in its explanation; the others must close their tag.
    assert accepts(fmt.grammar, cut) == (dimension == "task_completion" and "EXPLANATION:" in cut)
    # The score leads, so it survives the cut.
    assert fmt.parse(cut) == Verdict(score, True)


@pytest.mark.parametrize("dimension", sorted(FORMATS))
def test_every_score_value_round_trips(dimension):
    fmt = format_for(dimension)
    texts = ["Short note.", "Line one.\nLine two: 2 of 3.", "Try again."]
    for token, value in IN_RANGE[dimension].items():
        output = render(dimension, token, texts)
        assert accepts(fmt.grammar, output), output
        assert fmt.parse(output) == Verdict(value, True)
    lo, hi = fmt.score_range
    assert (lo, hi) == (min(IN_RANGE[dimension].values()), max(IN_RANGE[dimension].values()))


@pytest.mark.parametrize(
    "dimension,score",
    [
        ("personalization", "0"),
        ("personalization", "5"),
        ("naturalness", "0"),
        ("naturalness", "6"),
        ("coherence", "0"),
        ("coherence", "6"),
        ("coherence", "10"),
        ("task_completion", "Maybe"),
        ("task_completion", "true"),
    ],
)
def test_out_of_range_scores_are_rejected(dimension, score):
    fmt = format_for(dimension)
    output = render(dimension, score, ["Fine.", "Fine.", "Fine."])
    assert not accepts(fmt.grammar, output)
    assert not accepts(fmt.grammar, output, complete=False)
    if score != "true":  # lower case is the grammar's strictness, not the parser's
        assert fmt.parse(output) == Verdict(None, False)


REJECTED = [
    # score field missing or moved after the free text
    ("naturalness", "<response>Justification: Fine.</response>"),
    ("naturalness", "<response>Naturalness Score:\n\nJustification: Fine.</response>"),
    ("coherence", "<response>Justification: Fine.\nCoherence Score: 4</response>"),
    ("personalization", "<response>Key Observations: a\nJustification: b\nImprovement Suggestions: c</response>"),
    ("task_completion", "EXPLANATION: The goals were met."),
    ("task_completion", "VERDICT: True\nEXPLANATION: restated label"),
    # fields missing, out of order, or glued to the score
    ("personalization", "<response>Personalization Score: 2\nJustification: b\nImprovement Suggestions: c</response>"),
    ("naturalness", "<response>Naturalness Score: 4Justification: x</response>"),
    ("task_completion", " True"),
    # text after the closing tag, or the closing tag inside a field
    ("naturalness", "<response>Naturalness Score: 4\nJustification: x</response> more"),
    ("coherence", "<response>Coherence Score: 4\nJustification: x</response>y</response>"),
    # a later label inside an earlier field
    (
        "personalization",
        "<response>Personalization Score: 2\nKey Observations: a "
        "Improvement Suggestions: z\nJustification: b\nImprovement Suggestions: c</response>",
    ),
    # preamble before the response
    ("naturalness", "Here is my evaluation:\n<response>Naturalness Score: 4\nJustification: x</response>"),
]


@pytest.mark.parametrize("dimension,text", REJECTED)
def test_malformed_outputs_are_rejected(dimension, text):
    assert not accepts(format_for(dimension).grammar, text)


@pytest.mark.parametrize(
    "dimension,text,expected",
    [
        ("naturalness", "**Naturalness Score:** 4\nJustification: ok", 4.0),
        ("naturalness", "naturalness score : [3]", 3.0),
        ("naturalness", "Naturalness Score (1-5): 2", 2.0),
        ("coherence", "<response>\n  COHERENCE SCORE:\t5/5 \n</response>", 5.0),
        ("personalization", "Personalization Score: 3/4\nKey Observations: ...", 3.0),
        ("personalization", "Personalization Score: [1-4] 2", 2.0),
        ("personalization", "Personalization Score: [1-4]\nKey Observations: ...", None),
        ("naturalness", "Naturalness Score: 10", None),
        ("personalization", "Score: 4", 4.0),
        ("task_completion", "true\nEXPLANATION: all done", 1.0),
        ("task_completion", "  **FALSE**", 0.0),
        ("task_completion", "I checked each goal.\nVERDICT: False\nEXPLANATION: x", 0.0),
        ("task_completion", "[True]", 1.0),
        ("naturalness", "Naturalness Score: 6", None),
        ("naturalness", "Naturalness Score: 0", None),
        ("naturalness", "Naturalness Score: 3.5", None),
        ("personalization", "Personalization Score: 3/5", None),
        ("personalization", "Personalization Score: 5", None),
        ("coherence", "Coherence: good", None),
        ("coherence", "", None),
        ("task_completion", "Maybe\nEXPLANATION: unclear", None),
        ("task_completion", "Trueish", None),
        ("task_completion", "", None),
    ],
)
def test_parse_reads_loosely_written_outputs(dimension, text, expected):
    assert format_for(dimension).parse(text) == Verdict(expected, expected is not None)


def test_format_for_rejects_an_unknown_dimension():
    with pytest.raises(ValueError, match="'fluency'.*coherence"):
        format_for("fluency")
    assert {d: format_for(d).dimension for d in FORMATS} == {d: d for d in FORMATS}


# Free text: anything but surrogates (which cannot be encoded), so quotes, digits, newlines,
# tabs, brackets and non-ASCII letters all occur.
free_text = st.text(st.characters(exclude_categories=("Cs",)), max_size=60)


def _forbidden_in_fields(dimension: str) -> list[str]:
    return [*LABELS[dimension][1], "</response>"]


@settings(max_examples=60, deadline=None)
@given(
    dimension=st.sampled_from(sorted(FORMATS)),
    data=st.data(),
    texts=st.lists(free_text, min_size=3, max_size=3),
    sep=st.sampled_from([" ", "\n", "\n\n"]),
)
def test_any_in_range_output_is_accepted_and_parses_back(dimension, data, texts, sep):
    assume(not any(w in t for t in texts for w in _forbidden_in_fields(dimension)))
    token = data.draw(st.sampled_from(sorted(IN_RANGE[dimension])))
    fmt = format_for(dimension)
    output = render(dimension, token, texts, sep)
    assert accepts(fmt.grammar, output)
    assert fmt.parse(output) == Verdict(IN_RANGE[dimension][token], True)


@settings(max_examples=40, deadline=None)
@given(
    dimension=st.sampled_from(["personalization", "naturalness", "coherence"]),
    before=free_text,
    after=free_text,
)
def test_a_closing_tag_inside_free_text_is_rejected(dimension, before, after):
    assume("</response>" not in before + after)
    fmt = format_for(dimension)
    token = next(iter(IN_RANGE[dimension]))
    output = render(dimension, token, [before + "</response>" + after] * 3)
    assert not accepts(fmt.grammar, output)


# The text automaton on words with self-overlaps and characters that EBNF must escape.
tricky = st.text(st.sampled_from('ab]"-^\\\n['), max_size=12)


@settings(max_examples=150, deadline=None)
@given(closing=tricky.filter(bool), text=tricky)
def test_free_text_excludes_exactly_the_closing_string(closing, text):
    grammar = score_led_grammar("S:", ["x"], ["L:"], closing=closing)
    assert accepts(grammar, f"S: x L:{text}{closing}") == (closing not in text)
