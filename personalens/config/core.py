"""Fingerprints of configurations and the resolved config a run saves beside its outputs."""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from personalens.config.batches import check_batches
from personalens.errors import PersonalensError
from personalens.paths import PROJECT_ROOT

# model settings that change how fast or where a model runs, not what it generates
_RUNTIME_ONLY = {
    "gpu_memory_utilization",
    "max_num_seqs",
    "max_num_batched_tokens",
    "block_size",
    "server",
    "placement",
    "gpus",
    "replicas",
    "download",
    "server_start_timeout_s",
    "kv_offload_gib",  # a reloaded block holds the values it was computed with
    "family",  # what a model is called for self-preference (docs/validation.md), not how it runs
}
# settings added to the model configs later, at the value that generates what configs without them
# did: left out of the identity then, so runs started before they existed still resume
_ADDED_AT = {
    "load_format": "auto",
    "revision": None,
    "reasoning_parser": None,
    "chat_template_kwargs": {},
    "history_reasoning": "family",
    "rope_scaling": None,
    "kv_cache_dtype": "auto",
    "quantization": None,  # fp8 weights change what is generated: in the identity whenever set
    "speculative": None,  # so may verified drafts (engines/models/speculative.py)
}
# a model's own sampling: a role's fingerprint holds the sampling it runs with (config/sampling.py), where a
# value the config writes may stand instead of the model's
_RECORDED_WITH_THE_ROLE = {"sampling"}


def register_resolvers() -> None:
    if not OmegaConf.has_resolver("pl_path"):
        OmegaConf.register_new_resolver("pl_path", lambda rel: str(PROJECT_ROOT / rel))


def quoted_value(text: str) -> str:
    """`text` as a single-quoted Hydra override value that composes back to exactly `text`: a quote
    and the backslashes before a quote, an interpolation or the end are escaped (Hydra's grammar),
    and `${` is escaped so OmegaConf keeps it literal. Any path the shell passed survives."""
    body = re.sub(r"(\\+)(?='|\$\{|$)", lambda m: m.group(1) * 2, text)
    return "'" + body.replace("'", "\\'").replace("${", "\\${") + "'"


def plain(cfg: Any) -> Any:
    return OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else cfg


def fingerprint(parts: dict) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def reproducible(cfg: DictConfig) -> bool:
    """`reproducible: true`: engines that give the same dialogues for the same command (batch-invariant
    on GPUs, the same batches on vLLM's CPU build; docs/reproducibility.md); configs saved before
    the option existed have none."""
    return bool(cfg.get("reproducible", False))


def run_options(cfg: DictConfig) -> dict:
    """The run-level options of a generate or judge fingerprint, each only when set, so a run without
    them keeps the fingerprint it had before they existed (and still resumes)."""
    return {"reproducible": True} if reproducible(cfg) else {}


def sampling_identity(section: Any) -> Any:
    """A protocol entry as a fingerprint holds it: a role's sampling without a thinking_budget left
    at null, so runs started before the setting existed keep their fingerprint."""
    value = plain(section)
    if isinstance(value, dict) and value.get("thinking_budget", 0) is None:
        return {k: v for k, v in value.items() if k != "thinking_budget"}
    return value


def model_identity(model_cfg: DictConfig) -> dict:
    return {
        k: v
        for k, v in plain(model_cfg).items()
        if k not in _RUNTIME_ONLY | _RECORDED_WITH_THE_ROLE and (k not in _ADDED_AT or v != _ADDED_AT[k])
    }


def check_or_save(
    out_dir: Path,
    name: str,
    cfg: DictConfig,
    digest: str,
    resolved: dict | None = None,
    parts: dict | None = None,
    roles: tuple[str, ...] = (),
) -> None:
    """Save the resolved config as `<out_dir>/<name>.yaml`, with `resolved` (what settings such as
    `dtype: auto` became on this machine) and the fingerprinted `parts` beside it (so that a later
    comparison of runs can name the part that differs: personalens/config/saved.py); refuse to run
    into an output dir whose saved config has another fingerprint, so results of different
    configurations never mix; under `reproducible: true`, nor into one whose batch settings for the
    models of `roles` differ (config/batches.py)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.yaml"
    if path.exists():
        saved = OmegaConf.load(path)
        if saved.get("fingerprint") != digest:
            raise PersonalensError(
                f"{path} was written by a run with a different configuration (fingerprint "
                f"{saved.get('fingerprint')} vs {digest} now: models, prompts, sampling or protocol differ). "
                f"Use another run.name / run.out_dir, or delete {out_dir} to start over."
            )
        was, now = (saved.get("resolved") or {}).get("start_date"), (resolved or {}).get("start_date")
        if was and now and str(was) != str(now):
            raise PersonalensError(
                f"{path} was written by a run whose prompts carry the date {was}, not {now} now: "
                f"its prompts would change mid-run. Restore {out_dir}/start_date to {was}, or use another run.out_dir."
            )
        if reproducible(cfg):
            check_batches(saved.get("config") or {}, plain(cfg), name, roles)
        return
    saved = OmegaConf.create(
        {"fingerprint": digest, "config": plain(cfg), "resolved": resolved or {}, "parts": parts or {}}
    )
    tmp = path.with_suffix(f".yaml.{os.getpid()}.tmp")
    OmegaConf.save(saved, tmp)
    os.replace(tmp, path)
