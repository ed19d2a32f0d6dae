"""Output grammars (xgrammar EBNF, root rule `root`) of the build stages, derived from the schema, and
their parsers.

JSON is written compactly with fixed separators (no free whitespace, which a constrained small model
may repeat until it runs out of tokens); free text is bounded in length and may not hold the quote,
backslash or control characters that would need escaping. Lists of choices (categorical values,
affinity types, the domains of a multi-domain task) are distinct items in the schema's order, which
the grammar enforces by only ever offering items after the last one written.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from xml.sax.saxutils import escape, quoteattr

from personalens.data.records import SITUATION_KEYS
from personalens.data.schema import AffinityType, Domain
from personalens.engines.grammar import literal

# Figure 11's closed lists; Location is free text and Day of the Week a weekday.
SITUATION_CHOICES: dict[str, tuple[str, ...]] = {
    "Device": ("Smartphone", "Laptop", "Smart speaker", "Tablet", "Smartwatch"),
    "Time of Day": ("Morning", "Afternoon", "Evening", "Night"),
    "Day of the Week": ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"),
    "Environment": ("Quiet", "Noisy"),
}
JUSTIFICATION = "Justification"
CROSS_DOMAIN = "Cross-domain"
EXPLANATION = "Explanation"
# the task fields as task.jsonl spells them
TASK_TEXT_FIELDS = ("Task Description", "User Intent", "Task Goal")
AFFINITY_TYPES = "Relevant Affinity Types"
MD_TAGS = {"Task Description": "task_description", "User Intent": "user_intent", "Task Goal": "task_goal"}

_JSON_CHAR = '[^ "\\\\\\x00-\\x1f]'  # no quote, backslash or control character: nothing to escape
_XML_CHAR = "[^ <>&\\x00-\\x1f]"
_TEXT_CHAR = "[^ \\x00-\\x1f]"


@dataclass(frozen=True)
class Limits:
    """Bounds on free text and lists, so every complete output has a bounded length. Free text is
    counted in words (runs of non-space characters, one space or line break apart): a bound in
    characters compiles into a grammar state per character, slow to build for every vocabulary token."""

    text_words: int = 60  # one free-text field (a task description, an open preference)
    summary_words: int = 450  # an interaction summary (about 2,000 characters in the release)
    list_items: int = 3  # values of a multi-valued preference, affinity types of a task
    word_chars: int = 30


def _json(text: str) -> str:
    """An EBNF literal for the JSON string of `text`."""
    return literal(json.dumps(text, ensure_ascii=False))


def _words(char: str, words: int, limits: Limits, sep: str = '" "') -> str:
    """1..`words` words of characters of class `char` (which must exclude the space), `sep` apart."""
    word = f"{char}{{1,{limits.word_chars}}}"
    return f"{word} ({sep} {word}){{0,{words - 1}}}" if words > 1 else word


def json_string(limits: Limits) -> str:
    return f'"\\"" {_words(_JSON_CHAR, limits.text_words, limits)} "\\""'


def _choice(fragments: Sequence[str]) -> str:
    return "(" + " | ".join(fragments) + ")"


def ordered_subset(name: str, items: Sequence[str], lo: int, hi: int, sep: str) -> list[str]:
    """Rules where `name` matches lo..hi of the EBNF fragments `items`, each at most once and in
    their given order, separated by the EBNF fragment `sep`."""
    n = len(items)
    hi = min(hi, n)
    if not 1 <= lo <= hi:
        raise ValueError(f"{name}: cannot choose {lo}..{hi} of {n} items")
    rules: list[str] = []
    pending = []  # (last index, count so far) states whose rules are still to write
    seen = set()

    def step(i: int, count: int) -> str:
        state = (i, count)
        if state not in seen:
            seen.add(state)
            pending.append(state)
        return f"{items[i]} {name}_{i}_{count}"

    # a first item must leave enough later items to reach lo
    rules.append(f"{name} ::= " + " | ".join(step(i, 1) for i in range(n - lo + 1)))
    while pending:
        i, count = pending.pop()
        alternatives = ['""'] if count >= lo else []
        if count < hi:
            alternatives += [f"{sep} {step(j, count + 1)}" for j in range(i + 1, n) if n - j >= lo - count]
        rules.append(f"{name}_{i}_{count} ::= " + " | ".join(alternatives))
    return rules


def _json_object(rule: str, fields: Sequence[tuple[str, str]]) -> str:
    """`rule ::= {"k1": v1, "k2": v2}` with the EBNF value fragments in order."""
    body = ' ", " '.join(f'{_json(key)} ": " {value}' for key, value in fields)
    return f'{rule} ::= "{{" {body} "}}"'


# --------------------------------------------------------------------------- interests (Section 2.1)


def interests_grammar(domains: Sequence[str], minimum: int) -> str:
    """`{"Alarm": 0|1, ...}` over `domains` in order, with at least `minimum` ones (so that every user
    keeps some domains); a 0 is only offered while enough domains remain to reach the minimum."""
    n, minimum = len(domains), min(minimum, len(domains))
    rules = []
    for i, domain in enumerate(domains):
        # the rule that follows domain i once `count` ones have been chosen (none after the last)
        following = (lambda count, i=i: f'", " m{i + 1}_{count}') if i + 1 < n else (lambda count: "")
        for ones in range(minimum + 1):
            alternatives = [f'"1" {following(min(ones + 1, minimum))}']
            if n - i - 1 >= minimum - ones:
                alternatives.append(f'"0" {following(ones)}')
            rules.append(f'm{i}_{ones} ::= {_json(domain)} ": " ' + _choice(alternatives))
    return "\n".join(['root ::= "{" m0_0 "}"', *rules]) + "\n"


def parse_interests(text: str, domains: Sequence[str]) -> dict[str, int] | None:
    value = _loads(text)
    if not isinstance(value, dict) or list(value) != list(domains) or any(v not in (0, 1) for v in value.values()):
        return None
    return value


# ------------------------------------------------------------------------- preferences (Figure 6)


def preferences_grammar(domain: Domain, limits: Limits) -> str:
    """One JSON object with every affinity type of the domain, in schema order."""
    rules: list[str] = []
    fields = []
    for k, affinity in enumerate(domain.affinities):
        name = f"a{k}"
        rules += _affinity_rules(name, affinity, limits)
        fields.append((affinity.name, name))
    return "\n".join([_json_object("root", fields), *rules]) + "\n"


def _affinity_rules(name: str, affinity: AffinityType, limits: Limits) -> list[str]:
    if affinity.closed:
        values = [_json(v) for v in dict.fromkeys(affinity.possible_values)]  # the schema repeats some
        if not affinity.has_multiple_values:
            return [f"{name} ::= " + " | ".join(values)]
        return [
            f'{name} ::= "[" {name}_items "]"',
            *ordered_subset(f"{name}_items", values, 1, limits.list_items, '", "'),
        ]
    string = json_string(limits)
    if not affinity.has_multiple_values:
        return [f"{name} ::= {string}"]
    more = f'(", " {string}){{0,{limits.list_items - 1}}}' if limits.list_items > 1 else ""
    return [f'{name} ::= "[" {string} {more} "]"']


def parse_preferences(text: str, domain: Domain) -> dict[str, str | list[str]] | None:
    value = _loads(text)
    if not isinstance(value, dict) or list(value) != [a.name for a in domain.affinities]:
        return None
    for affinity in domain.affinities:
        item = value[affinity.name]
        shape = list if affinity.has_multiple_values else str
        if not isinstance(item, shape) or (shape is list and not all(isinstance(v, str) for v in item)):
            return None
    return value


# ---------------------------------------------------------------------- interactions (Figure 7)


def summary_grammar(limits: Limits) -> str:
    """Plain text of bounded length: words one space or line break apart."""
    text = _words(_TEXT_CHAR, limits.summary_words, limits, sep='(" " | "\\n")')
    return f"root ::= {text}\n"


def parse_summary(text: str) -> str | None:
    return text.strip() or None


# ------------------------------------------------------------------ single-domain tasks (Figure 9)


def sd_tasks_grammar(domain: Domain, count: int, limits: Limits) -> str:
    """A JSON list of exactly `count` tasks, each with the three texts and 1..list_items of the
    domain's affinity types."""
    string = json_string(limits)
    fields = [(key, string) for key in TASK_TEXT_FIELDS] + [(AFFINITY_TYPES, '"[" types "]"')]
    types = ordered_subset("types", [_json(a.name) for a in domain.affinities], 1, limits.list_items, '", "')
    more = f' (", " task){{{count - 1}}}' if count > 1 else ""
    return "\n".join([f'root ::= "[" task{more} "]"', _json_object("task", fields), *types]) + "\n"


