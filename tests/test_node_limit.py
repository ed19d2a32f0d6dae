"""The node's limit (plan/limit.py), pure: the least time any layout could take, from the bytes each
decode step reads and the FLOPs each token costs at the node's peak figures, counted by hand here for a
Qwen2.5-72B (its published config) user agent on 8 H100s, in bf16 and with fp8 weights."""

import json
from pathlib import Path

import pytest

from personalens.engines.placement.architecture import Architecture
from personalens.engines.placement.sizing import ModelNeed
from personalens.plan.engine_model import Turn
from personalens.plan.gpu_model import GPUS
from personalens.plan.limit import node_limit

ARCH = Architecture.from_config(
    json.loads((Path(__file__).parent / "fixtures/architectures/qwen25_72b.json").read_text())
)
# 256 dialogues of 8 user-agent turns: 4,000-token prompts of which 3,800 repeat the last, 500 shared, 200-token replies
WORK = [[[Turn("user", 4000, 3800, 200, 500)] * 8] * 256]
TOKENS, STEPS = 256 * 8 * 200, 256 * 8 * 200 / 256  # generated; decode steps of 256 sequences


def _need(weights: float, quantization: str | None = None) -> ModelNeed:
    return ModelNeed("72b", ("user_agent",), ARCH, int(weights), 2, tp=4, kv_value_bytes=1, quantization=quantization)


def test_the_limit_is_each_models_larger_floor_at_the_nodes_peak_figures():
    bf16 = ARCH.parameters() * 2
    limit = node_limit([_need(bf16)], WORK, GPUS["h100"], 8)
    kv_read = 256 * 8 * (200 * 4000 + 200 * 199 / 2) * ARCH.kv_bytes_per_token(1)  # fp8 KV: one byte a value
    m = limit["models"]["72b"]
    assert m["bytes_read"] == pytest.approx(STEPS * bf16 + kv_read)
    assert m["flops"] == pytest.approx(2 * ARCH.parameters() * (TOKENS + 256 * 8 * 200))  # 200 prompt tokens uncached
    assert m["memory_s"] == pytest.approx(m["bytes_read"] / (8 * 3.35e12))
    assert m["compute_s"] == pytest.approx(m["flops"] / (8 * 989e12))
    assert (
        limit["seconds"] == max(m["memory_s"], m["compute_s"]) == m["memory_s"]
    )  # decoding reads, it does not compute
    fp8 = node_limit([_need(bf16 * 0.52, "fp8")], WORK, GPUS["h100"], 8)["models"]["72b"]
    assert fp8["bytes_read"] == pytest.approx(m["bytes_read"] - STEPS * bf16 * 0.48)  # the weights' half saved
    assert fp8["compute_s"] == pytest.approx(m["compute_s"] * 989 / 1979)  # at the FP8 rate
    # a model with no turns in the work is not counted
    assert set(
        node_limit([_need(bf16), ModelNeed("8b", ("assistant",), ARCH, 1, 2)], WORK, GPUS["h100"], 8)["models"]
    ) == {"72b"}
