"""`personalens <subcommand> [DATA_ROOT] [hydra overrides...]`: every subcommand is a Hydra app
over the one config in conf/, so `key=value`, `group=option`, `--cfg job` and `-m` work as usual."""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable
from pathlib import Path

# commands that load models -> the folder whose logs/<command>.log takes the libraries' output
LOGGED_COMMANDS: dict[str, Callable] = {
    "generate": lambda cfg: cfg.run.out_dir,
    "judge": lambda cfg: cfg.run.out_dir,
    "run": lambda cfg: cfg.run.out_dir,
    "consistency": lambda cfg: cfg.run.out_dir,
    "build": lambda cfg: cfg.build.out_dir,
    "personalbench run": lambda cfg: cfg.personalbench.out_dir,
}

USAGE = """usage: personalens SUBCOMMAND [DATA_ROOT] [key=value ...]

subcommands:
  validate   check a data directory in the official layout and print its counts
  generate   simulate user-agent / assistant dialogues in lockstep (Parquet under run.out_dir)
  judge      score the dialogues of run.out_dir with the judge model
  merge      check that every scenario of the selection is present exactly once across shards
  report     write the paper's tables and figures for one or more runs
  run        generate, judge and report in one process, then print the Table 3 layout
  stats      print and write Table 1, Tables 6-9 and Figure 3 of the data (res/schema.json for 8-9)
  diversity  print and write Table 10's lexical diversity of a run's dialogues (or any dialogue Parquet)
  build      build a new PersonaLens-style dataset in the official layout (docs/build.md)
  consistency  check the profiles of a data root for conflicts (Figure 21) and print the flagged share
  agreement export   annotation sheet + guide for a seeded SD/MD sample of a run's dialogues (Table 5)
  agreement score    Fleiss' / Cohen's kappas of filled sheets against the judge (Table 5)
  personalbench run|export|score   PersonalBench on WildChat histories (docs/personalbench.md)

DATA_ROOT, if given, is shorthand for data.root=DATA_ROOT; --strict for data.strict=true (quirks of
the release that its own code tolerates, warnings by default, become errors). Everything else is a Hydra override,
e.g. `personalens generate data.users=sample50 model@assistant=llama31_8b assistant.path=/models/llama`.
`personalens SUBCOMMAND --help` shows the config."""


def _commands() -> dict[str, Callable]:
    # imported lazily so that `validate` never imports vLLM or torch
    from personalens import commands

    return {
        "validate": commands.validate,
        "generate": commands.generate,
        "judge": commands.judge,
        "merge": commands.merge,
        "report": commands.report,
        "run": commands.run,
        "stats": commands.stats,
        "diversity": commands.diversity,
        "build": commands.build,
        "consistency": commands.consistency,
        "agreement": commands.agreement,
        "personalbench": commands.personalbench,
    }


# subcommands whose next word picks an action: `personalens agreement export` = agreement.action=export
ACTIONS = {"agreement": ("export", "score"), "personalbench": ("run", "export", "score")}


def _hydra_args(rest: list[str]) -> list[str]:
    """Turn a leading positional DATA_ROOT into the override data.root=DATA_ROOT, and --strict
    into data.strict=true."""
    strict = ["data.strict=true"] if "--strict" in rest else []
    rest = [arg for arg in rest if arg != "--strict"]
    if rest and not rest[0].startswith("-") and "=" not in rest[0]:
        rest = [f"data.root={rest[0]}", *rest[1:]]
    return [*rest, *strict]


def _route_library_output(name: str, cfg) -> Path | None:
    """The log file the libraries write to (and the terminal is told of), or None when this
    command loads no model or `verbose` keeps everything on the terminal."""
    from personalens import console

    if name not in LOGGED_COMMANDS:
        return None
    if cfg.get("verbose", False):
        console.libraries_to_stderr()
        return None
    shard = f".shard-{cfg.shard.index:03d}-of-{cfg.shard.count:03d}" if cfg.shard.count > 1 else ""
    log_file = Path(LOGGED_COMMANDS[name](cfg)) / "logs" / f"{name.replace(' ', '-')}{shard}.log"  # one per array task
    console.to_log_file(log_file)
    print(f"personalens {name}: library logs (vLLM, torch) go to {log_file}", file=console.err())
    return log_file


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    commands = _commands()
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in commands:
        print(USAGE, file=sys.stderr if argv and argv[0] not in ("-h", "--help") else sys.stdout)
        if argv and argv[0] not in ("-h", "--help"):
            print(f"\npersonalens: unknown subcommand {argv[0]!r}", file=sys.stderr)
        sys.exit(0 if argv and argv[0] in ("-h", "--help") else 2)

    import hydra

    from personalens.config import register_resolvers
    from personalens.paths import project_path

    name = argv[0]
    command = commands[name]
    register_resolvers()

    @hydra.main(config_path=str(project_path("conf")), config_name="config", version_base="1.3")
    def app(cfg) -> None:
        from personalens import console
        from personalens.errors import PersonalensError

        log_file = _route_library_output(name, cfg)
        console.show_personalens_logs()
        try:
            code = command(cfg)
        except PersonalensError as err:
            print(f"personalens {name}: error: {err}", file=console.err())
            sys.exit(2)
        except Exception:
            traceback.print_exc()  # to the log file, when there is one
            if log_file is None:
                raise
            print(
                f"personalens {name}: failed: {sys.exc_info()[1]!r}; the traceback is in {log_file}", file=console.err()
            )
            sys.exit(1)
        if code:
            sys.exit(code)

    overrides = _hydra_args(argv[1:])
    if name in ACTIONS:
        action = argv[1] if len(argv) > 1 else ""
        if action not in ACTIONS[name]:
            print(
                f"personalens {name}: error: say which action: {' or '.join(ACTIONS[name])}, "
                f"e.g. `personalens {name} {ACTIONS[name][0]} run.out_dir=runs/x`",
                file=sys.stderr,
            )
            sys.exit(2)
        name, overrides = f"{name} {action}", [*_hydra_args(argv[2:]), f"{name}.action={action}"]
    sys.argv = [f"personalens {name}", *overrides]
    app()


if __name__ == "__main__":
    main()
