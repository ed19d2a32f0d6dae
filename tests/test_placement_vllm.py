"""The planner's KV sizes for the embedded model equal what vLLM allocates when it loads it (CPU)."""

import json

import pytest
from engine_fixtures import TINY_MODEL

from personalens.engines.embedded import embedded_model_dir
from personalens.engines.placement import DTYPE_BYTES, Architecture

pytestmark = pytest.mark.vllm


def test_kv_per_token_and_capacity_match_vllm(engine):
    arch = Architecture.from_config(json.loads((embedded_model_dir() / "config.json").read_text()))
    per_token = arch.kv_bytes_per_token(DTYPE_BYTES[engine.dtype.dtype])
    cache = engine._llm.llm_engine.vllm_config.cache_config
    vllm_tokens = cache.num_gpu_blocks * cache.block_size
    planned_tokens = TINY_MODEL.kv_cache_memory_bytes // per_token
    # vLLM rounds down to whole blocks: at most one block fewer than the planner's exact count
    assert vllm_tokens == pytest.approx(planned_tokens, rel=0.02)
    assert planned_tokens - cache.block_size < vllm_tokens <= planned_tokens
