"""One simulated dialogue and the protocol rules, as a small state machine.

The user agent opens; then each round is an assistant reply and a user reply. A user reply with
TERMINATE ends the dialogue after one more assistant reply (the word is removed from the stored
text). Otherwise the dialogue stops after `max_rounds` assistant replies. TERMINATE in the opening
message is not an ending (the paper's prompt forbids it there): it is kept and recorded.

`EndRules` holds what the fidelity options (conf/fidelity/) set differently: how TERMINATE is
recognised and removed (the paper's word, or the released code's substring test and removal), and
whether the user agent still answers the last capped assistant reply, as the released code does
(its TERMINATE there then earns one more assistant reply, `max_rounds` + 1 in all).

Three endings come from the engines rather than the protocol (neither the paper nor the released code
meets them, docs/fidelity.md): "context", when the next prompt no longer leaves room for a reply
inside the model's context (the turns so far are kept and judged); "thinking", when a reasoning
model's reply stopped inside its thinking (cut at max_tokens before any answer): the reply is never
taken as an answer, and the dialogue is kept and judged on the turns before it, as on context; and
"failed", when the engine refused a request of the dialogue for another reason (kept with the
message, not judged).

A turn's `text` is the answer alone: the engines split a reasoning model's thinking off
(engines/chat/reasoning.py), and it is kept beside the answer in `reasoning`, never in any prompt."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from personalens.data.records import Role, Scenario, Turn

TERMINATE = "TERMINATE"
_TERMINATE_RE = re.compile(r"[ \t]*'?\bTERMINATE\b'?[ \t]*")

Ending = Literal["terminated", "max_rounds", "context", "thinking", "failed"]  # store.ENDINGS
DialogueKey = tuple[str, str, str, int]  # (user_id, task_id, setting, trial)


@dataclass(frozen=True)
class TurnRecord:
    role: Role
    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str | None = None  # "stop", or "length": the reply was cut at its max_tokens
    reasoning: str = ""  # a reasoning model's thinking before this answer (never sent to anyone)
    reasoning_tokens: int | None = 0  # its tokens, of completion_tokens; None: seen but not counted


def strip_terminate(text: str) -> str:
    return _TERMINATE_RE.sub(" ", text).strip()


@dataclass(frozen=True)
class EndRules:
    terminate: Literal["word", "substring"] = "word"
    reply_after_cap: bool = False

    def __post_init__(self) -> None:
        if self.terminate not in ("word", "substring"):
            raise ValueError(f"terminate must be 'word' or 'substring', got {self.terminate!r}")

    def says_terminate(self, text: str) -> bool:
        if self.terminate == "substring":
            return TERMINATE in text
        return _TERMINATE_RE.search(text) is not None

    def without_terminate(self, text: str) -> str:
        if self.terminate == "substring":
            return text.replace(TERMINATE, "").strip()
        return strip_terminate(text)


@dataclass
class Dialogue:
    scenario: Scenario
    setting: str
    trial: int
    seed: int
    max_rounds: int
    rules: EndRules = EndRules()
    turns: list[TurnRecord] = field(default_factory=list)
    ended: Ending | None = None
    error: str | None = None  # why the engine refused its last request ("failed", some "context"), or
    # which reply stopped inside its thinking ("thinking")
    opening_terminate: bool = False
    stopped: TurnRecord | None = None  # a reply that stopped inside its thinking: no text, its thinking kept
    terminating: bool = False  # the user said TERMINATE; one assistant reply is still due
    started: float | None = None
    finished: float | None = None

    @property
    def key(self) -> DialogueKey:
        return (self.scenario.user.user_id, self.scenario.task.task_id, self.setting, self.trial)

    @property
    def rounds(self) -> int:
        return sum(t.role == "assistant" for t in self.turns)

    @property
    def waiting_on(self) -> Role | None:
        """Whose reply the dialogue needs next; None once it has ended."""
        if self.ended is not None:
            return None
        if not self.turns or self.turns[-1].role == "assistant":
            return "user"
        return "assistant"

    def history(self) -> list[Turn]:
        return [Turn(t.role, t.text) for t in self.turns]

    def turn_seed(self) -> int:
        """Seed for the next generation: distinct per turn, reproducible per dialogue."""
        return (self.seed + 7919 * len(self.turns)) % (2**31)

    def add(
        self,
        role: Role,
        text: str,
        prompt_tokens: int,
        completion_tokens: int,
        now: float,
        finish_reason: str | None = None,
        reasoning: str = "",
        reasoning_tokens: int | None = 0,
    ) -> None:
        said = role == "user" and self.rules.says_terminate(text)
        if said and self.turns:  # kept in the opening, which it does not end
            text = self.rules.without_terminate(text)
        turn = TurnRecord(role, text, prompt_tokens, completion_tokens, finish_reason, reasoning, reasoning_tokens)
        self._append(turn, said, now)
        if self.started is None:
            self.started = now

    def resume(self, stored: Sequence[tuple[TurnRecord, bool]], now: float) -> None:
        """Replays turns a stopped run stored (each with whether it said TERMINATE, which its text no
        longer holds), so that the dialogue goes on where it stood; one that they end ends at `now`."""
        for turn, said in stored:
            self._append(turn, said, now)

    def said_terminate(self, index: int) -> bool:
        """Whether turn `index` was a user reply that said TERMINATE: the opening, or the user reply
        that made the dialogue end after one more assistant reply (always its last user reply)."""
        if index == 0:
            return self.opening_terminate
        if not self.terminating:
            return False
        return index == max(i for i, t in enumerate(self.turns) if t.role == "user")

    def _append(self, turn: TurnRecord, said_terminate: bool, now: float) -> None:
        if turn.role != self.waiting_on:
            raise ValueError(f"dialogue {self.key} is waiting on {self.waiting_on}, got a {turn.role} reply")
        opening = not self.turns
        if turn.role == "user":
            if opening:
                self.opening_terminate = said_terminate
            elif said_terminate:
                self.terminating = True
        self.turns.append(turn)
        capped = self.rounds >= self.max_rounds and not self.terminating
        if turn.role == "assistant" and self.terminating:
            self._end("terminated", now)
        elif capped and not opening and turn.role == ("user" if self.rules.reply_after_cap else "assistant"):
            self._end("max_rounds", now)

    def out_of_context(self, now: float, error: str | None = None) -> None:
        """The next prompt does not leave room for a reply: the dialogue ends with what it has."""
        self.error = error
        self._end("context", now)

    def stopped_in_thinking(self, reply: TurnRecord, now: float) -> None:
        """A reply stopped inside its thinking: no answer, the dialogue ends with what it has; the reply is
        kept on record (`stopped`), never a turn (never sent on nor judged)."""
        if reply.role != self.waiting_on:
            raise ValueError(f"dialogue {self.key} is waiting on {self.waiting_on}, got a {reply.role} reply")
        self.error = (
            f"the {reply.role}'s reply stopped inside its thinking after {reply.completion_tokens} tokens, "
            "before any answer"
        )
        self.stopped = reply
        self._end("thinking", now)

    def fail(self, error: str, now: float) -> None:
        """The engine refused the dialogue's next request."""
        self.error = error
        self._end("failed", now)

    def _end(self, how: Ending, now: float) -> None:
        if self.started is None:
            self.started = now
        self.ended = how
        self.finished = now