def parse_sd_tasks(text: str, domain: Domain, count: int) -> list[dict] | None:
    value = _loads(text)
    keys = [*TASK_TEXT_FIELDS, AFFINITY_TYPES]
    names = {a.name for a in domain.affinities}
    if (
        not isinstance(value, list)
        or len(value) != count
        or any(not isinstance(t, dict) or list(t) != keys or not set(t[AFFINITY_TYPES]) <= names for t in value)
    ):
        return None
    return value


# ------------------------------------------------------------------- multi-domain tasks (Figure 10)


def md_tasks_grammar(domains: Sequence[Domain], count: int, span: tuple[int, int], limits: Limits) -> str:
    """`<response>` then exactly `count` <task> elements, then `</response>`. A task spans span[0]..span[1]
    distinct domains, each listed with 1..list_items of its own affinity types:

        <task>
        <task_description>...</task_description>
        <user_intent>...</user_intent>
        <task_goal>...</task_goal>
        <relevant_domains><domain name="Hotels"><affinity_type>...</affinity_type>...</domain>...</relevant_domains>
        </task>
    """
    text = _words(_XML_CHAR, limits.text_words, limits)
    rules = [
        'root ::= "<response>\\n" ' + " ".join(["task"] * count) + ' "</response>"',
        'task ::= "<task>\\n" '
        + " ".join(f'"<{tag}>" {text} "</{tag}>\\n"' for tag in MD_TAGS.values())
        + ' "<relevant_domains>" domains "</relevant_domains>\\n</task>\\n"',
    ]
    items = []
    for k, domain in enumerate(domains):
        types = [literal(f"<affinity_type>{escape(a.name)}</affinity_type>") for a in domain.affinities]
        rules += ordered_subset(f"d{k}_types", types, 1, limits.list_items, '""')
        items.append(f'{literal(f"<domain name={quoteattr(domain.name)}>")} d{k}_types "</domain>"')
    rules += ordered_subset("domains", items, span[0], span[1], '""')
    return "\n".join(rules) + "\n"


