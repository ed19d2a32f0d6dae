"""The GPUs this job may use, read without CUDA: `nvidia-smi` lists them, CUDA_VISIBLE_DEVICES (or
SLURM's GPU lists) says which are this job's. Initialising CUDA here, before vLLM starts its worker
processes, would force vLLM to spawn rather than fork them; torch would also cost seconds."""

from __future__ import annotations

import logging
import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass

from personalens.engines.dtype import vllm_is_cpu_build

GIB = 1024**3  # defined: a gibibyte

log = logging.getLogger(__name__)

_QUERY = [
    "nvidia-smi",
    "--query-gpu=index,uuid,memory.total,compute_cap,memory.free",
    "--format=csv,noheader,nounits",
]


@dataclass(frozen=True)
class GpuSpec:
    """The GPUs a layout is planned on: how many, the memory of the smallest, and where that was read."""

    count: int
    memory_bytes: int
    source: str
    # CUDA_VISIBLE_DEVICES value of each (index or UUID); a managed server on GPU k gets ids[k]
    ids: tuple[str, ...] = ()
    capabilities: tuple[str, ...] = ()  # compute capability of each ("9.0"); unknown for described GPUs
    free_bytes: tuple[int, ...] = ()  # memory free on each when read; unknown for described GPUs

    def device_ids(self, indices: tuple[int, ...]) -> tuple[str, ...]:
        return tuple(self.ids[i] if i < len(self.ids) else str(i) for i in indices)

    def describe(self) -> str:
        return f"{self.count} GPU(s) of {self.memory_bytes / GIB:.1f} GiB ({self.source})"


def simulated(count: int, memory_gib: float) -> GpuSpec:
    """GPUs a user describes (`personalens plan plan.gpus=4 plan.gpu_memory_gib=80`)."""
    return GpuSpec(
        count, int(memory_gib * GIB), f"given: {count} x {memory_gib:g} GiB", tuple(str(i) for i in range(count))
    )


def visible_gpus(env: Mapping[str, str], device_count: int) -> tuple[str, ...]:
    """The GPUs this job may use: CUDA_VISIBLE_DEVICES, then SLURM's GPU lists, then all devices."""
    for name in ("CUDA_VISIBLE_DEVICES", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS"):
        value = env.get(name)
        if value is not None:
            return tuple(g.strip() for g in value.split(",") if g.strip())
    return tuple(str(i) for i in range(device_count))


def parse_nvidia_smi(text: str, env: Mapping[str, str]) -> GpuSpec | None:
    """The visible GPUs among `nvidia-smi`'s rows (index, uuid, MiB, compute capability, and free MiB
    where the query asked for it), each named
    by its index, its UUID or a unique start of its UUID (as CUDA takes them); None when none is
    visible. A visible entry that names no whole GPU (a MIG instance, `MIG-...`) is warned about: the
    layout is planned on whole GPUs only."""
    rows = [[cell.strip() for cell in line.split(",")] for line in text.splitlines() if line.strip()]
    rows = [r for r in rows if len(r) in (4, 5) and r[2].isdigit()]
    by_id = {key: r for r in rows for key in (r[0], r[1])}
    visible = visible_gpus(env, len(rows))
    for g in visible:
        starting = [r for r in rows if g.startswith("GPU-") and r[1].startswith(g)]
        if g not in by_id and len(starting) == 1:
            by_id[g] = starting[0]
    ids = tuple(g for g in visible if g in by_id)  # in CUDA's order
    unknown = [g for g in visible if g not in by_id]
    if unknown:
        log.warning(
            f"the visible GPU(s) {','.join(unknown)} are no whole GPU that nvidia-smi lists (a MIG instance "
            f"or a wrong id); the layout is planned on {len(ids)} GPU(s)"
            + ("" if ids else ": every model runs in this process, on the device(s) CUDA makes visible")
        )
    if not ids:
        return None
    memory = min(int(by_id[g][2]) for g in ids) * 2**20
    free = tuple(int(by_id[g][4]) * 2**20 for g in ids if by_id[g][4:] and by_id[g][4].isdigit())
    free = free if len(free) == len(ids) else ()  # every GPU's, or none
    return GpuSpec(
        len(ids), memory, f"nvidia-smi, visible: {','.join(ids)}", ids, tuple(by_id[g][3] for g in ids), free
    )


def visible_gpu_spec(env: Mapping[str, str] = os.environ) -> GpuSpec | None:
    """This machine's GPUs for this job; None with vLLM's CPU build or where nvidia-smi finds none."""
    if vllm_is_cpu_build():
        return None
    try:
        done = subprocess.run(_QUERY, capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return parse_nvidia_smi(done.stdout, env)
