"""How many dialogues lockstep keeps in flight so that their histories stay in the KV caches, pure.

In lockstep each turn's prompt repeats the dialogue's history. vLLM's prefix cache serves that part
again only while the history's blocks are still cached; once the dialogues in flight hold more
tokens than the cache, each turn evicts histories that the next turn computes again, at a cost that
grows with the square of the turns. Keeping no more dialogues in flight than the cache holds, and
letting the rest of a shard's dialogues wait their turn, keeps every history cached. KV offloaded
to host memory (kv_offload_gib) counts with the GPU's: a history there is reloaded, not computed.

`held` is how many the caches keep; `window` is what a run holds back to, over the dialogue models'
`Cache`s: `plan` applies it to the dialogues it models (plan/throughput.py), `generate` to the
dialogues it runs (simulate/window.py), both with the caches of the same layout (`caches`).
`dialogues_in_flight` is one engine's share. A cache that keeps fewer than `MIN_BATCH_SHARE` of an
engine's `max_num_seqs` holds nothing back: an engine decoding so small a batch idles most of its
width, which the saved prefill rarely pays back (`plan` on 8 x 80 GB at the paper protocol's cap: 11
dialogues in flight model 24% slower than all; on 4 x 80 GB, 1 dialogue 45% slower; the complete
release's 96 of 256, 1.6x faster: docs/cluster.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from personalens.engines.placement.placed import Placement

DIALOGUE_ROLES = ("user_agent", "assistant")  # the roles every turn of a dialogue waits on
MIN_BATCH_SHARE = 0.25  # defined: of max_num_seqs: a window below it on any engine holds nothing back


@dataclass(frozen=True)
class Cache:
    """One model's engines as the window sees them."""

    roles: tuple[str, ...]  # the roles the model serves
    kv_tokens: int  # one engine's KV cache, tokens of every layer
    max_num_seqs: int  # requests one engine runs at once
    engines: int = 1  # its own engine and its copies, each taking its share of the dialogues
    host_tokens: int = 0  # one engine's KV offloaded to host memory (kv_offload_gib), reloaded, not prefilled


def dialogues_in_flight(kv_tokens: int, tokens_per_dialogue: float, max_num_seqs: int) -> int:
    """The most dialogues one engine keeps in flight with every one's history still in its KV cache:
    its cache (tokens of every layer) over the tokens one dialogue keeps there at its longest (per
    role the engine serves, its last prompt and reply), at least 1 and at most `max_num_seqs` (vLLM
    runs no more at once)."""
    if tokens_per_dialogue <= 0:
        return max_num_seqs
    return max(1, min(max_num_seqs, int(kv_tokens // tokens_per_dialogue)))


def _per_engine(caches: Sequence[Cache], tokens: Mapping[str, float]) -> list[tuple[Cache, int]]:
    out = []
    for cache in caches:
        served = [role for role in cache.roles if role in DIALOGUE_ROLES]
        if served:
            per_dialogue = sum(tokens.get(role, 0.0) for role in served)
            kept = cache.kv_tokens + cache.host_tokens
            out.append((cache, dialogues_in_flight(kept, per_dialogue, cache.max_num_seqs)))
    return out


def held(caches: Sequence[Cache], tokens: Mapping[str, float]) -> int | None:
    """The most dialogues in flight with every history cached: the least over the dialogue models of
    `dialogues_in_flight` times the model's engines. `tokens` is per role the tokens one dialogue
    keeps in that role's cache at its longest. None where no dialogue model's cache is known."""
    limits = [cache.engines * n for cache, n in _per_engine(caches, tokens)]
    return min(limits) if limits else None


def window(caches: Sequence[Cache], tokens: Mapping[str, float]) -> int | None:
    """`held`, or None (every dialogue in flight) where an engine would keep fewer than
    `MIN_BATCH_SHARE` of its `max_num_seqs`."""
    if any(n < MIN_BATCH_SHARE * cache.max_num_seqs for cache, n in _per_engine(caches, tokens)):
        return None
    return held(caches, tokens)


def caches(placements: Sequence[Placement]) -> tuple[Cache, ...]:
    """The caches of a layout's planned models (none where nothing was planned: no GPU)."""
    return tuple(
        Cache(p.roles, p.kv_tokens, p.run_config.max_num_seqs, 1 + len(p.copies), p.host_kv_tokens)
        for p in placements
        if p.planned
    )


def in_flight(placements: Sequence[Placement], tokens: Mapping[str, float]) -> int | None:
    """`held` over a layout's planned models."""
    return held(caches(placements), tokens)


def run_window(placements: Sequence[Placement], tokens: Mapping[str, float]) -> int | None:
    """`window` over a layout's planned models: what lockstep.in_flight=auto holds back to."""
    return window(caches(placements), tokens)
