"""What vLLM allocates per layer for a model directory: started with random weights (load_format dummy,
no tokenizer), each attention layer's KV bytes per token and the tokens it keeps (its sliding window
or attention chunk), printed as JSON. Run as a script by tests/test_placement_vllm.py, one model
directory after another in one process:

    python tests/vllm_kv_layers.py DTYPE DIR [DIR ...]
"""

import json
import os
import re
import sys


def layers(path: str, dtype: str) -> dict[int, dict]:
    from vllm import LLM

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
    try:
        [specs] = llm.collective_rpc("get_kv_cache_spec")
    finally:
        del llm
    out = {}
    for name, spec in specs.items():
        index = int(re.search(r"layers\.(\d+)\.", name)[1])
        kept = getattr(spec, "sliding_window", None) or getattr(spec, "attention_chunk_size", None)
        out[index] = {"bytes_per_token": spec.page_size_bytes // spec.block_size, "kept": kept}
    return out


if __name__ == "__main__":
    # the specs come back through vLLM's engine-core socket; torch dtypes in them need pickle
    os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
    dtype, *paths = sys.argv[1:]
    print(json.dumps({path: layers(path, dtype) for path in paths}))
