"""Stage 3 baselines: which attributes a retrieval method selects for a prompt, without a model."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from rank_bm25 import BM25Okapi


@dataclass(frozen=True)
class Rule:
    """Select the `top_k` best-scoring attributes (0: no cap) whose score is above `above`."""

    top_k: int
    above: float = 0.0


def tokens(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


def bm25_scores(prompt: str, statements: Sequence[str]) -> list[float]:
    """BM25 (Okapi) score of each attribute statement, the statements of one user being the corpus."""
    if not statements:
        return []
    return [float(s) for s in BM25Okapi([tokens(s) or [""] for s in statements]).get_scores(tokens(prompt))]


def cosine_scores(prompt: Sequence[float], statements: Sequence[Sequence[float]]) -> list[float]:
    """Cosine similarity of the prompt's embedding with each statement's (any model: not assumed unit length)."""
    if not statements:
        return []
    p, s = np.asarray(prompt, dtype=float), np.asarray(statements, dtype=float)
    return [float(x) for x in s @ p / (np.linalg.norm(s, axis=1) * np.linalg.norm(p))]


def select(scores: Sequence[float], rule: Rule) -> list[bool]:
    """The items `rule` selects (ties: the earlier item)."""
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    chosen = {i for i in (order[: rule.top_k] if rule.top_k > 0 else order) if scores[i] > rule.above}
    return [i in chosen for i in range(len(scores))]
