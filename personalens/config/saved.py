"""A run's saved configurations read back: `generate.yaml` and `judge.yaml` (and a judge panel's
`judge-<name>.yaml`), which `generate` and `judge` write beside their outputs (core.check_or_save), for the pipelines that read finished runs
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


def read_saved(run_dir: Path) -> dict[str, SavedStep]:
    """The steps of `run_dir` that saved a config, by step name (either may be missing)."""
    paths = {step: Path(run_dir) / f"{step}.yaml" for step in STEPS}
    return {step: _read(path) for step, path in paths.items() if path.is_file()}


def read_judges(run_dir: Path) -> dict[str, SavedStep]:
    """Every judge of the run's panel by name: "judge" (judge.yaml, model@judge's), then the others
    (judge-<name>.yaml, config/judges.py) by name."""
    found = {"judge": Path(run_dir) / "judge.yaml"} if (Path(run_dir) / "judge.yaml").is_file() else {}
    found |= {p.stem.removeprefix("judge-"): p for p in sorted(Path(run_dir).glob("judge-*.yaml"))}
    return {name: _read(path) for name, path in found.items()}


def _read(path: Path) -> SavedStep:
    try:
        raw = OmegaConf.to_container(OmegaConf.load(path))
    except Exception as err:  # a damaged file: say which
        raise PersonalensError(f"{path}: not a readable run configuration ({err})") from err
    if not isinstance(raw, dict):
        raise PersonalensError(f"{path}: not a readable run configuration (not a mapping)")
    return SavedStep(path, raw.get("fingerprint"), raw.get("config") or {}, raw.get("parts") or {})
