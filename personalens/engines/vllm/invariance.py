"""`reproducible: true`: every engine personalens starts runs vLLM's batch-invariant kernels, so a
request's reply no longer depends on what else is in its batch (docs/reproducibility.md).

vLLM has those kernels on NVIDIA GPUs of compute capability 8.0 or higher (its batch-invariance
page; AMD Instinct and Intel XPU too, which personalens does not read), not in its CPU build. The
decision is a pure function of the platform's facts, so it is tested with published GPU numbers.
All that vLLM 0.32 needs is its environment variable, read when an engine starts: on NVIDIA it
then picks an attention backend that supports batch invariance itself (FlashAttention, Triton or
FlexAttention; FlashInfer is left out by its selector), and the sampled user agent's requests
carry their own seeds, which its page asks of sampling at a temperature above 0.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from personalens.engines.placement.gpus import GpuSpec

ENV = {"VLLM_BATCH_INVARIANT": "1"}
MIN_CAPABILITY = (8, 0)
# what a run's results still depend on without batch-invariant engines (docs/reproducibility.md)
STILL_VARIES = (
    "dialogues and scores still change with the shard count, lockstep.max_requests_per_call, scheduling "
    "and where a killed run resumed (docs/reproducibility.md)"
)
# vLLM's page gives no figure for the cost, only what it turns off
COST = (
    "vLLM documents a throughput cost without a figure (deterministic kernels; on compute capability 8.x "
    "Triton matrix products in place of cuBLAS; for some bf16 models no torch.compile); the times here "
    "do not include it"
)


def capability(text: str) -> tuple[int, int]:
    """ "9.0" -> (9, 0), as nvidia-smi's compute_cap prints it."""
    major, _, minor = text.strip().partition(".")
    return int(major), int(minor or 0)


def refusal(gpus: GpuSpec | None, cpu_build: bool) -> str | None:
    """Why the in-process engines and managed servers of a job on `gpus` (None: vLLM's CPU build, or
    no NVIDIA GPU visible) cannot run batch-invariant, in one line; None when they can."""
    if gpus is None:
        why = (
            "vLLM's CPU build has none"
            if cpu_build
            else "no NVIDIA GPU is visible to nvidia-smi, the only GPUs personalens reads"
        )
    elif len(gpus.capabilities) < gpus.count or not all(re.fullmatch(r"\d+\.\d+", c) for c in gpus.capabilities):
        why = f"the compute capability of {gpus.describe()} is unknown"
    else:
        low = sorted({c for c in gpus.capabilities if capability(c) < MIN_CAPABILITY}, key=capability)
        if not low:
            return None
        why = f"these are GPUs of compute capability {', '.join(low)}"
    return (
        f"reproducible: true refused: vLLM has batch-invariant kernels for NVIDIA GPUs of compute capability "
        f"{'.'.join(map(str, MIN_CAPABILITY))} or higher, and {why}; without them, {STILL_VARIES}. "
        "Leave reproducible out, or run on such GPUs."
    )


def describe(gpus: GpuSpec, engines: Sequence[str]) -> str:
    """What a job with batch-invariant engines runs, for the saved config and the log."""
    caps = ", ".join(sorted(set(gpus.capabilities), key=capability))
    env = " ".join(f"{k}={v}" for k, v in ENV.items())
    return f"{env} for {', '.join(engines)} on {gpus.describe()}, compute capability {caps}"
