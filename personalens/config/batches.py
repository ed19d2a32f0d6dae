"""Under `reproducible: true`, a resumed run keeps the settings that decide its batches: they are
left out of the fingerprint (config/core.py: runtime-only model keys, the scheduler's settings), since
without the mode they change only how fast a run goes, but a resume that changed them would make
other batches than the run it continues, so other numbers (on vLLM's CPU build, where the mode
makes the same batches; docs/reproducibility.md). Checked against the saved config when the run
resumes, and refused in one line naming the keys."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from personalens.errors import PersonalensError

# a model's keys that decide its engine's batches or where it runs (config/core.py _RUNTIME_ONLY)
MODEL_KEYS = (
    "max_num_seqs",
    "max_num_batched_tokens",
    "block_size",
    "gpu_memory_utilization",
    "placement",
    "gpus",
    "replicas",
)
# a command's own keys that decide which requests go in one call, or when
RUN_KEYS = {
    "generate": (
        "scheduling",
        "lockstep.max_requests_per_call",
        "lockstep.cohorts",
        "lockstep.in_flight",
        "continuous.in_flight",
    ),
    "judge": ("judging.chunk",),
}


def batch_settings(config: Mapping[str, Any], command: str, roles: Sequence[str]) -> dict[str, Any]:
    """The settings of `config` (a plain config) that decide the batches of `command` on `roles`'
    models, by dotted key; a key the config does not hold (saved before it existed) is left out."""
    out = {}
    for role in roles:
        section = config.get(role) or {}
        out.update({f"{role}.{key}": section[key] for key in MODEL_KEYS if key in section})
    for dotted in RUN_KEYS.get(command, ()):
        value: Any = config
        for part in dotted.split("."):
            value = value.get(part, _MISSING) if isinstance(value, Mapping) else _MISSING
        if value is not _MISSING:
            out[dotted] = value
    return out


def check_batches(saved: Mapping[str, Any], now: Mapping[str, Any], command: str, roles: Sequence[str]) -> None:
    """Refuses, in one line, a resume whose batch settings differ from the saved run's."""
    before, after = batch_settings(saved, command, roles), batch_settings(now, command, roles)
    changed = [f"{k} (saved {before[k]!r}, now {after[k]!r})" for k in before if k in after and before[k] != after[k]]
    if changed:
        raise PersonalensError(
            f"reproducible: true: this {command} resumes a run with other batch settings: {', '.join(changed)}; "
            "they change which requests share a batch, so the resumed part would differ from a run never "
            f"stopped: run it with the saved values ({command}.yaml in the run's folder) or into a new run.out_dir"
        )


_MISSING = object()
