"""A run's saved configurations read back: `generate.yaml` and `judge.yaml` (and a judge panel's
`judge-<name>.yaml`), which `generate` and `judge` write beside their outputs (core.check_or_save),
for the pipelines that read finished runs (`report` names their setup, `compare` checks that two
runs may be compared), and the run's date that chat templates write, fixed by its first
`generate` in the run's `start_date` file and kept in both (`start_date`)."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from personalens.engines.chat.dates import ENV, FORMAT
from personalens.errors import PersonalensError

STEPS = ("generate", "judge")
DATE_FILE = "start_date"  # the run's date, in the run directory (`start_date`)
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


def start_date(run_dir: Path, fix: bool = False) -> str:
    """The run's date, which gpt-oss's system message (and Llama 3.x's) writes as today's
    (engines/chat/dates.py), the same on every resume, shard and step: the one in the run's
    `start_date` file; else generate.yaml's `resolved.start_date` (a run saved before that file);
    else $VLLM_SYSTEM_START_DATE; else today (UTC). With `fix` (generate), a run without the file
    gets it, created atomically: of shards that start at once (either side of midnight, say), the
    first to create it wins and the others take its date. The date is set in this process's
    environment, which the managed servers it starts inherit; a variable set to another date, or a
    generate.yaml that holds another, is refused, since the run's prompts would change mid-run."""
    path = Path(run_dir) / DATE_FILE
    saved = read_saved(run_dir).get("generate")
    kept = saved.resolved.get("start_date") if saved else None
    given = os.environ.get(ENV) or None
    if given is not None and given == _SET_HERE.get(ENV):
        given = None
    if given is not None:
        _checked(given, ENV)
    fixed = _read_date(path)
    if fixed is None and fix:
        fixed = _create(path, str(kept or given or today()))
    date = str(fixed or kept or given or today())
    if kept and str(kept) != date:
        raise PersonalensError(
            f"{path}: the run's date is {date}, but {saved.path} was saved with start_date {kept}: "
            "its prompts would change mid-run; restore the one it ran with, or use another run.out_dir"
        )
    if given and given != date:
        raise PersonalensError(
            f"{ENV}={given} but the run in {run_dir} writes {date} as today's date in its prompts "
            f"({path if fixed else saved.path if saved else ''}); unset {ENV} or set it to {date} "
            "(and start external servers with it)"
        )
    os.environ[ENV] = _SET_HERE[ENV] = date
    return date


def today() -> str:
    """Today's date (UTC), in the variable's form."""
    return datetime.now(timezone.utc).strftime(FORMAT)


def _checked(value: str, where: str) -> str:
    try:
        datetime.strptime(value, FORMAT)
    except ValueError:
        raise PersonalensError(f"{where}={value!r}: expected a date such as 2026-01-31") from None
    return value


def _read_date(path: Path) -> str | None:
    """The date in the run's `start_date` file, checked; None where there is none."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as err:
        raise PersonalensError(f"{path}: cannot be read ({err})") from err
    return _checked(text.strip(), str(path))


def _create(path: Path, date: str) -> str:
    """`path` created holding `date`, unless another process created it first; the date it holds.
    Written whole under a unique temporary name, then hard-linked to `path`, which fails where it
    exists: no reader ever sees a partial file, and of concurrent creators exactly one wins."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(f"{date}\n")
        os.link(tmp, path)
    except FileExistsError:
        return _read_date(path) or date
    finally:
        os.unlink(tmp)
    return date
