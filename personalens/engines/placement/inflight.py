"""How many dialogues an engine keeps in flight so that their histories stay in its KV cache, pure.

In lockstep each turn's prompt repeats the dialogue's history. vLLM's prefix cache serves that part
again only while the history's blocks are still cached; once the dialogues in flight hold more
tokens than the cache, each turn evicts histories that the next turn computes again, at a cost that
grows with the square of the turns. Keeping no more dialogues in flight than the cache holds, and
letting the rest of a shard's dialogues wait their turn, keeps every history cached.

`dialogues_in_flight` is for one engine; `in_flight` for a layout's dialogue models (the user
agent's and the assistant's), each over all its copies (a copy takes its share of the dialogues).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from personalens.engines.placement.layout import Placement

DIALOGUE_ROLES = ("user_agent", "assistant")  # the roles every turn of a dialogue waits on


def dialogues_in_flight(kv_tokens: int, tokens_per_dialogue: float, max_num_seqs: int) -> int:
    """The most dialogues one engine keeps in flight with every one's history still in its KV cache:
    its cache (tokens of every layer) over the tokens one dialogue keeps there at its longest (per
    role the engine serves, its last prompt and reply), at least 1 and at most `max_num_seqs` (vLLM
    runs no more at once)."""
    if tokens_per_dialogue <= 0:
        return max_num_seqs
    return max(1, min(max_num_seqs, int(kv_tokens // tokens_per_dialogue)))


def in_flight(placements: Sequence[Placement], tokens: Mapping[str, float]) -> int | None:
    """The most dialogues a layout keeps in flight with every history cached: the least over its
    dialogue models of `dialogues_in_flight` times its engines (its own and its copies). `tokens` is
    per role the tokens one dialogue keeps in that role's cache at its longest. None where no
    dialogue model was planned (no GPU: nothing is sized)."""
    limits = []
    for p in placements:
        served = [role for role in p.roles if role in DIALOGUE_ROLES]
        if not served or not p.planned:
            continue
        per_dialogue = sum(tokens.get(role, 0.0) for role in served)
        limits.append((1 + len(p.copies)) * dialogues_in_flight(p.kv_tokens, per_dialogue, p.run_config.max_num_seqs))
    return min(limits) if limits else None
