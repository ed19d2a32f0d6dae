"""The leak check by content: a reasoning model's stored thinking searched, as runs of `SPAN`
characters, in the texts its dialogue sent on afterwards (report/endings.py's thinking table).

Every prompt sent to another party, and every judge transcript, is made of the dialogue's answers
(the turns' `text`) around fixed instructions and the user's data, so a run of a turn's thinking
that reached another party or the judge is in a later turn's text. A turn's thinking counts as found
when one of its own runs, one that is in no text of the dialogue up to and including its own answer
(the thinking quotes what it read, and drafts the answer it gives), is in the text of a later turn.
Runs are compared after whitespace is collapsed, as 64-bit polynomial hashes of every run, computed
with numpy on the whole text at once (a run has thousands of dialogues of tens of turns each)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

SPAN = 40  # characters: longer than the phrases two texts share by chance ("I think the user wants")

_MOD_BITS = 64
_BASE = 0x100000001B3  # odd, so it has an inverse modulo 2**64
_INVERSE = pow(_BASE, -1, 1 << _MOD_BITS)
_EMPTY = np.zeros(0, np.uint64)


def _powers(base: int, n: int) -> np.ndarray:
    """base**0 .. base**(n - 1) modulo 2**64 (numpy's unsigned products wrap)."""
    return np.concatenate(([np.uint64(1)], np.cumprod(np.full(n - 1, base, np.uint64)))) if n else _EMPTY


def span_hashes(text: str) -> np.ndarray:
    """The hash of every SPAN-character run of `text`, in order, whitespace collapsed:
    sum(c[j] * BASE**(SPAN - 1 - k)) over the run's characters c[j], k = 0..SPAN-1, modulo 2**64,
    made from prefix sums of c[j] * BASE**-j."""
    collapsed = " ".join(text.split())
    n = len(collapsed)
    if n < SPAN:
        return _EMPTY
    codes = np.frombuffer(collapsed.encode("utf-32-le"), np.uint32).astype(np.uint64)
    prefix = np.concatenate(([np.uint64(0)], np.cumsum(codes * _powers(_INVERSE, n))))
    windows = prefix[SPAN:] - prefix[:-SPAN]  # sum over j in [i, i + SPAN) of c[j] * BASE**-j
    return windows * _powers(_BASE, n)[SPAN - 1 :]


def thinking_found(turns: Sequence[tuple[str, str]]) -> tuple[bool, ...]:
    """Per turn of a dialogue, given as (text, thinking) in order: whether a run of its thinking of
    its own (in no text up to and including the turn's own) is in the text of a later turn, i.e.
    whether a run of its thinking first appears in the dialogue's texts after its own turn."""
    if not any(len(thinking) >= SPAN for _, thinking in turns):
        return tuple(False for _ in turns)
    texts = [span_hashes(text) for text, _ in turns]
    every = np.concatenate(texts)
    turn = np.repeat(np.arange(len(texts)), [len(t) for t in texts])
    distinct, first = np.unique(every, return_index=True)  # the first place of each run, in turn order
    first_turn = turn[first]
    found = []
    for i, (_, thinking) in enumerate(turns):
        own = span_hashes(thinking)
        at = np.minimum(np.searchsorted(distinct, own), max(len(distinct) - 1, 0))
        hit = distinct[at] == own if len(distinct) else np.zeros(len(own), bool)
        found.append(bool((first_turn[at[hit]] > i).any()))
    return tuple(found)
