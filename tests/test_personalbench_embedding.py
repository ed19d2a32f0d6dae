"""The embedding-similarity baseline of relevance selection: the selection rule and cosine scores on
hand-made vectors, the metrics of its selections against hand-made human labels, and the bundled
sentence-embedding model (all-MiniLM-L6-v2 on vLLM's pooling runner) against a reference computed
here with transformers (mean pooling over the tokens, then unit length)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from personalens.personalbench import metrics as M
from personalens.personalbench.relevance import Rule, cosine_scores, select
from personalens.tables.stats import Bootstrap

BOOT = Bootstrap(resamples=50, seed=0)


def test_selection_rule_top_k_above_the_threshold_ties_to_the_earlier_item():
    scores = [0.1, 0.5, 0.3, 0.5, -0.2]
    assert select(scores, Rule(2)) == [False, True, False, True, False]
    assert select(scores, Rule(3)) == [False, True, True, True, False]
    assert select(scores, Rule(1)) == [False, True, False, False, False]  # a tie: the earlier item
    assert select(scores, Rule(0, above=0.2)) == [False, True, True, True, False]  # 0: no cap
    assert select(scores, Rule(10, above=0.3)) == [False, True, False, True, False]  # strictly above
    assert select([0.0, -1.0], Rule(2)) == [False, False] and select([], Rule(2)) == []


def test_cosine_scores_do_not_assume_unit_vectors():
    prompt = [3.0, 4.0, 0.0]
    statements = [[6.0, 8.0, 0.0], [0.0, 0.0, 2.0], [-4.0, 3.0, 0.0], [1.0, 0.0, 0.0]]
    assert cosine_scores(prompt, statements) == pytest.approx([1.0, 0.0, 0.0, 3 / 5])
    assert cosine_scores(prompt, []) == []


def test_embedding_selections_scored_against_the_human_majority():
    # one prompt, six attributes: hand-made 2-d embeddings at known angles from the prompt's
    angles = [0, 20, 50, 80, 100, 170]  # degrees
    vectors = [[math.cos(math.radians(a)), math.sin(math.radians(a))] for a in angles]
    scores = cosine_scores([2.0, 0.0], vectors)
    chosen = select(scores, Rule(top_k=3, above=0.5))  # cos 50 deg = 0.64 > 0.5, cos 80 deg = 0.17
    assert chosen == [True, True, True, False, False, False]
    humans = {"a": [1, 0, 0, 1, 0, 0], "b": [1, 0, 0, 1, 0, 1], "c": [1, 1, 0, 0, 0, 0]}
    gold = [1, 0, 0, 1, 0, 0]  # two of three
    out = M.relevance(
        {k: dict(enumerate(map(bool, v))) for k, v in humans.items()}, {"embedding": dict(enumerate(chosen))}, BOOT
    )["embedding"]
    tp = sum(c and g for c, g in zip(chosen, gold))  # 1: only the first
    precision, recall = tp / sum(chosen), tp / sum(gold)
    assert out["precision"].mean == pytest.approx(1 / 3) == pytest.approx(precision)
    assert out["recall"].mean == pytest.approx(1 / 2) == pytest.approx(recall)
    assert out["F1"].mean == pytest.approx(2 * precision * recall / (precision + recall))
    assert out["over-retrieval ratio"].mean == pytest.approx((3 / 6) / (2 / 6))
    assert out["selection rate"].mean == pytest.approx(1 / 2)


TEXTS = [
    "I love hiking in the mountains on weekends.",
    "Suggest a trail for a weekend walk.",
    "My cat has been sick all week.",
    "What is a good recipe for vegetarian lasagna?",
    "word " * 600,
]  # longer than the model's window: cut to it, not refused


def reference(texts: list[str]) -> np.ndarray:
    """all-MiniLM-L6-v2 as sentence-transformers defines it: mean of the token embeddings (padding
    masked out, at most 256 tokens), then unit length; float32 on the CPU."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    from personalens.engines.vllm.embedding import bundled_model_dir

    path = bundled_model_dir()
    tokenizer, model = AutoTokenizer.from_pretrained(path), AutoModel.from_pretrained(path).eval()
    batch = tokenizer(texts, padding=True, truncation=True, max_length=256, return_tensors="pt")
    with torch.no_grad():
        tokens = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).float()
    pooled = (tokens * mask).sum(1) / mask.sum(1)
    return torch.nn.functional.normalize(pooled, dim=1).numpy()


@pytest.mark.vllm
def test_bundled_model_on_vllm_matches_mean_pooling_reference(embedder):
    got = np.array(embedder.embed(TEXTS))
    assert embedder.name == "all-MiniLM-L6-v2" and got.shape == (len(TEXTS), 384)
    assert np.linalg.norm(got, axis=1) == pytest.approx(np.ones(len(TEXTS)), abs=1e-3)
    ref = reference(TEXTS)
    # vLLM may run bfloat16 on this CPU: the same direction, not the same digits
    assert (np.sum(got * ref, axis=1) > 0.99).all(), np.sum(got * ref, axis=1)
    similarity = got @ got.T
    assert similarity[0, 1] > max(similarity[0, 2], similarity[1, 2])  # hiking ~ trail, not a sick cat
    assert embedder.embed([]) == []
