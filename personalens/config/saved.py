"""A run's saved configurations read back: `generate.yaml` and `judge.yaml`, which `generate` and
`judge` write beside their outputs (core.check_or_save), for the pipelines that read finished runs
(`report` names their setup, `compare` checks that two runs may be compared)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from personalens.errors import PersonalensError

STEPS = ("generate", "judge")


@dataclass(frozen=True)
class SavedStep:
    """One step's saved file: its fingerprint, the resolved config and the fingerprinted parts
    (empty for runs saved before the parts were kept)."""

    path: Path
    fingerprint: str | None
    config: dict[str, Any]
    parts: dict[str, Any] = field(default_factory=dict)
    resolved: dict[str, Any] = field(default_factory=dict)  # what settings became on the machine that ran it


def read_saved(run_dir: Path) -> dict[str, SavedStep]:
    """The steps of `run_dir` that saved a config, by step name (either may be missing)."""
    saved = {}
    for step in STEPS:
        path = Path(run_dir) / f"{step}.yaml"
        if not path.is_file():
            continue
        try:
            raw = OmegaConf.to_container(OmegaConf.load(path))
        except Exception as err:  # a damaged file: say which
            raise PersonalensError(f"{path}: not a readable run configuration ({err})") from err
        if not isinstance(raw, dict):
            raise PersonalensError(f"{path}: not a readable run configuration (not a mapping)")
        saved[step] = SavedStep(
            path, raw.get("fingerprint"), raw.get("config") or {}, raw.get("parts") or {}, raw.get("resolved") or {}
        )
    return saved
