"""The subcommands: each takes the resolved Hydra config and returns an exit code.

Heavy imports (vLLM, torch) happen inside the commands that need them."""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Callable

from omegaconf import DictConfig

from personalens import config as C
from personalens.errors import PersonalensError


def validate(cfg: DictConfig) -> int:
    from personalens.data import validate as check
    report = check(Path(cfg.data.root))
    print(report.format())
    return 0 if report.ok else 1


def generate(cfg: DictConfig, engines: Callable[[], dict] | None = None) -> int:
    from personalens.simulate.generate import Protocol, generate as simulate
    from personalens.store import DIALOGUE_SCHEMA, KEY_COLUMNS, PartWriter, existing_values, shard_dir

    scenarios = _scenarios(cfg)
    setting = _setting(cfg)
    templates, templates_digest = _templates(cfg)
    out_dir = Path(cfg.run.out_dir)
    digest = C.fingerprint({
        "assistant": C.model_identity(cfg.assistant), "user_agent": C.model_identity(cfg.user_agent),
        "protocol": {k: C.plain(v) for k, v in cfg.protocol.items() if k != "judge"},
        "templates": templates_digest, "seed": int(cfg.seed),
        "data_root": str(Path(cfg.data.root).resolve()),
    })
    _check_models(cfg, ("user_agent", "assistant"))  # before the config is saved as this run's
    C.check_or_save(out_dir, "generate", cfg, digest)
    folder = shard_dir(out_dir, "dialogues", cfg.shard.index, cfg.shard.count)
    load = engines or functools.cache(lambda: _engines(cfg, ("user_agent", "assistant")))
    simulate(
        scenarios, setting=setting, templates=templates,
        load_engines=lambda: {"user": load()["user_agent"], "assistant": load()["assistant"]},
        protocol=Protocol(cfg.protocol.max_rounds_sd, cfg.protocol.max_rounds_md,
                          {"user": C.sampling(cfg.protocol.user_agent),
                           "assistant": C.sampling(cfg.protocol.assistant)}),
        trials=int(cfg.trials), seed=int(cfg.seed),
        writer=PartWriter(folder, DIALOGUE_SCHEMA),
        done=existing_values(folder, KEY_COLUMNS),
        run_id=str(cfg.run.name), config_hash=digest, progress=bool(cfg.progress),
    )
    return 0


def judge(cfg: DictConfig, engines: Callable[[], dict] | None = None) -> int:
    from personalens.judge.run import judge as score
    from personalens.store import read_table, shard_dir

    out_dir = Path(cfg.run.out_dir)
    dialogues = read_table(shard_dir(out_dir, "dialogues", cfg.shard.index, cfg.shard.count))
    if dialogues is None:
        raise PersonalensError(f"no dialogues in {shard_dir(out_dir, 'dialogues', cfg.shard.index, cfg.shard.count)}: "
                               "run `personalens generate` with the same run.out_dir and shard first")
    templates, templates_digest = _templates(cfg)
    digest = C.fingerprint({"judge": C.model_identity(cfg.judge), "sampling": C.plain(cfg.protocol.judge),
                            "templates": templates_digest, "turn_level": bool(cfg.judging.turn_level)})
    _check_models(cfg, ("judge",))
    C.check_or_save(out_dir, "judge", cfg, digest)
    load = engines or functools.cache(lambda: _engines(cfg, ("judge",)))
    score(
        dialogues.to_pylist(), {s.key: s for s in _scenarios(cfg)},
        templates=templates, load_engine=lambda: load()["judge"], sampling=C.sampling(cfg.protocol.judge),
        dimensions=list(cfg.judging.dimensions), turn_level=bool(cfg.judging.turn_level),
        folder=shard_dir(out_dir, "judgments", cfg.shard.index, cfg.shard.count),
        progress=bool(cfg.progress),
    )
    return 0


def merge(cfg: DictConfig) -> int:
    from personalens.data import assign_shards, scenario_counts
    from personalens.merge import merge as check

    scenarios = _selection(cfg)
    label = _setting(cfg).label
    assignment = assign_shards(scenario_counts(scenarios), int(cfg.shard.count))
    expected = {(s.user.user_id, s.task.task_id, label, t): assignment[s.user.index]
                for s in scenarios for t in range(int(cfg.trials))}
    result = check(Path(cfg.run.out_dir), expected, list(cfg.judging.dimensions), int(cfg.shard.count))
    print(result.format())
    return 0 if result.ok else 1


def report(cfg: DictConfig) -> int:
    from personalens.report import build_report
    runs = [Path(r) for r in (cfg.report.runs or [cfg.run.out_dir])]
    result = build_report(runs, Path(cfg.report.out_dir), bootstrap=int(cfg.report.bootstrap),
                          seed=int(cfg.seed), figure5_domains=list(cfg.report.figure5_domains))
    print(result.table3_markdown())
    print(f"\nreport written to {cfg.report.out_dir}", file=sys.stderr)
    return 0


def run(cfg: DictConfig) -> int:
    """generate, judge and report in one process, loading each model once (and only if needed)."""
    engines = functools.cache(lambda: _engines(cfg, ("user_agent", "assistant", "judge")))
    return generate(cfg, engines) or judge(cfg, engines) or report(cfg)


def _selection(cfg: DictConfig):
    """Every scenario of the selected users and kinds."""
    from personalens.data import load_scenarios
    return load_scenarios(Path(cfg.data.root), cfg.data.users, cfg.data.kinds)


def _scenarios(cfg: DictConfig):
    """The scenarios of this shard."""
    from personalens.data import shard
    return shard(_selection(cfg), int(cfg.shard.index), int(cfg.shard.count))


def _setting(cfg: DictConfig):
    from personalens.prompts.setting import PromptSetting
    try:
        return PromptSetting(mode=cfg.prompt.mode, demographics=bool(cfg.prompt.demographics),
                             interactions=bool(cfg.prompt.interactions), situation=bool(cfg.prompt.situation))
    except ValueError as err:
        raise PersonalensError(f"prompt: {err}") from None


def _templates(cfg: DictConfig):
    from personalens.prompts.templates import load_templates
    templates = load_templates(cfg.prompt.dir)
    return templates, C.fingerprint(dict(templates.sources))


def _check_models(cfg: DictConfig, roles: tuple[str, ...]) -> None:
    from personalens.engines.build import model_configs
    model_configs({role: cfg[role] for role in roles})


def _engines(cfg: DictConfig, roles: tuple[str, ...]) -> dict:
    from personalens.engines.build import build_engines
    return build_engines({role: cfg[role] for role in roles})



def personalbench(cfg: DictConfig, engines: Callable[[], dict] | None = None) -> int:
    """`personalens personalbench run|export|score` (docs/personalbench.md)."""
    from personalens.personalbench import command
    action = str(cfg.personalbench.action)
    if action not in command.ACTIONS:
        raise PersonalensError(f"personalbench: unknown action {action!r}; expected one of {list(command.ACTIONS)}")
    return getattr(command, action)(cfg, engines) if action == "run" else getattr(command, action)(cfg)
