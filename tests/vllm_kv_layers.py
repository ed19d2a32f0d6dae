"""What vLLM allocates per layer for a model directory: started with random weights (load_format dummy,
no tokenizer), each attention layer's KV bytes per token and the tokens it keeps (its sliding window
or attention chunk), printed as JSON after `KV LAYERS ` (vLLM logs to stdout too), one line per
model directory, all in one process (vLLM is imported once). Run as a script by
tests/test_placement_vllm.py:

    python tests/vllm_kv_layers.py DTYPE:DIR [DTYPE:DIR ...]
"""

import json
import os
import re
import sys


def layers(path: str, dtype: str) -> dict[int, dict]:
    from vllm import LLM
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    llm = LLM(
        model=path,
        skip_tokenizer_init=True,
        load_format="dummy",
        dtype=dtype,
        enforce_eager=True,
        max_model_len=512,
        max_num_seqs=4,
        max_num_batched_tokens=512,
        kv_cache_memory_bytes=64 * 2**20,
        limit_mm_per_prompt={"image": 0},
    )
    # the engine core runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0): its scheduler's KV-cache
    # config lists every group of layers with the spec it was allocated by
    config = llm.llm_engine.engine_core.engine_core.scheduler.kv_cache_config
    out = {}
    for group in config.kv_cache_groups:
        spec = group.kv_cache_spec
        kept = getattr(spec, "sliding_window", None) or getattr(spec, "attention_chunk_size", None)
        for name in group.layer_names:
            index = int(re.search(r"layers\.(\d+)\.", name)[1])
            out[index] = {"bytes_per_token": spec.page_size_bytes // spec.block_size, "kept": kept}
    del llm
    cleanup_dist_env_and_memory()  # so that the next model starts in this process
    return out


if __name__ == "__main__":
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    for arg in sys.argv[1:]:
        dtype, path = arg.split(":", 1)
        print("KV LAYERS " + json.dumps({"path": path, "layers": layers(path, dtype)}), flush=True)
