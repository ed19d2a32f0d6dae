"""What one model needs of a GPU, and how a GPU's memory is split among the models on it. Pure but
for `model_need`, which reads a model's directory.

A model holds per GPU its weights (divided by tensor parallelism), an overhead, a bound on its
activations and its KV cache. Each model's memory share (`gpu_memory_utilization`) is its own: it
bounds what that model holds on each of its GPUs, and a GPU holds at most the largest share of the
models on it, so a small model's share never caps a GPU it does not use. On a GPU several models
share, the free memory is split so that every model holds as many tokens (a share in proportion to
its KV bytes per token), none below one sequence of its max_model_len (vLLM refuses to start
otherwise) nor above its own share; an explicit `kv_cache_memory_bytes` is given as it is. vLLM's
own profiling would count an engine loaded earlier as its own use, so every engine gets an explicit
KV cache.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from personalens.engines.models.config import ModelConfig
from personalens.engines.models.embedded import model_path
from personalens.engines.placement.architecture import DTYPE_BYTES, Architecture, dtype_bytes
from personalens.engines.placement.gpus import GIB
from personalens.errors import PersonalensError

# assumed: vLLM's max_num_batched_tokens when none is set (read in its source): its largest default for
# GPUs under 160 GB (the offline LLM class on an H100/H200; A100s and servers default lower), so a bound
# for all of them
DEFAULT_BATCHED_TOKENS = 16_384


def weights_bytes(
    model_dir: Path, arch: Architecture, dtype_bytes: int, quantization: str | None = None
) -> tuple[int, str]:
    """The weights' size in memory when run in a `dtype_bytes` dtype, and where it came from: the
    safetensors index, else the files (both scaled from the checkpoint's own dtype: float32 on a
    bfloat16 checkpoint takes twice its files), else config.json's parameter count (a quantized one's
    by its method where the config gives it). Quantized checkpoints are taken at their size on disk;
    an unquantized one that vLLM quantizes to fp8 as it loads it (`quantization` fp8) at its fp8 share."""
    size, source = _stored_bytes(model_dir, arch, dtype_bytes)
    if quantization != "fp8" or arch.quantized:
        return size, source
    return int(size * arch.online_fp8_share(dtype_bytes)), f"{source}, linear layers quantized to fp8 on loading"


def _stored_bytes(model_dir: Path, arch: Architecture, dtype_bytes: int) -> tuple[int, str]:
    index = model_dir / "model.safetensors.index.json"
    files = sorted(model_dir.glob("*.safetensors"))
    total = json.loads(index.read_text()).get("metadata", {}).get("total_size") if index.is_file() else None
    if total:
        size, source = int(total), f"{index.name} total_size"
    elif files:
        size, source = sum(f.stat().st_size for f in files), f"{len(files)} safetensors file(s)"
    elif (quantized := arch.quantized_bytes(dtype_bytes)) is not None:
        return quantized, f"estimated from config.json's parameter count, {arch.quantization} weights"
    else:
        return arch.parameters() * dtype_bytes, "estimated from config.json's parameter count"
    stored = DTYPE_BYTES.get(arch.checkpoint_dtype or "")
    if arch.quantized or stored is None or stored == dtype_bytes:
        return size, source
    return size * dtype_bytes // stored, f"{source}, {arch.checkpoint_dtype} on disk x {dtype_bytes}/{stored}"


def batched_tokens(configured: int | None, chunked_prefill: bool | None, max_model_len: int | None) -> int:
    """The tokens of vLLM's largest forward pass: max_num_batched_tokens as set, else its default,
    which covers a whole max_model_len prompt when chunked prefill is off."""
    if configured is not None:
        return configured
    if chunked_prefill is False and max_model_len:
        return max(DEFAULT_BATCHED_TOKENS, max_model_len)
    return DEFAULT_BATCHED_TOKENS


@dataclass(frozen=True)
class ModelNeed:
    """One distinct model of the run, with what it must be given."""

    key: str  # e.g. the model config's name
    roles: tuple[str, ...]
    arch: Architecture
    weights: int  # bytes, all GPUs together
    dtype_bytes: int
    tp: int = 1
    placement: str = "auto"  # auto | in_process | managed_server
    gpus: tuple[int, ...] | None = None  # explicit GPU indices (of the visible ones)
    kv_cache_bytes: int | None = None  # per GPU, set in the model config: given as it is, not sized
    # tokens of the longest sequence (vLLM's max_model_len): vLLM refuses to start unless its KV cache
    # holds one such sequence, so the budget is never below that; None: not known
    max_model_len: int | None = None
    batched_tokens: int = DEFAULT_BATCHED_TOKENS  # vLLM's max_num_batched_tokens (its profile run)
    max_num_seqs: int = 256  # assumed: vLLM's default, for a model described in a test
    replicas: int | None = None  # engines of this model in all; None: auto (copies on free GPUs, by work)
    utilization: float = (
        0.9  # assumed: vLLM's default; its gpu_memory_utilization: the most it holds of each of its GPUs
    )
    config: ModelConfig | None = None  # what it was read from; None for a model described in a test
    kv_value_bytes: int | None = None  # bytes of one K or V value (1: an fp8 KV cache); None: dtype_bytes
    # the weights' quantization as vLLM runs it: the config's (fp8 on loading) or the checkpoint's method
    quantization: str | None = None

    @property
    def activation(self) -> int:
        """Per GPU: vLLM does not shrink a pinned KV cache to make room for activations."""
        seqs = min(self.max_num_seqs, self.batched_tokens)
        return self.arch.activation_bytes(self.batched_tokens, seqs, self.dtype_bytes, self.tp)

    @property
    def kv_per_token(self) -> int:
        return self.arch.kv_bytes_per_token(self.kv_value_bytes or self.dtype_bytes, self.tp)

    def kv_for(self, tokens: int) -> int:
        return self.arch.kv_bytes_for(tokens, self.kv_value_bytes or self.dtype_bytes, self.tp)

    @property
    def floor(self) -> int:
        """The least KV cache per GPU vLLM starts with: one sequence of max_model_len (or as configured)."""
        if self.kv_cache_bytes is not None:
            return self.kv_cache_bytes
        return self.kv_for(self.max_model_len) if self.max_model_len else 0

    def fixed_per_gpu(self, rules: Rules) -> int:
        """What it holds per GPU besides a sized KV cache."""
        return math.ceil(self.weights / self.tp) + rules.overhead_bytes + self.activation + (self.kv_cache_bytes or 0)

    def share(self, rules: Rules) -> int:
        """The most it may hold of one GPU: its own memory share."""
        return int(rules.gpu_bytes * self.utilization)

    def describe_kv(self) -> str:
        if self.kv_cache_bytes is not None:
            return f"KV {self.kv_cache_bytes / GIB:.1f} GiB per GPU as configured"
        if self.max_model_len:
            return f"KV for one max_model_len of {self.max_model_len} tokens {self.floor / GIB:.1f} GiB per GPU"
        return "KV (any)"


@dataclass(frozen=True)
class Rules:
    """The assumptions a plan rests on, printed with it."""

    gpu_bytes: int  # memory of one GPU
    # assumed: not measured apart; per GPU and engine besides activations, the CUDA context, CUDA
    # graphs, communication buffers
    overhead_bytes: int = 2 * GIB


def _split(models: Sequence[ModelNeed], free: int, rules: Rules) -> dict[str, int]:
    """`free` bytes of one GPU split among its models so that each holds as many tokens, none below its
    floor nor above its own share; configured budgets are fixed. A model pinned at a bound leaves the
    rest to be split again among the others."""
    sized = [m for m in models if m.kv_cache_bytes is None]
    given: dict[str, int] = {}
    while sized:
        per_token = sum(m.kv_per_token for m in sized)
        shares = {m.key: int(free * m.kv_per_token / per_token) for m in sized}
        short = [m for m in sized if shares[m.key] < m.floor]
        room = {m.key: m.share(rules) - m.fixed_per_gpu(rules) for m in sized}
        pinned = {m.key: m.floor for m in short} or {m.key: room[m.key] for m in sized if shares[m.key] > room[m.key]}
        if not pinned:
            return given | shares
        given |= pinned
        free -= sum(pinned.values())
        sized = [m for m in sized if m.key not in pinned]
    return given


def budgets(models: Sequence[ModelNeed], gpus: Mapping[str, tuple[int, ...]], rules: Rules) -> dict[str, int] | None:
    """Per-GPU KV budgets when these models run on `gpus`, or None when one GPU is too small. A model
    spread over several GPUs gets the smallest of its shares (vLLM gives every rank the same)."""
    budget: dict[str, int] = {}
    for g in {g for m in models for g in gpus[m.key]}:
        here = [m for m in models if g in gpus[m.key]]
        free = max(m.share(rules) for m in here) - sum(m.fixed_per_gpu(rules) for m in here)
        if free < 0:
            return None
        shares = _split(here, free, rules)
        for m in here:
            kv = shares.get(m.key, 0) if m.kv_cache_bytes is None else 0
            if kv < (m.floor if m.kv_cache_bytes is None else 0) or m.fixed_per_gpu(rules) + kv > m.share(rules):
                return None
            budget[m.key] = min(budget.get(m.key, math.inf), kv if m.kv_cache_bytes is None else m.kv_cache_bytes)
        if sum(shares.values()) > free:
            return None
    return {m.key: int(budget[m.key]) for m in models}


def run_dtype_bytes(config: ModelConfig) -> int:
    """Bytes per weight and KV value on a GPU: `auto` is vLLM's rule there (a 16-bit checkpoint as it
    is, a 32-bit one in bfloat16), an explicit dtype as configured."""
    if config.dtype == "auto":
        return 2
    return dtype_bytes(config.dtype, f"model {config.name}")


def model_need(config: ModelConfig, roles: tuple[str, ...], key: str) -> ModelNeed:
    """What the planner needs of one model, read from its local directory (config.json, weights)."""
    directory = Path(model_path(config))
    config_json = directory / "config.json"
    if not config_json.is_file():
        raise PersonalensError(
            f"model {config.name}: no {config_json}; placement sizes each model from its files: set "
            "path to a local Hugging Face directory, or to a hub id in the local Hugging Face cache"
        )
    arch = scaled_context(
        Architecture.from_config(json.loads(config_json.read_text()), where=str(config_json)), config.rope_scaling
    )
    size = run_dtype_bytes(config)
    quantization = _quantization(config, arch, str(config_json))
    leading = tuple(range(config.tensor_parallel_size))
    placement = config.placement
    if config.gpus is not None and config.gpus != leading:
        # an engine in this process uses the first tensor_parallel_size visible GPUs
        if placement == "in_process":
            raise PersonalensError(
                f"model {config.name}: gpus {list(config.gpus)} with placement in_process; an in-process engine "
                f"uses GPUs {list(leading)}: drop gpus, or use placement managed_server"
            )
        placement = "managed_server"
    # vLLM's own default when max_model_len is unset: the model's context length; auto starts there
    max_model_len = config.max_model_len if isinstance(config.max_model_len, int) else arch.context
    return ModelNeed(
        key=key,
        roles=roles,
        arch=arch,
        weights=weights_bytes(directory, arch, size, quantization)[0],
        dtype_bytes=size,
        tp=config.tensor_parallel_size,
        placement=placement,
        gpus=config.gpus,
        kv_cache_bytes=config.kv_cache_memory_bytes,
        max_model_len=max_model_len,
        batched_tokens=batched_tokens(config.max_num_batched_tokens, config.enable_chunked_prefill, max_model_len),
        max_num_seqs=config.max_num_seqs,
        replicas=config.explicit_replicas,
        utilization=config.gpu_memory_utilization,
        config=config,
        kv_value_bytes=1 if config.kv_cache_dtype.startswith("fp8") else None,
        quantization=quantization,
    )


# a checkpoint's quant_method and the `quantization` names vLLM takes for it (its Marlin kernels' names)
_SAME_METHOD = {"awq": ("awq", "awq_marlin"), "gptq": ("gptq", "gptq_marlin")}


def _quantization(config: ModelConfig, arch: Architecture, where: str) -> str | None:
    """The weights' quantization as vLLM will run them: the checkpoint's method, which vLLM refuses to
    replace by another, else the config's."""
    if arch.quantization is None or config.quantization is None:
        return arch.quantization or config.quantization
    if config.quantization not in _SAME_METHOD.get(arch.quantization, (arch.quantization,)):
        raise PersonalensError(
            f"model {config.name}: quantization {config.quantization}, but {where} names a checkpoint quantized "
            f"with {arch.quantization} (vLLM runs it as that); set quantization null"
        )
    return arch.quantization


def scaled_context(arch: Architecture, rope_scaling: tuple[tuple[str, Any], ...]) -> Architecture:
    """The architecture with the context a RoPE scaling gives it (YaRN: its factor times the original
    positions, as vLLM derives max_model_len), which max_model_len: auto may then reach."""
    scaling = dict(rope_scaling)
    factor = scaling.get("factor")
    if not factor or arch.context is None:
        return arch
    return dataclasses.replace(
        arch, context=int(float(factor) * int(scaling.get("original_max_position_embeddings", arch.context)))
    )
