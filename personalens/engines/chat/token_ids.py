"""Prompts as token ids, made the way vLLM's chat path makes them: the model's chat template rendered
to text (with the generation prompt), then tokenized without added special tokens.

`PromptIds` keeps one prompt per dialogue and role as ids, so that when the dialogue grows only the
changed part is tokenized again (a dialogue's first prompt starts from the first prompt of its group,
e.g. its role, which shares the system prompt and fixed instructions). The new text is cut at the
last place before the change where a space sits between two letters, and again at the first such
place after it, inside the text both prompts end with (the released user-agent prompt puts fixed
instructions after the conversation). Byte-level BPE (GPT-2, Llama 3, SmolLM2) and SentencePiece
(Mistral, Llama 2) tokenizers never join a letter with the following " word" into one token, so the
ids before the first cut and after the second stay what they were, and the text between tokenizes
alone (behind a one-letter guard, so that it is not taken for the start of a text). The first
splices of each tokenizer, and one in `verify_every` after that, are checked against a full
tokenization; on a mismatch that tokenizer falls back to full tokenization for the rest of the run,
with a warning. docs/performance.md has the rule, its checks and its fallbacks.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from personalens.engines.base import Message
from personalens.engines.chat.dates import strftime_now
from personalens.engines.chat.messages import format_messages, resolve_system_role
from personalens.engines.models.config import ModelConfig

log = logging.getLogger(__name__)

_GUARD = "a"  # a letter before the tail, so the tail's " word" tokenizes as it does mid-text
_BLOCK = 4096  # characters compared at a time when looking for where two prompts differ
_SUB_BATCH = 256  # prompts tokenized at a time


class ChatTokenizer:
    """A model's chat template and tokenizer, as vLLM's `LLM.chat` applies them."""

    def __init__(self, tokenizer: Any, system_role: bool, template_kwargs: dict[str, Any] | None = None):
        self.tokenizer = tokenizer
        self.system_role = system_role
        self.template_kwargs = dict(template_kwargs or {})  # the model's chat_template_kwargs

    @classmethod
    def load(cls, config: ModelConfig) -> ChatTokenizer:
        """The tokenizer of a model config from its local directory (the embedded model's when
        `path` is null); loads no model and imports no vLLM."""
        from transformers import AutoTokenizer

        from personalens.engines.models.embedded import model_path

        tokenizer = AutoTokenizer.from_pretrained(os.path.expanduser(config.tokenizer or model_path(config)))
        return cls(tokenizer, resolve_system_role(config.system_role, tokenizer.chat_template), config.template_kwargs)

    @classmethod
    def from_files(cls, config: ModelConfig) -> ChatTokenizer:
        """The same from the tokenizer's files, without transformers (or torch): for counting tokens."""
        from personalens.engines.chat.template_files import TokenizerFiles
        from personalens.engines.models.embedded import model_path

        files = TokenizerFiles(Path(config.tokenizer or model_path(config)).expanduser())
        return cls(files, resolve_system_role(config.system_role, files.chat_template), config.template_kwargs)

    def render(self, messages: Sequence[Message]) -> str:
        return self.tokenizer.apply_chat_template(
            format_messages(messages, self.system_role),
            tokenize=False,
            add_generation_prompt=True,
            strftime_now=strftime_now,  # the run's date (engines/chat/dates.py)
            **self.template_kwargs,
        )

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of each text, in one batched call (fast tokenizers encode a batch in parallel)."""
        if not texts:
            return []
        return self.tokenizer(list(texts), add_special_tokens=False)["input_ids"]

    def encode_ends(self, texts: Sequence[str]) -> list[tuple[list[int], np.ndarray]]:
        """Token ids of each text with the character offset where each token ends."""
        if not texts:
            return []
        out = self.tokenizer(list(texts), add_special_tokens=False, return_offsets_mapping=True)
        return [
            (ids, np.array([end for _, end in spans], np.int64).reshape(-1))
            for ids, spans in zip(out["input_ids"], out["offset_mapping"])
        ]

    def encode_chat(self, messages: Sequence[Message]) -> list[int]:
        return self.encode([self.render(messages)])[0]

    def encode_chats(self, conversations: Sequence[Sequence[Message]]) -> list[list[int]]:
        return self.encode([self.render(m) for m in conversations])


@dataclass
class _Prompt:
    """One prompt as ids, with what the next cut needs: the text from `head` on, a hash of the text
    before it (memory: a dialogue's prompt is kept as ids, not text, up to where it last changed), and
    the character end of every token from `first` on (the next cuts fall after the last change).

    The ids are a list, as the engine takes them, of ints shared by every prompt (PromptIds._shared):
    a new prompt copies references (8 bytes a token), where making the engine's list from an array
    would make a new int object per token, each turn, which costs as much as the prompt is long."""

    ids: list[int]
    ends: np.ndarray
    tail: str
    head: int = 0
    head_hash: int = 0
    first: int = 0

    @property
    def length(self) -> int:
        return self.head + len(self.tail)

    def text_matches(self, text: str) -> bool:
        return self.head == 0 or (len(text) >= self.head and hash(text[: self.head]) == self.head_hash)

    def token_ending_at(self, position: int) -> int | None:
        """The index in `ends` of the token that ends at `position`, if one does."""
        i = int(np.searchsorted(self.ends, position, side="right"))
        return i - 1 if i > 0 and self.ends[i - 1] == position else None


@dataclass(frozen=True)
class _Plan:
    """How to make a prompt: tokenize `text[left:right]`, keep the old prompt's first `keep` ids and
    its ids from its `first` + `reuse`-th on (`reuse` None: none after the middle; `old` None:
    tokenize the text whole)."""

    left: int
    right: int
    keep: int = 0
    reuse: int | None = None
    old: _Prompt | None = None


def common_prefix(a: Sequence, b: Sequence) -> int:
    """The length of the longest common prefix of `a` and `b` (texts or token ids), compared block by block."""
    n = min(len(a), len(b))
    lo = 0
    while lo < n and a[lo : lo + _BLOCK] == b[lo : lo + _BLOCK]:
        lo += _BLOCK
    hi = min(lo + _BLOCK, n)
    while lo < hi:  # a[:lo] == b[:lo]; find the first difference in [lo, hi)
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return min(lo, n)


def common_suffix(a: str, b: str, limit: int) -> int:
    """The length of the longest common suffix of `a` and `b`, at most `limit`."""
    n = min(len(a), len(b), limit)
    lo = 0  # a[len(a) - lo:] == b[len(b) - lo:]
    while lo < n and a[len(a) - min(lo + _BLOCK, n) : len(a) - lo] == b[len(b) - min(lo + _BLOCK, n) : len(b) - lo]:
        lo = min(lo + _BLOCK, n)
    hi = min(lo + _BLOCK, n)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[len(a) - mid : len(a) - lo] == b[len(b) - mid : len(b) - lo]:
            lo = mid
        else:
            hi = mid - 1
    return lo


@dataclass
class SpliceStats:
    prompts: int = 0  # prompts made
    spliced: int = 0  # made from an earlier prompt's ids and a tokenized middle
    reused_ends: int = 0  # of them, those that kept the earlier prompt's ids after the middle too
    full: int = 0  # tokenized whole (first prompts, and where no cut was found)
    tokenized: int = 0  # tokens tokenized (middles and whole prompts)
    checked: int = 0  # splices compared with a full tokenization
    mismatches: int = 0


@dataclass
class PromptIds:
    """The prompts of many dialogues, kept per (dialogue key, role) between turns."""

    tokenizer: ChatTokenizer
    verify_first: int = 64  # splices checked against a full tokenization at the start
    verify_every: int = 1000  # then one in this many
    stats: SpliceStats = field(default_factory=SpliceStats)
    _prompts: dict = field(default_factory=dict)
    _firsts: dict = field(default_factory=dict)  # group -> the first prompt tokenized whole
    _ints: dict = field(default_factory=dict)  # one int object per token id, shared by all prompts
    _incremental: bool = True

    def ids(self, keyed: Sequence[tuple[object, object, Sequence[Message]]]) -> list[list[int]]:
        """Token ids of each (key, group, messages) prompt, made from the key's previous prompt, or
        for a new key from its group's first prompt. The lists are the kept ones: read, never change."""
        result = []
        for start in range(0, len(keyed), _SUB_BATCH):  # bounds the tokenizer's per-token output objects
            result += self._ids(keyed[start : start + _SUB_BATCH])
        return result

    def _ids(self, keyed: Sequence[tuple[object, object, Sequence[Message]]]) -> list[list[int]]:
        texts = [self.tokenizer.render(messages) for _, _, messages in keyed]
        # a group's first prompt is tokenized whole before the rest of the call is planned, so that
        # the call's other new dialogues (in lockstep: all of them, at the start) start from it
        for (key, group, _), text in zip(keyed, texts):
            if group not in self._firsts and key not in self._prompts and self._incremental:
                ((ids, ends),) = self.tokenizer.encode_ends([text])
                self._firsts[group] = _Prompt(self._shared(ids), ends, text)
                self.stats.tokenized += len(ids)
        plans = [self._plan(key, group, text) for (key, group, _), text in zip(keyed, texts)]
        middles = [
            text[p.left : p.right] if p.old is None else _GUARD + text[p.left : p.right]
            for p, text in zip(plans, texts)
        ]
        result = []
        for (key, _, _), text, plan, encoded in zip(keyed, texts, plans, self.tokenizer.encode_ends(middles)):
            self.stats.tokenized += len(encoded[0])
            if plan.old is not None and not self._incremental:  # a mismatch earlier in this call
                plan, encoded = _Plan(0, len(text)), self.tokenizer.encode_ends([text])[0]
            prompt = self._made(plan, text, *encoded)
            self.stats.prompts += 1
            self._prompts[key] = prompt
            result.append(prompt.ids)  # shared with the kept prompt: never changed in place
        return result

    def _shared(self, ids: Sequence[int]) -> list[int]:
        ints = self._ints.setdefault
        return [ints(i, i) for i in ids]

    def _made(self, plan: _Plan, text: str, ids: list[int], ends: np.ndarray) -> _Prompt:
        old = plan.old
        if old is None:
            self.stats.full += 1
            return _Prompt(self._shared(ids), ends, text)
        skip = int(np.searchsorted(ends, len(_GUARD), side="right"))  # the guard's own token(s)
        made, tail_ends = old.ids[: plan.keep] + self._shared(ids[skip:]), [ends[skip:] + (plan.left - len(_GUARD))]
        if plan.reuse is not None:
            made += old.ids[old.first + plan.reuse :]
            tail_ends.append(old.ends[plan.reuse :] + (len(text) - old.length))
            self.stats.reused_ends += 1
        prompt = _Prompt(
            made,
            np.concatenate(tail_ends),
            text[plan.left :],
            plan.left,
            hash(text[: plan.left]),
            plan.keep,
        )
        self.stats.spliced += 1
        if self._should_check():
            self._check(prompt, text)
        return prompt

    def forget(self, keys: Sequence[object]) -> None:
        """Drop the prompts of these keys (a finished dialogue's roles)."""
        for key in keys:
            self._prompts.pop(key, None)

    def _plan(self, key: object, group: object, text: str) -> _Plan:
        whole = _Plan(0, len(text))
        old = self._prompts.get(key) or self._firsts.get(group)
        if old is None or not self._incremental or not old.text_matches(text):
            return whole
        rest = text[old.head :]
        same = common_prefix(old.tail, rest)
        differ = old.head + same
        left = _last_cut(text, max(old.head, int(old.ends[0]) if len(old.ends) else 0), differ)
        i = None if left is None else old.token_ending_at(left)
        if i is None:
            return whole  # no cut, or no token of the earlier prompt ends there: tokenize it whole
        # the text both end with, not overlapping what they start with; the right cut lies inside it
        # with the letter before it, and an earlier token must end there too
        suffix = common_suffix(old.tail, rest, min(len(old.tail), len(rest)) - same)
        right = _first_cut(text, len(text) - suffix + 1, len(text))
        reuse = None if right is None else old.token_ending_at(right - len(text) + old.length)
        if reuse is None:
            right = len(text)
        return _Plan(left, right, old.first + i + 1, None if reuse is None else reuse + 1, old)

    def _should_check(self) -> bool:
        n = self.stats.spliced
        return n <= self.verify_first or (self.verify_every > 0 and n % self.verify_every == 0)

    def _check(self, prompt: _Prompt, text: str) -> None:
        self.stats.checked += 1
        (full,) = self.tokenizer.encode([text])
        if full != prompt.ids:
            self.stats.mismatches += 1
            self._incremental = False
            log.warning(
                "incremental prompt tokenization differs from a full tokenization for this tokenizer; "
                "tokenizing every prompt whole from now on (exact, slower)"
            )
            prompt.ids = self._shared(full)


def _last_cut(text: str, start: int, stop: int) -> int | None:
    """The last position from `start` where a space sits between two letters (Unicode letters, the
    tokenizers' \\p{L}), all three in text[:stop]; searched backwards, as it is usually near `stop`."""
    space = text.rfind(" ", max(start, 1), stop - 1)
    while space > 0:
        if text[space - 1].isalpha() and text[space + 1].isalpha():
            return space
        space = text.rfind(" ", max(start, 1), space)
    return None


def _first_cut(text: str, start: int, stop: int) -> int | None:
    """The first position from `start` where a space sits between two letters, all three in
    text[start - 1 : stop]."""
    space = text.find(" ", max(start, 1), stop - 1)
    while space > 0:
        if text[space - 1].isalpha() and text[space + 1].isalpha():
            return space
        space = text.find(" ", space + 1, stop - 1)
    return None
