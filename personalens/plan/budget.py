"""The token budget of a run, pure: from what a dialogue's prompts hold before any dialogue text
(rendered and counted, prompt_tokens.py) and how long dialogues get and what each turn adds (the
protocol's cap, or measured by a finished run, calibration.py).

A dialogue alternates user-agent and assistant turns, the user agent first. Turn t's prompt is its
role's fixed part (the user agent's opening prompt at t = 1, its later prompt, or the assistant's)
plus `history` tokens for each earlier turn (the turn's text and its chat markup or label). The judge
sees the conversation as text: each of its prompts is a fixed part per dimension and speaker plus
`history` tokens per turn judged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

PER_SPEAKER_ROLES = ("user", "assistant")  # turn roles, the user agent first


@dataclass(frozen=True)
class Fixed:
    """Mean prompt tokens of one kind's dialogues before any dialogue text, per prompt."""

    user_first: float  # the user agent's opening prompt (its whole first-turn prompt)
    user_next: float  # its later prompts, with one empty exchange
    assistant: float  # the assistant's prompt, with one empty user turn
    judge: Mapping[str, float]  # "dimension/speaker" -> the judge's prompt with one empty exchange
    # "user" | "assistant" | "judge" -> the tokens its prompts begin with that the same user's other
    # dialogues' prompts begin with too (instructions, the profile): prefix-cache hits while any of them runs
    shared: Mapping[str, float] = field(default_factory=dict)
    # "user_first" | "user" | "assistant" -> the tokens at the end of that prompt that its role's next
    # prompt does not begin with (instructions after the conversation): not prefix-cache hits
    tail: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Turns:
    """How long dialogues get and what each turn adds."""

    counts: Mapping[int, float]  # turns in a dialogue -> share of dialogues
    reply: Mapping[str, float]  # "user" | "assistant" -> tokens per reply
    history: float  # prompt tokens an earlier turn adds to a later prompt
    source: str
    # "user" | "assistant" -> its replies' lengths over their mean at `SPREAD` evenly spaced
    # quantiles, as a calibration run measured them; a role without: every reply the mean
    spread: Mapping[str, tuple[float, ...]] = field(default_factory=dict)


SPREAD = 16  # defined: quantiles of a role's reply lengths that a calibrated Turns keeps


def spread(replies: Sequence[float]) -> tuple[float, ...]:
    """`replies`' lengths over their mean at the midpoints of `SPREAD` equal shares of them, sorted
    (empty for no reply or a mean of 0)."""
    mean = sum(replies) / len(replies) if replies else 0.0
    if not mean:
        return ()
    ordered = sorted(replies)
    return tuple(ordered[int((i + 0.5) * len(ordered) / SPREAD)] / mean for i in range(SPREAD))


@dataclass(frozen=True)
class PerDialogue:
    """Expected tokens of one dialogue, and of its judgments."""

    turns: float
    prompt: float
    generated: float
    judgments: float
    judge_prompt: float
    judge_generated: float

    def scaled(self, n: float) -> PerDialogue:
        return PerDialogue(*(n * v for v in vars(self).values()))

    def plus(self, other: PerDialogue) -> PerDialogue:
        return PerDialogue(*(a + b for a, b in zip(vars(self).values(), vars(other).values())))


ZERO = PerDialogue(0, 0, 0, 0, 0, 0)


@dataclass(frozen=True)
class Workload:
    """What a run's dialogues and judgments ask of the engines, per kind of dialogue."""

    fixed: Mapping[str, Fixed]
    turns: Mapping[str, Turns]
    judge_reply: float  # tokens per judge reply
    judged: Sequence[str]  # the judge's prompts per dialogue ("dimension/speaker")
    turn_level: bool
    source: str  # "at the protocol's cap" | "calibrated"


def turns_at_cap(max_rounds: int, reply_after_cap: bool) -> int:
    """The most turns a dialogue can have (simulate/dialogue.py's rules): `max_rounds` assistant
    replies after as many user turns; where the user agent still answers the last capped reply, a
    TERMINATE there earns one more assistant reply."""
    return 2 * max_rounds + (2 if reply_after_cap else 0)


def cap_turns(
    max_turns: int, reply_tokens: Mapping[str, int], history_tokens: Mapping[str, int] | None = None
) -> Turns:
    """Every dialogue at the protocol's cap, every reply at its max_tokens (an upper bound on turns and
    generated tokens; the prompt tokens are an estimate, as the chat markup per turn is not counted);
    a turn adds its `history_tokens` to later prompts (a reply's answer, without the thinking its
    template drops; default: the whole reply)."""
    kept = reply_tokens if history_tokens is None else history_tokens
    history = sum(kept.values()) / len(kept)
    return Turns({max_turns: 1.0}, dict(reply_tokens), history, "the protocol's cap")


def role_of(turn: int) -> str:
    """The role of turn `turn` (1-based)."""
    return PER_SPEAKER_ROLES[(turn - 1) % 2]


def turn_prompts(fixed: Fixed, n: int, history: float) -> list[tuple[str, float]]:
    """The role and prompt tokens of each of a dialogue's `n` turns."""
    out = []
    for t in range(1, n + 1):
        own = fixed.user_first if t == 1 else fixed.user_next if role_of(t) == "user" else fixed.assistant
        out.append((role_of(t), own + history * (t - 1)))
    return out


def judge_prompts(fixed: Fixed, n: int, history: float, judged: Sequence[str], turn_level: bool) -> list[float]:
    """The prompt tokens of the judge's prompts of one dialogue of `n` turns: one per "dimension/speaker"
    in `judged`, and with `turn_level` a personalization judgment of the dialogue cut after each
    assistant reply."""
    out = [fixed.judge[j] + history * n for j in judged]
    if turn_level:
        out += [fixed.judge["personalization/"] + history * 2 * k for k in range(1, n // 2 + 1)]
    return out


def per_dialogue(
    fixed: Fixed, turns: Turns, judge_reply: float, judged: Sequence[str], turn_level: bool
) -> PerDialogue:
    """Expected tokens of one dialogue of this kind and of its judgments (judge_prompts)."""
    total = ZERO
    for n, share in turns.counts.items():
        prompts = turn_prompts(fixed, n, turns.history)
        judge = judge_prompts(fixed, n, turns.history, judged, turn_level)
        one = PerDialogue(
            n,
            sum(p for _, p in prompts),
            sum(turns.reply[role] for role, _ in prompts),
            len(judge),
            sum(judge),
            judge_reply * len(judge),
        )
        total = total.plus(one.scaled(share))
    return total


def longest_prompts(fixed: Fixed, turns: Turns) -> dict[str, float]:
    """The longest prompt of a dialogue's turns and of its judge's, over the dialogue lengths."""
    n = max(turns.counts)
    last_user = n if role_of(n) == "user" else n - 1
    return {
        "dialogue": max(fixed.user_next + turns.history * (last_user - 1), fixed.assistant + turns.history * (n - 1)),
        "judge": max(fixed.judge.values()) + turns.history * n,
    }


def fit_history(prompts: Sequence[tuple[int, float, float]]) -> float | None:
    """Tokens an earlier turn adds to a prompt, from measured turns (turn number t >= 2, the prompt's
    tokens, its fixed part): the ratio of the summed growth to the summed earlier turns."""
    earlier = sum(t - 1 for t, _, _ in prompts)
    if not earlier:
        return None
    return sum(measured - fixed for _, measured, fixed in prompts) / earlier
