"""How many dialogues `generate`'s lockstep keeps in flight (`lockstep.in_flight`): all of them, a
fixed number, or (auto) as many as the dialogue models' KV caches keep with every history cached,
by the rule `plan` models (engines/placement/inflight.py `window`), the rest waiting their turn.

The rule needs the tokens one dialogue keeps per role at its longest (its last prompt and reply of
that role). `plan` takes them from the dialogues it models; a run learns them from its own
dialogues: per role the mean over the finished dialogues' longest sequences, or over the running
ones' longest so far where that is larger (the first dialogues to end are the short ones). Before
any dialogue has ended it takes each role's `max_model_len`, which no dialogue outgrows, so the
first dialogues in flight keep their histories whatever they turn out to be (as many as the caches
keep, `held`, however few); from then on the window is `window`'s, which holds nothing back where
the caches keep too few for a useful batch. Dialogues in flight are never stopped: a smaller window
only admits fewer new ones."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from statistics import fmean

from personalens.engines.placement.inflight import Cache, held, window
from personalens.simulate.dialogue import Dialogue

AUTO = -1  # lockstep.in_flight: auto

MODEL_ROLES = {"user": "user_agent", "assistant": "assistant"}  # a turn's role -> the model role serving it


def longest(dialogue: Dialogue) -> dict[str, int]:
    """Per model role, the tokens the dialogue keeps in that role's cache at its longest so far."""
    out: dict[str, int] = {}
    for turn in dialogue.turns:
        role = MODEL_ROLES[turn.role]
        out[role] = max(out.get(role, 0), turn.prompt_tokens + turn.completion_tokens)
    return out


class Window:
    """The dialogues to keep in flight: `rule(tokens)` (None: all) with the tokens per role learned
    as the module says; before any dialogue has ended, `start(prior)` (default: `rule`)."""

    def __init__(
        self,
        rule: Callable[[Mapping[str, float]], int | None],
        prior: Mapping[str, float],
        start: Callable[[Mapping[str, float]], int | None] | None = None,
    ):
        self.rule, self.prior, self.start = rule, dict(prior), start or rule
        self.ended: dict[str, list[int]] = {}

    @classmethod
    def fixed(cls, size: int) -> Window:
        return cls(lambda tokens: size, {})

    def add(self, finished: Iterable[Dialogue]) -> None:
        """Learns from dialogues that ended (before their turns are released)."""
        for dialogue in finished:
            for role, tokens in longest(dialogue).items():
                self.ended.setdefault(role, []).append(tokens)

    def tokens(self, running: Iterable[Dialogue]) -> dict[str, float]:
        if not self.ended:
            return dict(self.prior)
        now: dict[str, list[int]] = {}
        for dialogue in running:
            for role, tokens in longest(dialogue).items():
                now.setdefault(role, []).append(tokens)
        return {
            role: max(fmean(self.ended.get(role) or [0]), fmean(now.get(role) or [0])) for role in {*self.ended, *now}
        }

    def size(self, running: Iterable[Dialogue]) -> int | None:
        return self.rule(self.tokens(running)) if self.ended else self.start(self.prior)


def lockstep_window(size: int, caches: Sequence[Cache], max_model_len: Mapping[str, int | None]) -> Window | None:
    """The window of `lockstep.in_flight` (`size`: 0 all, N, or AUTO), None for all. AUTO sizes it
    from the dialogue models' `caches` (none without GPUs: all in flight), with each turn role's
    engine's `max_model_len` before any dialogue has ended."""
    if size > 0:
        return Window.fixed(size)
    if size != AUTO or not caches:
        return None
    prior = {MODEL_ROLES[role]: float(n or 0) for role, n in max_model_len.items() if role in MODEL_ROLES}
    return Window(functools.partial(window, tuple(caches)), prior, functools.partial(held, tuple(caches)))
