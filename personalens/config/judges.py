"""A judge panel (docs/validation.md#judge-panels): `model@judge` and the further judges of `judges:`,
each as the whole config it judges under (its model at `judge`, its sampling at `protocol.judge`),
with the name its saved config takes beside the run's outputs."""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from personalens.config.core import plain
from personalens.config.saved import read_judges, read_saved
from personalens.errors import PersonalensError
from personalens.paths import project_path
from personalens.store.results import Judgment

DEFAULT = "judge"  # the name of model@judge in the panel, and its saved config's (judge.yaml)
_ENTRY_KEYS = ("name", "model", "set", "sampling")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


@dataclass(frozen=True)
class PanelJudge:
    name: str  # DEFAULT for model@judge, else its entry's name
    cfg: DictConfig  # the command's config with this judge's model and sampling in place

    @property
    def saved(self) -> str:
        """The saved config's name: judge.yaml for model@judge, judge-<name>.yaml for the others."""
        return saved_name(self.name)

    @property
    def model(self) -> str:
        """Its model config as one string: judges with equal ones share one engine."""
        return json.dumps(plain(self.cfg.judge), sort_keys=True, default=str)


def saved_name(name: str) -> str:
    """A panel judge's saved config's name (judge.yaml, judge-<name>.yaml), which its report files carry."""
    return DEFAULT if name == DEFAULT else f"{DEFAULT}-{name}"


def panel(cfg: DictConfig) -> list[PanelJudge]:
    """model@judge, then each entry of `judges` (none by default). An entry is {name, model (a
    conf/model file's name; model@judge's config when left out), set (fields of that model
    overridden), sampling (fields of protocol.judge overridden)}."""
    judges = [PanelJudge(DEFAULT, cfg)]
    for i, raw in enumerate(plain(cfg.get("judges")) or []):
        where = f"judges[{i}]"
        if not isinstance(raw, Mapping):
            raise PersonalensError(
                f"{where}: expected a mapping such as {{name: warm, sampling: {{temperature: 0.7}}}}"
            )
        unknown = sorted(set(raw) - set(_ENTRY_KEYS))
        if unknown:
            raise PersonalensError(f"{where}: unknown field(s) {unknown}; an entry takes {', '.join(_ENTRY_KEYS)}")
        name = str(raw.get("name") or "")
        if not _NAME.fullmatch(name) or name == DEFAULT:
            raise PersonalensError(
                f"{where}.name: {name!r} is no judge name (letters, digits, _ . -; not {DEFAULT!r}, model@judge's)"
            )
        if name in {j.name for j in judges}:
            raise PersonalensError(f"{where}.name: {name!r} names two judges")
        judges.append(PanelJudge(name, _view(cfg, raw, where)))
    return judges


def _view(cfg: DictConfig, entry: Mapping[str, Any], where: str) -> DictConfig:
    model = cfg.judge if entry.get("model") is None else _model_file(str(entry["model"]), where)
    view = copy.deepcopy(cfg)
    with open_dict(view):
        view.judge = _merged(model, entry.get("set"), f"{where}.set", ("server",))
        view.protocol.judge = _merged(cfg.protocol.judge, entry.get("sampling"), f"{where}.sampling")
        view.judges = []
    return view


def _model_file(name: str, where: str) -> DictConfig:
    path = project_path("conf") / "model" / f"{name}.yaml"
    if not _NAME.fullmatch(name) or not path.is_file():
        known = sorted(p.stem for p in path.parent.glob("*.yaml"))
        raise PersonalensError(f"{where}.model: {name!r} is not a model config of conf/model/ ({', '.join(known)})")
    return OmegaConf.load(path)


def _merged(base: DictConfig, overrides: Any, where: str, extra: tuple[str, ...] = ()) -> DictConfig:
    """`base` with `overrides` merged in: fields of `base`, or of `extra` (a model's `server`, which only a
    model on a server the lab runs has: conf/engine/server.yaml)."""
    if overrides is None:
        return base.copy()
    if not isinstance(overrides, Mapping):
        raise PersonalensError(f"{where}: expected a mapping of fields, got {overrides!r}")
    known = set(base) | set(extra)
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise PersonalensError(f"{where}: unknown field(s) {unknown}; known: {sorted(known)}")
    merged = copy.deepcopy(base)
    with open_dict(merged):
        merged.merge_with(overrides)
    return merged


# ---- the judges of stored runs (report, compare) ---------------------------------------------------


@dataclass(frozen=True)
class StoredJudge:
    key: str  # the fingerprint its rows carry (judge_key)
    name: str  # DEFAULT or its panel entry's name
    model: dict  # its saved model config

    @property
    def label(self) -> str:
        return f"{self.name} ({self.model.get('name', 'unknown model')})"


