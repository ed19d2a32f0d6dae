"""`personalens <subcommand> [DATA_ROOT] [hydra overrides...]`: every subcommand is a Hydra app
over the one config in conf/, so `key=value`, `group=option`, `--cfg job` and `-m` work as usual."""

from __future__ import annotations

import importlib
import inspect
import signal
import sys
import traceback
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from omegaconf import DictConfig

if TYPE_CHECKING:
    from personalens.engines.stop import Stop


@dataclass(frozen=True)
class Subcommand:
    name: str
    help: str
    target: str  # "module:function", imported only when the subcommand runs (`validate` never loads vLLM)
    # commands that load models: the folder whose logs/<command>.log takes the libraries' output
    logs_under: Callable[[DictConfig], str | None] | None = None
    actions: tuple[str, ...] = ()  # the next word picks one: `personalens agreement export`
    # the list key that leading positional paths fill (`personalens compare RUN_A RUN_B`); else the
    # first one is DATA_ROOT
    positional_list: str | None = None

    def function(self) -> Callable[[DictConfig], int]:
        module, function = self.target.split(":")
        return getattr(importlib.import_module(module), function)


def _run_dir(cfg: DictConfig) -> str:
    return cfg.run.out_dir


def _personalbench_run_dir(cfg: DictConfig) -> str | None:
    return cfg.personalbench.out_dir if cfg.personalbench.action == "run" else None  # only `run` loads models


SUBCOMMANDS = (
    Subcommand("validate", "check a data directory in the official layout and print its counts",
               "personalens.validation.command:validate"),
    Subcommand("generate", "simulate user-agent / assistant dialogues in lockstep (Parquet under run.out_dir)",
               "personalens.simulate.command:generate", _run_dir),
    Subcommand("judge", "score the dialogues of run.out_dir with the judge model",
               "personalens.judge.command:judge", _run_dir),
    Subcommand("merge", "check that every scenario of the selection is present exactly once across shards",
               "personalens.merge.command:merge"),
    Subcommand("report", "write the paper's tables and figures for one or more runs",
               "personalens.report.command:report"),
    Subcommand("compare", "paired differences between runs (and a run's prompt settings) with user-clustered intervals",
               "personalens.compare.command:compare", positional_list="compare.runs"),
    Subcommand("run", "generate, judge and report in one process, then print the Table 3 layout",
               "personalens.cli:run", _run_dir),
    Subcommand("plan", "a dry run loading no model: selection, shards, each model's placement and memory, tokens, time",
               "personalens.plan.command:plan"),
    Subcommand("stats", "print and write Table 1, Tables 6-9 and Figure 3 of the data (res/schema.json for 8-9)",
               "personalens.validation.command:stats"),
    Subcommand("diversity", "print and write Table 10's lexical diversity of a run's dialogues (or any dialogue Parquet)",
               "personalens.validation.command:diversity"),
    Subcommand("build", "build a new PersonaLens-style dataset in the official layout (docs/build.md)",
               "personalens.cli:build", lambda cfg: cfg.datagen.out_dir),
    Subcommand("consistency", "check the profiles of a data root for conflicts (Figure 21) and print the flagged share",
               "personalens.datagen.command:consistency", _run_dir),
    Subcommand("agreement", "Table 5: annotation sheets and guide (export), kappas against the judge (score)",
               "personalens.agreement.command:agreement", actions=("export", "score")),
    Subcommand("personalbench", "PersonalBench on WildChat histories (docs/personalbench.md)",
               "personalens.personalbench.command:personalbench", _personalbench_run_dir,
               actions=("run", "export", "score")),
)  # fmt: skip
COMMANDS = {c.name: c for c in SUBCOMMANDS}


def _usage() -> str:
    names = [c.name + (" " + "|".join(c.actions) if c.actions else "") for c in SUBCOMMANDS]
    width = max(map(len, names)) + 2
    lines = [f"  {n.ljust(width)}{c.help}" for n, c in zip(names, SUBCOMMANDS)]
    return (
        "usage: personalens SUBCOMMAND [DATA_ROOT] [key=value ...]\n\nsubcommands:\n" + "\n".join(lines) + "\n\n"
        "DATA_ROOT, if given, is shorthand for data.root=DATA_ROOT (`personalens compare RUN_A RUN_B ...` takes\n"
        "run directories instead); --strict for data.strict=true (quirks of\n"
        "the release that its own code tolerates, warnings by default, become errors). Everything else is a\n"
        "Hydra override, e.g. `personalens generate data.users=sample50 model@assistant=llama31_8b\n"
        "assistant.path=/models/llama`. `personalens SUBCOMMAND --help` shows the config."
    )


def run(cfg: DictConfig, stop: Stop | None = None) -> int:
    """generate, judge and report in one process, loading each model once (and only if needed)."""
    from personalens.config import run as R
    from personalens.judge.command import judge, settings
    from personalens.simulate.command import generate

    settings(cfg)  # a judge setting that cannot work fails now, not after the dialogues
    engines = R.engines(cfg, ("user_agent", "assistant", "judge"))
    code = generate(cfg, engines, stop) or judge(cfg, engines, stop)
    if code:
        return code
    from personalens.report.command import report  # matplotlib and pandas: seconds, only once there is a report

    return report(cfg)


