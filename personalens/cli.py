"""`personalens <subcommand> [DATA_ROOT] [hydra overrides...]`: every subcommand is a Hydra app
over the one config in conf/, so `key=value`, `group=option`, `--cfg job` and `-m` work as usual."""

from __future__ import annotations

import sys
from typing import Callable

USAGE = """usage: personalens SUBCOMMAND [DATA_ROOT] [key=value ...]

subcommands:
  validate   check a data directory in the official layout and print its counts
  generate   simulate user-agent / assistant dialogues in lockstep (Parquet under run.out_dir)
  judge      score the dialogues of run.out_dir with the judge model
  merge      check that every scenario of the selection is present exactly once across shards
  report     write the paper's tables and figures for one or more runs
  run        generate, judge and report in one process, then print the Table 3 layout
  personalbench run|export|score   PersonalBench on WildChat histories (docs/personalbench.md)

DATA_ROOT, if given, is shorthand for data.root=DATA_ROOT. Everything else is a Hydra override,
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
        "personalbench": commands.personalbench,
    }


def _hydra_args(rest: list[str]) -> list[str]:
    """Turn a leading positional DATA_ROOT into the override data.root=DATA_ROOT."""
    if rest and not rest[0].startswith("-") and "=" not in rest[0]:
        return [f"data.root={rest[0]}", *rest[1:]]
    return rest


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
        from personalens.errors import PersonalensError
        try:
            code = command(cfg)
        except PersonalensError as err:
            print(f"personalens {name}: error: {err}", file=sys.stderr)
            sys.exit(2)
        if code:
            sys.exit(code)

    rest = argv[1:]
    if name == "personalbench" and rest and "=" not in rest[0] and not rest[0].startswith("-"):
        rest = [f"personalbench.action={rest[0]}", *rest[1:]]  # personalbench ACTION [overrides]
    sys.argv = [f"personalens {name}", *_hydra_args(rest)]
    app()


if __name__ == "__main__":
    main()
