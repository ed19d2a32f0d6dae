"""A run's saved configurations read back: `generate.yaml` and `judge.yaml` (and a judge panel's
`judge-<name>.yaml`), which `generate` and `judge` write beside their outputs (core.check_or_save),
for the pipelines that read finished runs (`report` names their setup, `compare` checks that two
runs may be compared), and the run's date that chat templates write, kept there by its first
`generate` (`start_date`)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from personalens.engines.chat.dates import ENV, FORMAT
from personalens.errors import PersonalensError

STEPS = ("generate", "judge")
# the date `start_date` last set in this process's environment: a later command of the same process
# (tests, `run`) takes that as no date given, so a run started on another day keeps its own
_SET_HERE: dict[str, str] = {}


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
    return SavedStep(
        path, raw.get("fingerprint"), raw.get("config") or {}, raw.get("parts") or {}, raw.get("resolved") or {}
    )


def start_date(run_dir: Path) -> str:
    """The run's date, which gpt-oss's system message (and Llama 3.x's) writes as today's
    (engines/chat/dates.py): the one its first `generate` saved (generate.yaml's `resolved.start_date`),
    the same on every resume, shard and step; else $VLLM_SYSTEM_START_DATE; else today (UTC). It is set
    in this process's environment, which the managed servers it starts inherit; a variable set to
    another date than the run's is refused, since the run's prompts would change mid-run."""
    saved = read_saved(run_dir).get("generate")
    kept = saved.resolved.get("start_date") if saved else None
    given = os.environ.get(ENV) or None
    if given is not None and given == _SET_HERE.get(ENV):
        given = None
    if given is not None:
        try:
            datetime.strptime(given, FORMAT)
        except ValueError:
            raise PersonalensError(f"{ENV}={given!r}: expected a date such as 2026-01-31") from None
    if kept and given and given != kept:
        raise PersonalensError(
            f"{ENV}={given} but the run in {run_dir} writes {kept} as today's date in its prompts "
            f"({saved.path if saved else ''}); unset {ENV} or set it to {kept} (and start external servers with it)"
        )
    date = str(kept or given or datetime.now(timezone.utc).strftime(FORMAT))
    os.environ[ENV] = _SET_HERE[ENV] = date
    return date
