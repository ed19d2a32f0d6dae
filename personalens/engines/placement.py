"""Where each distinct model of a run goes, and how much KV cache it gets, decided before any loads.

Pure: the inputs are the models' config.json, their weights' size, their dtype and tensor-parallel
degree, and the GPUs this job may use. Several in-process engines on the same GPUs get an explicit
per-GPU KV-cache budget (vLLM's profiling counts an earlier engine's memory as its own, so a
fraction of memory is not safe); models that do not fit together go to managed servers on their own
GPUs; a layout that fits nowhere is refused with the computed sizes and the ways out.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from personalens.errors import PersonalensError

DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2, "fp8": 1}
GIB = 1024**3


@dataclass(frozen=True)
class Architecture:
    """The numbers of config.json that size weights and KV cache."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    experts: int = 1
    tied_embeddings: bool = False
    # per layer: None for full attention, else the sliding window in tokens
    windows: tuple[int | None, ...] = ()

    @classmethod
    def from_config(cls, config: Mapping, where: str = "config.json") -> Architecture:
        try:
            layers = int(config["num_hidden_layers"])
            hidden = int(config["hidden_size"])
            heads = int(config["num_attention_heads"])
            kv_heads = int(config.get("num_key_value_heads") or heads)
            head_dim = int(config.get("head_dim") or hidden // heads)
            intermediate = int(config["intermediate_size"])
            vocab = int(config["vocab_size"])
        except (KeyError, TypeError, ValueError) as err:
            raise PersonalensError(f"{where}: cannot size the model, missing or bad field {err}") from None
        window = config.get("sliding_window")
        if config.get("use_sliding_window") is False:
            window = None
        kinds = config.get("layer_types")  # mixed full/sliding layers (e.g. Gemma 2/3, Qwen 3)
        if kinds:
            windows = tuple(int(window) if window and k == "sliding_attention" else None for k in kinds)
        else:
            windows = (int(window) if window else None,) * layers
        return cls(
            layers=layers,
            hidden=hidden,
            heads=heads,
            kv_heads=kv_heads,
            head_dim=head_dim,
            intermediate=intermediate,
            vocab=vocab,
            experts=int(config.get("num_local_experts") or 1),
            tied_embeddings=bool(config.get("tie_word_embeddings", False)),
            windows=windows,
        )

    def parameters(self) -> int:
        """Parameter count of a Llama-style decoder (gated MLP, optional MoE), for weights not on disk."""
        attention = self.hidden * self.heads * self.head_dim * 2 + self.hidden * self.kv_heads * self.head_dim * 2
        mlp = 3 * self.hidden * self.intermediate * self.experts
        router = self.hidden * self.experts if self.experts > 1 else 0
        per_layer = attention + mlp + router + 2 * self.hidden
        embeddings = self.vocab * self.hidden * (1 if self.tied_embeddings else 2)
        return self.layers * per_layer + embeddings + self.hidden

    def kv_heads_per_gpu(self, tp: int) -> int:
        # vLLM replicates KV heads when tensor parallelism exceeds their number
        return max(1, math.ceil(self.kv_heads / tp))

    def kv_bytes_per_token(self, dtype_bytes: int, tp: int = 1) -> int:
        """K and V of one token in every layer, on one GPU of the tensor-parallel group."""
        return self.layers * self.kv_heads_per_gpu(tp) * self.head_dim * 2 * dtype_bytes

    def kv_bytes_for(self, tokens: int, dtype_bytes: int, tp: int = 1) -> int:
        """KV of one sequence of `tokens` on one GPU: sliding-window layers keep only their window."""
        per_layer = self.kv_heads_per_gpu(tp) * self.head_dim * 2 * dtype_bytes
        return sum(per_layer * (min(tokens, w) if w else tokens) for w in self.windows)


def weights_bytes(model_dir: Path, arch: Architecture, dtype_bytes: int) -> tuple[int, str]:
    """The weights' size and where it came from: the safetensors index, the files, or config.json."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        total = json.loads(index.read_text()).get("metadata", {}).get("total_size")
        if total:
            return int(total), f"{index.name} total_size"
    files = sorted(model_dir.glob("*.safetensors"))
    if files:
        return sum(f.stat().st_size for f in files), f"{len(files)} safetensors file(s)"
    return arch.parameters() * dtype_bytes, "estimated from config.json's parameter count"


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


@dataclass(frozen=True)
class Rules:
    """The assumptions a plan rests on, printed with it."""

    gpu_bytes: int  # memory of one GPU
    utilization: float = 0.9  # share of a GPU vLLM may use
    overhead_bytes: int = 2 * GIB  # per GPU and engine: activations, CUDA graphs, the CUDA context
    min_seqs: int = 32  # sequences each model must hold at once
    seq_tokens: int = 2048  # a typical dialogue length in tokens


@dataclass(frozen=True)
class Placement:
    key: str
    roles: tuple[str, ...]
    mode: str  # in_process | managed_server
    gpus: tuple[int, ...]
    weights_per_gpu: int
    kv_per_token_per_gpu: int
    kv_cache_memory_bytes: int  # per GPU, what vLLM is given
    seqs_that_fit: int

    def as_dict(self) -> dict:
        return dict(self.__dict__, roles=list(self.roles), gpus=list(self.gpus))


def visible_gpus(env: Mapping[str, str], device_count: int) -> tuple[str, ...]:
    """The GPUs this job may use: CUDA_VISIBLE_DEVICES, then SLURM's GPU lists, then all devices."""
    for name in ("CUDA_VISIBLE_DEVICES", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS"):
        value = env.get(name)
        if value is not None:
            return tuple(g.strip() for g in value.split(",") if g.strip())
    return tuple(str(i) for i in range(device_count))


def _need_per_gpu(m: ModelNeed, rules: Rules) -> int:
    if m.kv_cache_bytes is not None:
        return 0  # fixed, counted in _fixed_per_gpu
    typical = rules.min_seqs * m.arch.kv_bytes_for(rules.seq_tokens, m.dtype_bytes, m.tp)
    longest = m.arch.kv_bytes_for(m.max_model_len, m.dtype_bytes, m.tp) if m.max_model_len else 0
    return max(typical, longest)


def _fixed_per_gpu(m: ModelNeed, rules: Rules) -> int:
    return math.ceil(m.weights / m.tp) + rules.overhead_bytes + (m.kv_cache_bytes or 0)


def _budgets(models: Sequence[ModelNeed], gpus: Mapping[str, tuple[int, ...]], rules: Rules) -> dict[str, int] | None:
    """Per-GPU KV budgets when these models share their GPUs, or None when one GPU is too small.

    Each GPU's free memory is split among its models in proportion to what they need; a model spread
    over several GPUs gets the smallest of its shares."""
    usable = int(rules.gpu_bytes * rules.utilization)
    scale: dict[str, float] = {}
    for g in {g for m in models for g in gpus[m.key]}:
        here = [m for m in models if g in gpus[m.key]]
        free = usable - sum(_fixed_per_gpu(m, rules) for m in here)
        needed = sum(_need_per_gpu(m, rules) for m in here)
        if free < needed or free < 0:
            return None
        for m in here:
            scale[m.key] = min(scale.get(m.key, math.inf), free / needed if needed else 1.0)
    return {
        m.key: m.kv_cache_bytes if m.kv_cache_bytes is not None else int(_need_per_gpu(m, rules) * scale[m.key])
        for m in models
    }


def _placed(m: ModelNeed, mode: str, gpus: tuple[int, ...], budget: int, rules: Rules) -> Placement:
    return Placement(
        key=m.key,
        roles=m.roles,
        mode=mode,
        gpus=gpus,
        weights_per_gpu=math.ceil(m.weights / m.tp),
        kv_per_token_per_gpu=m.arch.kv_bytes_per_token(m.dtype_bytes, m.tp),
        kv_cache_memory_bytes=budget,
        seqs_that_fit=budget // max(1, m.arch.kv_bytes_for(rules.seq_tokens, m.dtype_bytes, m.tp)),
    )


def plan_placement(models: Sequence[ModelNeed], n_gpus: int, rules: Rules) -> list[Placement]:
    """Everything in process when it all fits on shared GPUs, else each model a server on its own GPUs."""
    for m in models:
        if m.gpus is not None and len(m.gpus) != m.tp:
            raise PersonalensError(f"model {m.key}: gpus {list(m.gpus)} must list tensor_parallel_size={m.tp} GPUs")
        if m.gpus is not None and any(not 0 <= g < n_gpus for g in m.gpus):
            raise PersonalensError(f"model {m.key}: gpus {list(m.gpus)} not among the {n_gpus} visible GPUs")
    too_wide = [m for m in models if m.tp > n_gpus]
    forced_servers = any(m.placement == "managed_server" for m in models)
    if not too_wide and not forced_servers:
        shared = {m.key: m.gpus or tuple(range(m.tp)) for m in models}
        budgets = _budgets(models, shared, rules)
        if budgets is not None:
            return [_placed(m, "in_process", shared[m.key], budgets[m.key], rules) for m in models]
    forced_in_process = [m.key for m in models if m.placement == "in_process"]
    if not too_wide and not forced_in_process:
        # explicit GPUs first; the others take the lowest GPUs left, in order
        taken = {g for m in models for g in m.gpus or ()}
        free = [g for g in range(n_gpus) if g not in taken]
        own = {}
        for m in models:
            own[m.key], free = (m.gpus, free) if m.gpus else (tuple(free[: m.tp]), free[m.tp :])
        disjoint = len({g for v in own.values() for g in v}) == sum(len(v) for v in own.values())
        if disjoint and all(len(own[m.key]) == m.tp for m in models):
            alone = [_budgets([m], own, rules) for m in models]
            if all(b is not None for b in alone):
                return [_placed(m, "managed_server", own[m.key], b[m.key], rules) for m, b in zip(models, alone)]
    raise PersonalensError(refusal(models, n_gpus, rules))


def _kv_need(m: ModelNeed, rules: Rules) -> str:
    if m.kv_cache_bytes is not None:
        return f"KV {m.kv_cache_bytes / GIB:.1f} GiB per GPU as configured (included)"
    longest = f" (at least one max_model_len of {m.max_model_len})" if m.max_model_len else ""
    return (
        f"KV for {rules.min_seqs} x {rules.seq_tokens} tokens{longest} {_need_per_gpu(m, rules) / GIB:.1f} GiB per GPU"
    )


def refusal(models: Sequence[ModelNeed], n_gpus: int, rules: Rules) -> str:
    usable = rules.gpu_bytes * rules.utilization / GIB
    sizes = "; ".join(
        f"{m.key} ({'/'.join(m.roles)}): weights {m.weights / GIB:.1f} GiB, tp {m.tp} -> "
        f"{_fixed_per_gpu(m, rules) / GIB:.1f} GiB per GPU with overhead, {_kv_need(m, rules)}"
        for m in models
    )
    return (
        f"these models do not fit on {n_gpus} GPU(s) of {usable:.1f} GiB usable each "
        f"(gpu memory x {rules.utilization}): {sizes}. Ways out: more GPUs, a larger tensor_parallel_size, "
        "a smaller user agent or judge model, or an external `engine: server` endpoint on another node "
        "(docs/cluster.md)"
    )
