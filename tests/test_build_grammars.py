"""Build-stage grammars (checked with xgrammar itself, no tokenizer) and their parsers."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from xml.sax.saxutils import escape, quoteattr

import pytest
import xgrammar as xg

from personalens.data.schema import SchemaError, load_schema
from personalens.datagen import grammars as G

REPO = Path(__file__).resolve().parents[1]
BUNDLED = REPO / "data" / "datagen" / "schema.json"
OFFICIAL = REPO.parent / "shared" / "official-code" / "res" / "schema.json"
LIMITS = G.Limits(text_words=6, summary_words=12, list_items=2, word_chars=10)


@cache
def compiled(grammar: str) -> xg.CompiledGrammar:
    compiler = xg.GrammarCompiler(xg.TokenizerInfo([]), cache_enabled=False)
    return compiler.compile_grammar(xg.Grammar.from_ebnf(grammar))


def accepts(grammar: str, text: str) -> bool:
    matcher = xg.GrammarMatcher(compiled(grammar), terminate_without_stop_token=True)
    return matcher.accept_string(text) and matcher.is_terminated()


def dumps(obj) -> str:
    return json.dumps(obj, ensure_ascii=False)  # ", " and ": " separators, as the grammars write JSON


SCHEMAS = [
    pytest.param(BUNDLED, id="bundled"),
    pytest.param(
        OFFICIAL,
        id="official",
        marks=pytest.mark.skipif(
            not OFFICIAL.is_file(), reason=f"official schema not found at {OFFICIAL} (not part of the repository)"
        ),
    ),
]


def simple_value(affinity):
    """A valid value: the first possible value, or a short text; a list when multi-valued."""
    value = affinity.possible_values[0] if affinity.closed else "quiet mornings"
    return [value] if affinity.has_multiple_values else value


@pytest.mark.parametrize("path", SCHEMAS)
def test_every_categorical_value_is_allowed_and_nothing_else(path):
    for domain in load_schema(path):
        grammar = G.preferences_grammar(domain, LIMITS)
        base = {a.name: simple_value(a) for a in domain.affinities}
        assert accepts(grammar, dumps(base))
        assert G.parse_preferences(dumps(base), domain) == base
        for affinity in domain.affinities:
            if not affinity.closed:
                continue
            for value in affinity.possible_values:
                item = [value] if affinity.has_multiple_values else value
                assert accepts(grammar, dumps({**base, affinity.name: item})), (domain.name, affinity.name, value)
            outside = "not-a-listed-value"
            assert outside not in affinity.possible_values
            item = [outside] if affinity.has_multiple_values else outside
            assert not accepts(grammar, dumps({**base, affinity.name: item}))


@pytest.mark.parametrize("path", SCHEMAS)
def test_multi_valued_lists_are_distinct_in_schema_order_and_bounded(path):
    domains = load_schema(path)
    domain, affinity = next(
        (d, a)
        for d in domains
        for a in d.affinities
        if a.closed and a.has_multiple_values and len(a.possible_values) >= 3
    )
    grammar = G.preferences_grammar(domain, LIMITS)
    base = {a.name: simple_value(a) for a in domain.affinities}
    first, second, third = affinity.possible_values[:3]
    assert accepts(grammar, dumps({**base, affinity.name: [first, third]}))
    assert not accepts(grammar, dumps({**base, affinity.name: [third, first]}))  # out of order
    assert not accepts(grammar, dumps({**base, affinity.name: [first, first]}))  # repeated
    assert not accepts(grammar, dumps({**base, affinity.name: [first, second, third]}))  # over list_items
    assert not accepts(grammar, dumps({**base, affinity.name: []}))
    assert not accepts(grammar, dumps({**base, affinity.name: first}))  # a list is required


def test_open_values_are_bounded_strings_without_escapes():
    domain = next(d for d in load_schema(BUNDLED) if any(not a.closed for a in d.affinities))
    grammar = G.preferences_grammar(domain, LIMITS)
    base = {a.name: simple_value(a) for a in domain.affinities}
    name = next(a.name for a in domain.affinities if not a.closed)
    multi = next(a for a in domain.affinities if a.name == name).has_multiple_values

    def shaped(text):
        return {**base, name: [text] if multi else text}

    longest = " ".join(["x" * LIMITS.word_chars] * LIMITS.text_words)
    assert accepts(grammar, dumps(shaped(longest)))
    assert not accepts(grammar, dumps(shaped(longest + " x")))  # one word too many
    assert not accepts(grammar, dumps(shaped("x" * (LIMITS.word_chars + 1))))  # one word too long
    assert not accepts(grammar, dumps(shaped("")))
    assert not accepts(grammar, dumps(shaped(" leading space")))
    assert not accepts(grammar, dumps(shaped("two  spaces")))
    assert not accepts(grammar, dumps(shaped('a "quoted" word')))
    assert not accepts(grammar, dumps(base).replace(", ", ",  ", 1))  # no free whitespace


def test_interest_mask_keeps_at_least_the_minimum():
    domains = ["Alarm", "Movies", "Train"]
    grammar = G.interests_grammar(domains, 2)
    for bits in [(a, b, c) for a in (0, 1) for b in (0, 1) for c in (0, 1)]:
        text = dumps(dict(zip(domains, bits)))
        assert accepts(grammar, text) == (sum(bits) >= 2), bits
    assert G.parse_interests(dumps({"Alarm": 1, "Movies": 0, "Train": 1}), domains) == {
        "Alarm": 1,
        "Movies": 0,
        "Train": 1,
    }
    assert not accepts(grammar, dumps({"Movies": 1, "Alarm": 1, "Train": 1}))  # the schema's order


def test_single_domain_tasks():
    domain = load_schema(BUNDLED, ["Movies"])[0]
    grammar = G.sd_tasks_grammar(domain, 2, LIMITS)
    names = [a.name for a in domain.affinities]
    task = {
        "Task Description": "The user wants a film.",
        "User Intent": "Find a film you will like.",
        "Task Goal": "A film is chosen.",
        "Relevant Affinity Types": [names[0], names[2]],
    }
    text = dumps([task, {**task, "Relevant Affinity Types": [names[1]]}])
    assert accepts(grammar, text)
    assert G.parse_sd_tasks(text, domain, 2) == json.loads(text)
    assert not accepts(grammar, dumps([task]))  # exactly two tasks
    assert not accepts(grammar, dumps([task, {**task, "Relevant Affinity Types": ["Cuisine Preference"]}]))
    assert G.parse_sd_tasks(text[:-5], domain, 2) is None  # cut off


def md_xml(tasks) -> str:
    body = ""
    for description, by_domain in tasks:
        domains = "".join(
            f"<domain name={quoteattr(d)}>"
            + "".join(f"<affinity_type>{escape(t)}</affinity_type>" for t in types)
            + "</domain>"
            for d, types in by_domain
        )
        body += (
            f"<task>\n<task_description>{description}</task_description>\n<user_intent>Plan it.</user_intent>\n"
            f"<task_goal>It is planned.</task_goal>\n<relevant_domains>{domains}</relevant_domains>\n</task>\n"
        )
    return f"<response>\n{body}</response>"


def test_multi_domain_tasks_as_xml():
    domains = load_schema(BUNDLED)
    grammar = G.md_tasks_grammar(domains, 1, (2, 3), LIMITS)
    good = [
        (
            "A night out & dinner",
            [("Movies", ["Preferred Genres"]), ("Restaurants", ["Cuisine Preference", "Price Range"])],
        )
    ]
    text = md_xml(good).replace("&", "and")
    assert accepts(grammar, text)
    parsed = G.parse_md_tasks(text, domains, 1)
    assert parsed == [
        {
            "Task Description": "A night out and dinner",
            "User Intent": "Plan it.",
            "Task Goal": "It is planned.",
            "Relevant Domains": ["Movies", "Restaurants"],
            "Relevant Affinity Types": ["Preferred Genres", "Cuisine Preference", "Price Range"],
        }
    ]
    one_domain = [("Just a film", [("Movies", ["Preferred Genres"])])]
    four = [("Everything", [(d.name, [d.affinities[0].name]) for d in domains])]
    wrong_type = [("Mixed up", [("Movies", ["Cuisine Preference"]), ("Restaurants", ["Price Range"])])]
    reordered = [("Dinner first", [("Restaurants", ["Price Range"]), ("Movies", ["Preferred Genres"])])]
    for bad in (one_domain, four, wrong_type, reordered):
        assert not accepts(grammar, md_xml(bad)), bad
    assert not accepts(grammar, md_xml(good))  # '&' would need escaping: not allowed in text
    assert G.parse_md_tasks(text[:-12], domains, 1) is None


def test_situation_and_consistency_grammars():
    grammar = G.situation_grammar(LIMITS)
    situation = {
        "Location": "Home in Leeds",
        "Device": "Smart speaker",
        "Time of Day": "Evening",
        "Day of the Week": "Sunday",
        "Environment": "Quiet",
        "Justification": "Relaxing at home.",
    }
    assert accepts(grammar, dumps(situation))
    assert G.parse_situation(dumps(situation)) == situation
    assert not accepts(grammar, dumps({**situation, "Device": "Television"}))
    assert not accepts(grammar, dumps({**situation, "Day of the Week": "Someday"}))

    grammar = G.consistency_grammar(["Alarm", "Train"], LIMITS)
    verdict = {"Alarm": 0, "Train": 1, "Cross-domain": 0, "Explanation": "Trains at dawn, alarm at noon."}
    assert accepts(grammar, dumps(verdict))
    assert G.parse_consistency(dumps(verdict), ["Alarm", "Train"]) == verdict
    assert not accepts(grammar, dumps({**verdict, "Train": 2}))
    assert not accepts(grammar, dumps({k: v for k, v in verdict.items() if k != "Cross-domain"}))


def test_summary_grammar_bounds_plain_text():
    grammar = G.summary_grammar(LIMITS)
    assert accepts(grammar, "The user asks about films.\nOften on Fridays.")
    assert accepts(grammar, " ".join(["word"] * LIMITS.summary_words))
    assert not accepts(grammar, " ".join(["word"] * (LIMITS.summary_words + 1)))
    assert not accepts(grammar, "")


def test_schema_errors_name_the_file_and_field(tmp_path):
    bad = tmp_path / "schema.json"
    bad.write_text(
        json.dumps(
            [{"domain": "Alarm", "affinities": [{"name": "X", "is_categorical": "yes", "has_multiple_values": False}]}]
        )
    )
    with pytest.raises(SchemaError, match=r"schema.json: \[0\].affinities\[0\].is_categorical: expected bool"):
        load_schema(bad)
    bad.write_text(json.dumps([{"domain": "Cooking", "affinities": []}]))
    with pytest.raises(SchemaError, match="affinities: empty"):
        load_schema(bad)
    with pytest.raises(SchemaError, match=r"datagen.domains: \['Flights'\] not in"):
        load_schema(BUNDLED, ["Flights"])
