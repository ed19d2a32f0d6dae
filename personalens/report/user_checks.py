"""Rule-based checks of the simulated user: pure functions over one dialogue's turns and the text of
the user agent's prompt, each naming a failure that counts against the assistant although the user
agent made it (docs/validation.md, "Checks of the simulated user", states the rules and thresholds).

- `role_break`: a user turn speaks as the assistant: it carries an assistant label at the start of a
  line (the model wrote the assistant's side of the transcript), offers help in the assistant's
  words ("How can I help you?", "I'd be happy to help", "anything else I can do"), calls itself an
  AI or assistant, or repeats the assistant's reply just before it.
- `leak`: a user turn quotes its prompt: a span of at least `LEAK_WORDS` consecutive words of the
  prompt's instructions (its templates with every value left out) or of the profile shown to it
  (demographics, preferences, past interactions, situation), or a markup tag of its instructions
  (`<user_profile>`, `<query>`: the released prompts' sections). The task is left out: saying what it
  wants is the user's job, and its own words for it are the task's.
- `early_terminate`: the opening message says TERMINATE, before the assistant said anything (both
  prompt sets forbid it there; the run's fidelity option decided whether it said it: a whole word
  under `paper`, a substring under `official`, as `generate` recorded in `opening_terminate`).
- `repeated`: a user turn of at least `REPEAT_MIN_WORDS` words nearly the same as an earlier user
  turn of the dialogue (a similarity of words of at least `REPEAT_SIMILARITY`): a loop.
- `empty`: a user turn with no word in it, except the last user turn of a dialogue that ended on
  TERMINATE, which said only that word (removed from the stored text).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from difflib import SequenceMatcher

from personalens.data.records import Turn
from personalens.store.replies import words

# each rule and how the report names it, in the report's order
RULE_NAMES = {
    "role_break": "role break",
    "leak": "prompt leak",
    "early_terminate": "TERMINATE before the assistant",
    "repeated": "repeated turn",
    "empty": "empty turn",
}
RULES = tuple(RULE_NAMES)

LEAK_WORDS = 8  # consecutive words of the prompt that make a leak
REPEAT_SIMILARITY = 0.9  # difflib's ratio over the words of two turns
REPEAT_MIN_WORDS = 4  # shorter turns ("Yes, please.") may recur in a sound dialogue

_TAG = re.compile(r"<+/?([A-Za-z_][A-Za-z0-9_-]*)>+")
# an assistant label opening a line: "ASSISTANT:", "[ASSISTANT]:", "Assistant :" (both prompt sets' transcripts)
_LABEL = re.compile(r"^[ \t*]*\[?assistant\]?[ \t]*:", re.IGNORECASE | re.MULTILINE)
_ASSISTANT_VOICE = re.compile(
    "|".join(
        (
            r"\bhow (?:can|may|could|might) I (?:help|assist)\b",
            r"\bwhat can I (?:help|assist|do for) you\b",
            r"\bI(?:'m| am|'d be| would be|'ll be| will be)(?: always| more than| very| so| incredibly)? "
            r"(?:happy|glad|delighted|pleased|excited|eager|ready) to (?:help|assist)\b",
            r"(?:^|[.!?]\s+)(?:happy|glad) to (?:help|assist)\b",
            r"\bI(?:'m| am) here to (?:help|assist)\b",
            r"\banything else I can (?:help|assist|do)\b",
            r"\bas an? (?:AI|language model|virtual assistant|AI assistant)\b",
            r"\bI(?:'m| am) (?:your|an? (?:AI|virtual|digital|helpful|personal|[\w-]+ writing|travel|booking)) "
            r"assistant\b",
            r"\blet me know if (?:you need|there(?:'s| is)) anything else\b",
        )
    ),
    re.IGNORECASE,
)


@dataclass(frozen=True)
class PromptSpans:
    """What the user agent's prompt showed it, as the runs of `LEAK_WORDS` consecutive words of its
    instructions and of its profile (the instructions' set is shared by every dialogue of a run)."""

    instruction: frozenset[tuple[str, ...]]
    profile: frozenset[tuple[str, ...]]
    tags: frozenset[str] = frozenset()  # the names of the markup tags of its instructions (<user_profile>, ...)

    def __contains__(self, span: object) -> bool:
        return span in self.instruction or span in self.profile


def spans_of(text: str, n: int = LEAK_WORDS) -> frozenset[tuple[str, ...]]:
    """Every run of `n` consecutive words of `text`."""
    return frozenset(ngrams(words(text), n))


def tags_of(text: str) -> frozenset[str]:
    """The names of the markup tags in `text` (`<query>`, `</user_profile>`, `<<query>>`), lower-cased."""
    return frozenset(name.lower() for name in _TAG.findall(text))


def ngrams(tokens: Sequence[str], n: int) -> list[tuple[str, ...]]:
    return [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]


def similarity(a: Sequence[str], b: Sequence[str]) -> float:
    return SequenceMatcher(None, a, b, autojunk=False).ratio()


def _user_turns(turns: Sequence[Turn]) -> list[tuple[int, Turn]]:
    return [(i, t) for i, t in enumerate(turns) if t.role == "user"]


def role_break(turns: Sequence[Turn]) -> bool:
    for i, turn in _user_turns(turns):
        if _LABEL.search(turn.text) or _ASSISTANT_VOICE.search(turn.text):
            return True
        if i > 0 and _near(words(turn.text), words(turns[i - 1].text)):
            return True  # the assistant's reply said back
    return False


def leak(turns: Sequence[Turn], prompt: PromptSpans) -> bool:
    return any(
        any(g in prompt for g in ngrams(words(turn.text), LEAK_WORDS)) or tags_of(turn.text) & prompt.tags
        for _, turn in _user_turns(turns)
    )


def repeated(turns: Sequence[Turn]) -> bool:
    said = [words(t.text) for _, t in _user_turns(turns)]
    return any(_near(later, earlier) for k, later in enumerate(said) for earlier in said[:k])


def empty(turns: Sequence[Turn], ended: str | None) -> bool:
    users = _user_turns(turns)
    if ended == "terminated" and users:
        users = users[:-1]  # the last user turn said TERMINATE, removed from its text
    return any(not words(t.text) for _, t in users)


def _near(a: Sequence[str], b: Sequence[str]) -> bool:
    return min(len(a), len(b)) >= REPEAT_MIN_WORDS and similarity(a, b) >= REPEAT_SIMILARITY


def check(
    turns: Sequence[Turn], *, ended: str | None, opening_terminate: bool, prompt: PromptSpans | None
) -> frozenset[str]:
    """The rules of `RULES` the dialogue breaks; `leak` is not checked without the prompt's text."""
    broken = {
        "role_break": role_break(turns),
        "leak": prompt is not None and leak(turns, prompt),
        "early_terminate": opening_terminate,
        "repeated": repeated(turns),
        "empty": empty(turns, ended),
    }
    return frozenset(rule for rule, hit in broken.items() if hit)
