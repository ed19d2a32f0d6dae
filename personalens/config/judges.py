"""A judge panel (docs/validation.md#judge-panels): `model@judge` and the further judges of `judges:`,
each as the whole config it judges under (its model at `judge`, its sampling at `protocol.judge`),
with the name its saved config takes beside the run's outputs."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from personalens.config.core import plain
from personalens.errors import PersonalensError
from personalens.paths import project_path

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
        return DEFAULT if self.name == DEFAULT else f"{DEFAULT}-{self.name}"

    @property
    def model(self) -> str:
        """Its model config as one string: judges with equal ones share one engine."""
        return json.dumps(plain(self.cfg.judge), sort_keys=True, default=str)


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
        view.judge = _merged(model, entry.get("set"), f"{where}.set")
        view.protocol.judge = _merged(cfg.protocol.judge, entry.get("sampling"), f"{where}.sampling")
        view.judges = []
    return view


def _model_file(name: str, where: str) -> DictConfig:
    path = project_path("conf") / "model" / f"{name}.yaml"
    if not _NAME.fullmatch(name) or not path.is_file():
        known = sorted(p.stem for p in path.parent.glob("*.yaml"))
        raise PersonalensError(f"{where}.model: {name!r} is not a model config of conf/model/ ({', '.join(known)})")
    return OmegaConf.load(path)


def _merged(base: DictConfig, overrides: Any, where: str) -> DictConfig:
    if overrides is None:
        return base.copy()
    if not isinstance(overrides, Mapping):
        raise PersonalensError(f"{where}: expected a mapping of fields, got {overrides!r}")
    unknown = sorted(set(overrides) - set(base))
    if unknown:
        raise PersonalensError(f"{where}: unknown field(s) {unknown}; known: {sorted(base)}")
    return OmegaConf.merge(base, overrides)