def parse_md_tasks(text: str, domains: Sequence[Domain], count: int) -> list[dict] | None:
    """The tasks as task.jsonl spells them (without the number), or None when malformed or cut off."""
    try:
        root = ET.fromstring(text.strip())
    except ET.ParseError:
        return None
    by_name = {d.name: {a.name for a in d.affinities} for d in domains}
    tasks = []
    for element in root.findall("task"):
        texts = {key: (element.findtext(tag) or "").strip() for key, tag in MD_TAGS.items()}
        chosen = element.findall("relevant_domains/domain")
        names = [d.get("name") for d in chosen]
        types = [(d.get("name"), t.text or "") for d in chosen for t in d.findall("affinity_type")]
        if (
            not all(texts.values())
            or len(names) < 2
            or any(n not in by_name for n in names)
            or any(t not in by_name[n] for n, t in types)
        ):
            return None
        tasks.append({**texts, "Relevant Domains": names, AFFINITY_TYPES: list(dict.fromkeys(t for _, t in types))})
    return tasks if len(tasks) == count else None


# ------------------------------------------------------------------------- situations (Figure 11)


def situation_grammar(limits: Limits) -> str:
    string = json_string(limits)
    fields = [
        (key, " | ".join(_json(v) for v in SITUATION_CHOICES[key]) if key in SITUATION_CHOICES else string)
        for key in SITUATION_KEYS
    ]
    fields = [(key, f"({value})") for key, value in fields] + [(JUSTIFICATION, string)]
    return _json_object("root", fields) + "\n"


def parse_situation(text: str) -> dict[str, str] | None:
    value = _loads(text)
    if not isinstance(value, dict) or list(value) != [*SITUATION_KEYS, JUSTIFICATION]:
        return None
    return value


# ------------------------------------------------------------------- profile consistency (Figure 21)


def consistency_grammar(domains: Sequence[str], limits: Limits) -> str:
    """A 0/1 conflict label per domain, one across domains, then the explanation (labels first, so an
    output cut short still carries them)."""
    fields = [(d, '("0" | "1")') for d in [*domains, CROSS_DOMAIN]] + [(EXPLANATION, json_string(limits))]
    return _json_object("root", fields) + "\n"


def parse_consistency(text: str, domains: Sequence[str]) -> dict[str, Any] | None:
    value = _loads(text)
    if not isinstance(value, dict) or list(value) != [*domains, CROSS_DOMAIN, EXPLANATION]:
        return None
    return value


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None
