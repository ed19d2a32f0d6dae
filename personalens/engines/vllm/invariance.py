"""`reproducible: true`: the engines personalens starts run so that the same command gives the same
dialogues (docs/reproducibility.md), in one of two modes, by platform.

- NVIDIA GPUs of compute capability 8.0 or higher: vLLM's batch-invariant kernels, so a request's
  reply no longer depends on what else is in its batch. vLLM has them there (its batch-invariance
  page; AMD Instinct and Intel XPU too, which personalens does not read), not in its CPU build. All
  that vLLM 0.32 needs is its environment variable, read when an engine starts: on NVIDIA it then
  picks an attention backend that supports batch invariance itself (FlashAttention, Triton or
  FlexAttention; FlashInfer is left out by its selector).
- vLLM's CPU build: no such kernels, so the batches themselves are made the same. Each in-process
  engine runs vLLM's engine core in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, read when the
  engine is made): nothing steps until every request of a call is queued, where an engine core of
  its own process starts stepping on the first request while the rest arrive, so that which
  requests share a batch depends on timing. Prefix caching is off, so a prompt's keys and values are
  computed from its tokens in its own call whatever ran before: a run resumed at a step boundary,
  whose cache starts empty, computes what a never-stopped run computes. Engine cores in one process
  cannot step at the same time (simulate/lockstep.py), so lockstep runs one cohort. A managed
  server is refused: its requests arrive over HTTP one by one, and its batches depend on timing.

In both, the sampled user agent's requests carry their own seeds. The decisions are pure functions
of the platform's facts, so they are tested with published GPU numbers.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from personalens.engines.placement.gpus import GpuSpec

MIN_CAPABILITY = (8, 0)
# what a run's results still depend on without `reproducible: true` (docs/reproducibility.md)
STILL_VARIES = (
    "dialogues and scores still change with the shard count, lockstep.max_requests_per_call, scheduling "
    "and where a killed run resumed (docs/reproducibility.md)"
)


@dataclass(frozen=True)
class Mode:
    """What `reproducible: true` runs on a platform: the environment every engine starts with, whether
    the engines' cores run in this process (then one lockstep cohort runs and managed servers are
    refused), and the mode's cost as far as it is known. Prefix caching is off in either mode
    (engines/factory.py)."""

    name: str
    env: dict[str, str]
    in_process_core: bool
    cost: str


BATCH_INVARIANT = Mode(
    "batch-invariant kernels",
    {"VLLM_BATCH_INVARIANT": "1"},
    in_process_core=False,
    # vLLM's page gives no figure for the cost, only what it turns off
    cost="vLLM documents a throughput cost without a figure (deterministic kernels; on compute capability 8.x "
    "Triton matrix products in place of cuBLAS; for some bf16 models no torch.compile), and prefix caching is "
    "off (every prompt computed whole); the times here do not include it",
)
ENGINE_CORE_HERE = Mode(
    "same batches on vLLM's CPU build",
    {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"},
    in_process_core=True,
    # measured on the project's 2-core Xeon (docs/reproducibility.md)
    cost="each engine's core in this process and prefix caching off: every prompt is computed whole at every "
    "step (2.2x the prefill of the bundled sample under protocol=quick; more at the paper's lengths), and steps "
    "of two engines no longer overlap (one lockstep cohort); managed servers are refused; on a 2-core Xeon "
    "53-70 generated tokens/s against 57-106 without it (docs/reproducibility.md); the times here do not "
    "include it",
)


def capability(text: str) -> tuple[int, int]:
    """ "9.0" -> (9, 0), as nvidia-smi's compute_cap prints it."""
    major, _, minor = text.strip().partition(".")
    return int(major), int(minor or 0)


def mode(gpus: GpuSpec | None, cpu_build: bool) -> Mode:
    """The mode of a job on `gpus` (None: no NVIDIA GPU visible) whose vLLM is (or is not) the CPU build."""
    return ENGINE_CORE_HERE if gpus is None and cpu_build else BATCH_INVARIANT


def refusal(gpus: GpuSpec | None, cpu_build: bool) -> str | None:
    """Why the engines of a job on `gpus` (None: no NVIDIA GPU visible) cannot run reproducibly, in one
    line; None when they can (on vLLM's CPU build without GPUs always: its mode needs no kernels)."""
    if mode(gpus, cpu_build).in_process_core:
        return None
    if gpus is None:
        why = "no NVIDIA GPU is visible to nvidia-smi, the only GPUs personalens reads"
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
        "Leave reproducible out, or run on such GPUs (or on vLLM's CPU build, which makes the same batches)."
    )


def server_refusal(servers: Sequence[str]) -> str:
    """Why managed servers cannot run in the CPU build's mode, in one line."""
    return (
        f"reproducible: true refused: {', '.join(servers)} would run as a managed vLLM server, and on vLLM's CPU "
        "build the mode makes the same batches by running each engine's core in this process, while a server "
        "takes its requests over HTTP one by one, so that its batches depend on timing; set placement: in_process "
        "for it, or leave reproducible out (docs/reproducibility.md)."
    )


def describe(chosen: Mode, engines: Sequence[str], gpus: GpuSpec | None) -> str:
    """What a job in mode `chosen` runs, for the saved config and the log."""
    env = " ".join(f"{k}={v}" for k, v in chosen.env.items())
    if chosen.in_process_core:
        return (
            f"{env} and prefix caching off for {', '.join(engines)} on vLLM's CPU build: each engine's core in "
            "this process, one lockstep cohort"
        )
    assert gpus is not None  # refused without GPUs
    caps = ", ".join(sorted(set(gpus.capabilities), key=capability))
    return f"{env} and prefix caching off for {', '.join(engines)} on {gpus.describe()}, compute capability {caps}"
