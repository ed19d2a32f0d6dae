"""Where a model config's KV options run, decided before any model loads: `kv_cache_dtype` fp8 and
`kv_offload_gib` (vLLM's native offloading of evicted KV blocks to host memory). A platform or vLLM
release that cannot is refused in one line. Pure but for `takes`, which imports vLLM, and only when
a model sets one of them.

What the installed vLLM 0.32 does (read in its code): an fp8 KV cache runs on NVIDIA GPUs through the
FlashAttention 3 (Hopper), FlashInfer or Triton backends; FP8 arithmetic needs compute capability 8.9
(Ada, Hopper and later; vLLM's FP8 pages), and on Ampere vLLM's issue 7714 reports fp8 KV failing, so
below 8.9 it is refused. Its CPU build runs fp8 KV on x86 with AVX-512 or AMX only
(v1/attention/backends/cpu_attn.py). Offloading is `kv_offloading_size` (GiB, all ranks together)
with backend `native` (its OffloadingConnector); a release whose EngineArgs lack it is refused. The
CPU build keeps KV in host memory already, so offloading there is refused.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

from personalens.engines.models.config import ModelConfig
from personalens.engines.placement.gpus import GpuSpec
from personalens.engines.vllm.api import ENGINE_ARGS
from personalens.engines.vllm.check import MISSING, installed_vllm, lookup
from personalens.engines.vllm.invariance import capability

FP8_CAPABILITY = (8, 9)
CPU_FP8_FLAGS = frozenset({"avx512f", "amx_tile"})  # /proc/cpuinfo flags of vLLM's CPU fp8 KV kernels


def takes(argument: str) -> bool:
    """Whether the installed vLLM's engine arguments include `argument`."""
    found = lookup(ENGINE_ARGS)
    return found is not MISSING and argument in {f.name for f in dataclasses.fields(found)}


def kv_refusal(
    config: ModelConfig,
    *,
    gpus: GpuSpec | None,
    cpu_build: bool,
    cpu_flags: Iterable[str],
    reproducible: bool = False,
    takes: Callable[[str], bool] = takes,
) -> str | None:
    """Why `config`'s KV options cannot run on this job's platform (None: they can, or none is set)."""
    head = f"model {config.name}"
    on_cpu = gpus is None and cpu_build
    if config.kv_cache_dtype != "auto":
        what = f"{head}: kv_cache_dtype {config.kv_cache_dtype} refused"
        if not takes("kv_cache_dtype"):
            return f"{what}: {_release()} takes no kv_cache_dtype"
        if on_cpu and not CPU_FP8_FLAGS & set(cpu_flags):
            return (
                f"{what}: vLLM's CPU build runs an fp8 KV cache on x86 with AVX-512 or AMX only, and this CPU has "
                f"neither ({' or '.join(sorted(CPU_FP8_FLAGS))}); use kv_cache_dtype auto"
            )
        low = sorted({c for c in gpus.capabilities if capability(c) < FP8_CAPABILITY}) if gpus is not None else []
        if low:
            return (
                f"{what}: an fp8 KV cache needs NVIDIA GPUs of compute capability "
                f"{'.'.join(map(str, FP8_CAPABILITY))} or higher (Ada, Hopper), and these are {', '.join(low)}; "
                "use kv_cache_dtype auto"
            )
    if config.kv_offload_gib is not None:
        what = f"{head}: kv_offload_gib {config.kv_offload_gib:g} refused"
        if on_cpu:
            return f"{what}: vLLM's CPU build keeps the KV cache in host memory already; set kv_offload_gib null"
        if not takes("kv_offloading_size"):
            return f"{what}: {_release()} has no kv_offloading_size (native offloading to host memory)"
        if reproducible:
            return (
                f"{what}: reproducible: true computes every prompt in its own batch, and a reloaded block was "
                "computed in another; set kv_offload_gib null, or leave reproducible out"
            )
    return None


def _release() -> str:
    found = installed_vllm()
    return f"vLLM {found[1]}" if found else "the installed vLLM"
