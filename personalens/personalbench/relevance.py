"""Stage 3 baselines: which attributes a retrieval method selects for a prompt, without a model."""

from __future__ import annotations

import re
from typing import Sequence

from rank_bm25 import BM25Okapi


def tokens(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


def bm25_scores(prompt: str, statements: Sequence[str]) -> list[float]:
    """BM25 (Okapi) score of each attribute statement, the statements of one user being the corpus."""
    if not statements:
        return []
    return [float(s) for s in BM25Okapi([tokens(s) or [""] for s in statements]).get_scores(tokens(prompt))]


def top_k(scores: Sequence[float], k: int) -> list[bool]:
    """The k best-scoring items with a positive score are selected (ties: the earlier item)."""
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    chosen = {i for i in order[:k] if scores[i] > 0}
    return [i in chosen for i in range(len(scores))]