@dataclass(frozen=True)
class RunJudges:
    judges: dict[str, StoredJudge]  # by key, as the runs' saved configs name them
    default: dict[str, str]  # run directory -> its judge.yaml's key ("" where none was saved)
    per_run: dict[str, tuple[str, ...]]  # run directory -> the keys of the judges it saved
    assistants: dict[str, dict]  # run directory -> its saved assistant model config ({} where none)

    def keyed(self, judgments: Sequence[Judgment]) -> tuple[Judgment, ...]:
        """`judgments` with the rows written before judge keys given their run's judge's key."""
        return tuple(j if j.judge else dataclasses.replace(j, judge=self.default.get(j.run, "")) for j in judgments)

    def primary(self, judgments: Sequence[Judgment]) -> tuple[Judgment, ...]:
        """The rows of each run's model@judge (judge.yaml): what the report's and compare's tables hold."""
        return tuple(j for j in self.keyed(judgments) if j.judge == self.default.get(j.run, ""))

    def label(self, key: str) -> str:
        return self.judges[key].label if key in self.judges else f"judge {key or '(not recorded)'}"

    def name(self, key: str) -> str:
        """The judge's panel name ("judge" for model@judge); its key where no run saved it."""
        return self.judges[key].name if key in self.judges else key or "(not recorded)"

    def stems(self, keys: Sequence[str]) -> dict[str, str]:
        """Per key, what its report files are named by: its saved config's name (judge, judge-<name>),
        the same whatever judges are added; with the key's start added where runs reported together
        saved one name for several judges."""
        names = {k: saved_name(self.name(k)) if k in self.judges else f"judge-{k[:8] or 'unrecorded'}" for k in keys}
        shared = {n for n in names.values() if list(names.values()).count(n) > 1}
        return {k: f"{n}-{k[:8]}" if n in shared else n for k, n in names.items()}

    def self_preference(self, keys: Sequence[str] | None = None) -> list[str]:
        """One line per run and judge (of `keys`; all by default) whose family is the run's
        assistant's (engines/models/family.py)."""
        from personalens.engines.models.family import family_of

        lines = []
        for run, run_keys in self.per_run.items():
            assistant = self.assistants.get(run) or {}
            theirs = family_of(assistant) if assistant else None
            for judge in (self.judges[k] for k in run_keys if k in self.judges and (keys is None or k in keys)):
                ours = family_of(judge.model)
                if theirs is not None and ours.shared_with(theirs):
                    lines.append(
                        f"Self-preference: judge {judge.label} and assistant {assistant.get('name')} of {run} are "
                        f"both of the {ours.name} family (judge: {ours.source}; assistant: {theirs.source}); a judge "
                        f"may favour replies of its own family. {cross_family_advice(ours.name)}"
                    )
        return lines


def cross_family_advice(family: str | None) -> str:
    """What to add where a judge shares the assistant's family: conf/model's judges of other families,
    one each, or a panel across families (as PoLL, arXiv 2404.18796, judges with several small models
    of different families)."""
    others: dict[str, str] = {}
    for path in sorted((project_path("conf") / "model").glob("*.yaml")):
        theirs = OmegaConf.load(path).get("family")
        if theirs and str(theirs).lower() != family:
            others.setdefault(str(theirs).lower(), path.stem)
    named = ", ".join(f"{stem} ({name})" for name, stem in others.items())
    return (
        f"Add a judge of another family ({named}: judges=[{{name: other, model: <one of them>}}]), or a panel across "
        "families (PoLL, arXiv 2404.18796), and hold the judges' agreement against the paper's Table 5 "
        "(docs/validation.md#self-preference)."
    )


def run_judges(run_dirs: Sequence[Path]) -> RunJudges:
    """The judges the runs saved (judge.yaml, judge-<name>.yaml) and their assistants' configs."""
    judges: dict[str, StoredJudge] = {}
    default, per_run, assistants = {}, {}, {}
    for run in run_dirs:
        saved = read_judges(run)
        for name, step in saved.items():
            key = step.fingerprint or ""
            judges.setdefault(key, StoredJudge(key, name, step.config.get("judge") or {}))
        default[str(run)] = (saved[DEFAULT].fingerprint or "") if DEFAULT in saved else ""
        per_run[str(run)] = tuple(step.fingerprint or "" for step in saved.values())
        generate = read_saved(run).get("generate")
        assistants[str(run)] = (generate.config.get("assistant") or {}) if generate else {}
    return RunJudges(judges, default, per_run, assistants)
