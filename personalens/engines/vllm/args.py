"""The vLLM engine arguments of a model config, in one place: an in-process engine passes them to
`vllm.LLM` (vllm/local.py) and a managed server gets the same as command-line flags (managed.py), so a
setting added here reaches both, and tests/test_managed_vllm.py checks that vLLM's own parser reads
the flags back into the same engine arguments."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from personalens.engines.models.config import ModelConfig


def engine_args(config: ModelConfig, model: str, dtype: str) -> dict[str, Any]:
    """vLLM's EngineArgs (the keyword arguments of `vllm.LLM`) for `config`, whose weights are at
    `model`, in `dtype` (auto already decided for this machine). None leaves vLLM's default."""
    args: dict[str, Any] = {
        "model": model,
        "tokenizer": config.tokenizer or model,
        "dtype": dtype,
        "tensor_parallel_size": config.tensor_parallel_size,
        "gpu_memory_utilization": config.gpu_memory_utilization,
        "kv_cache_memory_bytes": config.kv_cache_memory_bytes,
        "max_model_len": config.max_model_len,
        "enable_prefix_caching": config.enable_prefix_caching,
        "enforce_eager": config.enforce_eager,
        "enable_chunked_prefill": config.enable_chunked_prefill,
        "seed": config.seed,
        "max_num_seqs": config.max_num_seqs,
        "max_num_batched_tokens": config.max_num_batched_tokens,
        "block_size": config.block_size,
        "load_format": config.load_format,
        # grammars use xgrammar's EBNF dialect, so the backend is pinned rather than "auto"
        "structured_outputs_config": {"backend": "xgrammar"},
    }
    if config.kv_cache_dtype != "auto":  # only when set: a run without it passes what it did before
        args["kv_cache_dtype"] = config.kv_cache_dtype
    if config.quantization is not None:
        args["quantization"] = config.quantization
    if config.kv_offload_gib is not None:
        args |= {"kv_offloading_size": config.kv_offload_gib, "kv_offloading_backend": "native"}
    if config.reasoning_parser:
        # a grammar then applies once the thinking has ended (the judge's), and a server splits the
        # thinking into its `reasoning` field
        args["reasoning_parser"] = config.reasoning_parser
    if config.speculative:
        args["speculative_config"] = dict(config.speculative)
    if config.rope_scaling:
        args["hf_overrides"] = rope_overrides(dict(config.rope_scaling), model)
    return args


def rope_overrides(scaling: dict[str, Any], model: str) -> dict[str, Any]:
    """vLLM's hf_overrides that scale the model's RoPE: transformers 5 keeps the scaling and the base
    frequency together in `rope_parameters` (replaced whole by a mapping override, so the model's
    config.json's rope_theta goes with it) and reads a YaRN model's max_position_embeddings as the scaled
    length (vLLM 0.32 then applies no factor to it); earlier releases read `rope_scaling` beside
    rope_theta and scale the original positions themselves."""
    import transformers

    if int(transformers.__version__.split(".")[0]) < 5:
        return {"rope_scaling": scaling}
    found = Path(model) / "config.json"
    raw = json.loads(found.read_text()) if found.is_file() else {}
    theta = raw.get("rope_theta", (raw.get("rope_parameters") or {}).get("rope_theta"))
    out: dict[str, Any] = {"rope_parameters": {**({"rope_theta": theta} if theta is not None else {}), **scaling}}
    if "factor" in scaling and "original_max_position_embeddings" in scaling:
        out["max_position_embeddings"] = int(
            float(scaling["factor"]) * int(scaling["original_max_position_embeddings"])
        )
    return out


def cli_flags(args: Mapping[str, Any]) -> list[str]:
    """Engine arguments as vLLM's command-line flags: `--name value`, a boolean as `--name` or
    `--no-name`, a mapping of strings as `--name.key value`, any other as JSON (hf_overrides,
    speculative_config: vLLM's parser reads its values back with their types); None is
    left out (vLLM's default)."""
    flags: list[str] = []
    for name, value in args.items():
        flag = "--" + name.replace("_", "-")
        if value is None:
            continue
        if isinstance(value, bool):
            flags.append(flag if value else f"--no-{flag[2:]}")
        elif isinstance(value, Mapping) and not all(isinstance(inner, str) for inner in value.values()):
            flags += [flag, json.dumps(value)]
        elif isinstance(value, Mapping):
            flags += [a for key, inner in value.items() for a in (f"{flag}.{key}", str(inner))]
        else:
            flags += [flag, str(value)]
    return flags