def _positional(arg: str) -> bool:
    # a path that exists is positional even when it holds "=" (a key=value override otherwise)
    return not arg.startswith("-") and ("=" not in arg or Path(arg).exists())


def _hydra_args(rest: list[str], positional_list: str | None = None) -> list[str]:
    """Turn a leading positional DATA_ROOT into the override data.root=DATA_ROOT (or all leading
    positional paths into `positional_list=[...]`), and --strict into data.strict=true."""
    from personalens.config.core import quoted_value

    strict = ["data.strict=true"] if "--strict" in rest else []
    rest = [arg for arg in rest if arg != "--strict"]
    if positional_list:
        k = next((i for i, arg in enumerate(rest) if not _positional(arg)), len(rest))
        if k:
            rest = [f"{positional_list}=[{','.join(quoted_value(a) for a in rest[:k])}]", *rest[k:]]
    elif rest and _positional(rest[0]):
        rest = [f"data.root={quoted_value(rest[0])}", *rest[1:]]
    return [*rest, *strict]


def build(cfg: DictConfig, engine: Callable | None = None) -> int:
    """Build new data (datagen), then describe it as `personalens stats` would (validation)."""
    from personalens.datagen.command import build as build_data
    from personalens.validation.command import describe_built

    built = build_data(cfg, engine)
    return built.code or (describe_built(built.root, built.domains, built.stats_dir) if built.root else 0)


def _route_library_output(command: Subcommand, label: str, cfg: DictConfig) -> Path | None:
    """The log file the libraries write to (and the terminal is told of), or None when this
    command loads no model or `verbose` keeps everything on the terminal."""
    from personalens import console

    folder = command.logs_under(cfg) if command.logs_under else None
    if folder is None:
        return None
    if cfg.get("verbose", False):
        console.libraries_to_stderr()
        return None
    shard = f".shard-{cfg.shard.index:03d}-of-{cfg.shard.count:03d}" if cfg.shard.count > 1 else ""
    log_file = Path(folder) / "logs" / f"{label.replace(' ', '-')}{shard}.log"  # one per array task
    console.to_log_file(log_file)
    print(f"personalens {label}: library logs (vLLM, torch) go to {log_file}", file=console.err())
    return log_file


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    asked_help = bool(argv) and argv[0] in ("-h", "--help")
    if not argv or asked_help or argv[0] not in COMMANDS:
        print(_usage(), file=sys.stdout if asked_help else sys.stderr)
        if argv and not asked_help:
            print(f"\npersonalens: unknown subcommand {argv[0]!r}", file=sys.stderr)
        sys.exit(0 if asked_help else 2)

    import hydra

    from personalens.config import register_resolvers
    from personalens.paths import project_path

    command = COMMANDS[argv[0]]
    label, overrides = command.name, _hydra_args(argv[1:], command.positional_list)
    if command.actions:
        action = argv[1] if len(argv) > 1 else ""
        if action not in command.actions:
            print(
                f"personalens {command.name}: error: say which action: {' or '.join(command.actions)}, "
                f"e.g. `personalens {command.name} {command.actions[0]} run.out_dir=runs/x`",
                file=sys.stderr,
            )
            sys.exit(2)
        label, overrides = f"{command.name} {action}", [*_hydra_args(argv[2:]), f"{command.name}.action={action}"]
    function = command.function()
    register_resolvers()

    @hydra.main(config_path=str(project_path("conf")), config_name="config", version_base="1.3")
    def app(cfg: DictConfig) -> None:
        from personalens import console
        from personalens.engines.stop import Stop, Stopped
        from personalens.errors import PersonalensError

        log_file = _route_library_output(command, label, cfg)
        console.show_personalens_logs()
        stop = Stop()
        # the commands that take a `stop` check it between steps; SIGUSR1 is SLURM's warning signal
        stops = {"stop": stop} if "stop" in inspect.signature(function).parameters else {}
        try:
            with stop.on_signals((signal.SIGTERM, signal.SIGUSR1)) if stops else nullcontext():
                code = function(cfg, **stops)
        except Stopped as err:
            print(
                f"personalens {label}: {err}; what was finished is written, run it again to resume",
                file=console.err(),
            )
            sys.exit(err.exit_status)
        except PersonalensError as err:
            print(f"personalens {label}: error: {err}", file=console.err())
            sys.exit(2)
        except Exception:
            traceback.print_exc()  # to the log file, when there is one
            if log_file is None:
                raise
            print(
                f"personalens {label}: failed: {sys.exc_info()[1]!r}; the traceback is in {log_file}",
                file=console.err(),
            )
            sys.exit(1)
        if code:
            sys.exit(code)

    sys.argv = [f"personalens {label}", *overrides]
    app()


if __name__ == "__main__":
    main()
