"""An fp8 KV cache on the real vLLM CPU build (it runs one on x86 with AVX-512 or AMX): the embedded
model's engine with kv_cache_dtype fp8 is started with it, holds twice the tokens in the same KV
memory as the session's bf16 engine, and answers under a grammar."""

import dataclasses

import pytest
from engine_fixtures import TINY_MODEL, chat, tagged_grammar

from personalens.engines.dtype import read_cpu_flags, vllm_is_cpu_build
from personalens.engines.vllm.kv import CPU_FP8_FLAGS, kv_refusal

pytestmark = pytest.mark.vllm


@pytest.mark.skipif(
    not (vllm_is_cpu_build() and CPU_FP8_FLAGS & read_cpu_flags()), reason="vLLM's CPU build with AVX-512 or AMX"
)
def test_an_fp8_kv_cache_holds_twice_the_tokens_and_answers(engine):
    from personalens.engines.vllm.local import VllmEngine

    config = dataclasses.replace(TINY_MODEL, kv_cache_dtype="fp8")
    assert kv_refusal(config, gpus=None, cpu_build=True, cpu_flags=read_cpu_flags()) is None  # the real release
    fp8 = VllmEngine(config)
    try:
        assert fp8._llm.llm_engine.vllm_config.cache_config.cache_dtype == "fp8"
        assert fp8.kv_tokens == 2 * engine.kv_tokens  # the same kv_cache_memory_bytes
        out = fp8.generate(
            [chat(f"List fruits, number {i}.", grammar=tagged_grammar(i), max_tokens=12) for i in range(3)]
        )
    finally:
        fp8.close()
    assert [g.text.startswith(f"Item {i}:") for i, g in enumerate(out)] == [True] * 3
    assert all(g.completion_tokens > 0 and g.error is None for g in out)
