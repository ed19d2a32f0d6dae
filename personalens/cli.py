"""`personalens <subcommand> [RUN | DATA_ROOT] [hydra overrides...]`: every subcommand is a Hydra app
over the one config in conf/, so `key=value`, `group=option`, `--cfg job` and `-m` work as usual. A
command whose subject is a run takes its directory as RUN, one about data its DATA_ROOT."""

from __future__ import annotations

import importlib
import inspect
import re
import sys
import traceback
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig

from personalens.engines.stop import Stop, Stopped


class UsageError(Exception):
    """Positional arguments a command does not take (main prints the message as one line, exit 2)."""


@dataclass(frozen=True)
class Positional:
    """The leading positional arguments of a command: `name` in usage and errors, the key one of them
    sets, and the list key several fill (None: it takes one at most)."""

    name: str
    key: str
    many: str | None = None

    def overrides(self, command: str, args: list[str]) -> list[str]:
        from personalens.config.core import quoted_value

        if len(args) > 1 and self.many is None:
            raise UsageError(
                f"personalens {command}: error: takes one {self.name}, got {len(args)} positional arguments: "
                f"{' '.join(args)}"
            )
        if len(args) == 1 and self.key != self.many:
            return [f"{self.key}={quoted_value(args[0])}"]
        return [f"{self.many}=[{','.join(quoted_value(a) for a in args)}]"] if args else []


DATA_ROOT = Positional("DATA_ROOT", "data.root")
RUN = Positional("RUN", "run.out_dir")


@dataclass(frozen=True)
class Subcommand:
    name: str
    help: str
    target: str  # "module:function", imported only when the subcommand runs (`validate` never loads vLLM)
    # commands that load models: the folder whose logs/<command>.log takes the libraries' output
    logs_under: Callable[[DictConfig], str | None] | None = None
    actions: tuple[str, ...] = ()  # the next word picks one: `personalens agreement export`
    positional: Positional | None = DATA_ROOT  # what its leading positional paths are (None: it takes none)
    reads: tuple[str, ...] = ()  # the SECTIONS it reads; the others are left out of its config

    def overrides(self, rest: list[str], action: str = "") -> list[str]:
        """Hydra's arguments for `personalens NAME [ACTION] REST`: the positional arguments turned into
        overrides (a UsageError for those it does not take), the action's, and the deletions of the
        sections it does not read (`dropped`), Hydra's flags (`--cfg job`) last."""
        given = _hydra_args(rest, f"{self.name} {action}".strip(), self.positional)
        at = next((i for i, arg in enumerate(given) if arg.startswith("-")), len(given))
        given = [*given[:at], *([f"{self.name}.action={action}"] if action else []), *given[at:]]
        return [*self.dropped(given), *given]

    def dropped(self, overrides: list[str]) -> list[str]:
        """Hydra deletions of the SECTIONS this command does not read, but for a section an override
        names (`slurm/submit.sh` gives generate, judge and report the same overrides, and each still
        composes all of them, typos caught)."""
        named = {_override_key(o) for o in overrides}
        return [
            f"~{section}"
            for section in SECTIONS
            if section not in self.reads and not any(_names(key, section) for key in named)
        ]

    def function(self) -> Callable[[DictConfig], int]:
        module, function = self.target.split(":")
        return getattr(importlib.import_module(module), function)


# config sections that one command or a few read (the rest, data, models of the dialogue, protocol,
# fidelity, run, shard, ..., every command composes): a command's config holds only those in its
# `reads`, so `personalens generate --cfg job` shows what generate reads. A `model@X` entry is the
# group choice whose config lands under X.
SECTIONS = (
    "personalbench", "datagen", "model@builder", "agreement", "plan", "compare", "stats", "diversity",
    "model@judge", "judges", "judging", "report", "protocol.judge",
)  # fmt: skip
_JUDGING = ("model@judge", "judges", "judging", "protocol.judge")


def _override_key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("~+")


def _names(key: str, section: str) -> bool:
    """Whether an override of `key` (`model@judge`, `engine@judge`, `judge.path`, `protocol=quick`) sets
    `section`."""
    where = section.split("@", 1)[-1]
    return (
        key in (section, where)
        or key.startswith(f"{where}.")
        or key.startswith(f"{section}/")
        or ("@" in key and key.split("@", 1)[-1] == where)
    )


def _run_dir(cfg: DictConfig) -> str:
    return cfg.run.out_dir


def _personalbench_run_dir(cfg: DictConfig) -> str | None:
    return cfg.personalbench.out_dir if cfg.personalbench.action == "run" else None  # only `run` loads models


SUBCOMMANDS = (
    Subcommand("validate", "check a data directory in the official layout and print its counts",
               "personalens.validation.command:validate"),
    Subcommand("generate", "simulate user-agent / assistant dialogues in lockstep (Parquet under run.out_dir)",
               "personalens.simulate.command:generate", _run_dir),
    Subcommand("judge", "score the dialogues of RUN (run.out_dir) with the judge model",
               "personalens.judge.command:judge", _run_dir, positional=RUN, reads=_JUDGING),
    Subcommand("merge", "check that every scenario of the selection is present exactly once across RUN's shards",
               "personalens.merge.command:merge", positional=RUN, reads=("judging",)),
    Subcommand("report", "write the paper's tables and figures for one run (RUN) or several (RUN RUN ...)",
               "personalens.report.command:report", positional=Positional("RUN", "run.out_dir", "report.runs"),
               reads=("report",)),
    Subcommand("compare", "paired differences between runs (and a run's prompt settings) with user-clustered intervals",
               "personalens.compare.command:compare", positional=Positional("RUN", "compare.runs", "compare.runs"),
               reads=("compare",)),
    Subcommand("run", "generate, judge and report in one process, then print the Table 3 layout",
               "personalens.cli:run", _run_dir, reads=(*_JUDGING, "report")),
    Subcommand("plan", "a dry run loading no model: selection, shards, each model's placement and memory, tokens, time",
               "personalens.plan.command:plan", reads=("plan", "report", *_JUDGING)),
    Subcommand("roles", "each role's model, sampling (with each value's origin) and request budget; loads no model",
               "personalens.plan.roles:roles", positional=None, reads=_JUDGING),
    Subcommand("stats", "print and write Table 1, Tables 6-9 and Figure 3 of the data (res/schema.json for 8-9)",
               "personalens.validation.command:stats", reads=("stats",)),
    Subcommand("diversity", "print and write Table 10's lexical diversity of RUN's dialogues (or any dialogue Parquet)",
               "personalens.validation.command:diversity", positional=RUN, reads=("diversity",)),
    Subcommand("build", "build a new PersonaLens-style dataset in the official layout (docs/build.md)",
               "personalens.cli:build", lambda cfg: cfg.datagen.out_dir, positional=None,
               reads=("datagen", "model@builder")),
    Subcommand("consistency", "check the profiles of a data root for conflicts (Figure 21) and print the flagged share",
               "personalens.datagen.command:consistency", _run_dir, reads=("datagen", "model@builder")),
    Subcommand("agreement", "Table 5: annotation sheets and guide (export), kappas against the judge (score) of RUN",
               "personalens.agreement.command:agreement", actions=("export", "score"), positional=RUN,
               reads=("agreement", "report", *_JUDGING)),
    Subcommand("personalbench", "PersonalBench on WildChat histories (docs/personalbench.md)",
               "personalens.personalbench.command:personalbench", _personalbench_run_dir,
               actions=("run", "export", "score"), positional=Positional("RUN", "personalbench.out_dir"),
               reads=("personalbench", "model@judge")),
)  # fmt: skip
COMMANDS = {c.name: c for c in SUBCOMMANDS}


def _usage() -> str:
    names = [
        " ".join(
            [
                c.name,
                *(["|".join(c.actions)] if c.actions else []),
                *([f"[{c.positional.name}{' ...' if c.positional.many else ''}]"] if c.positional else []),
            ]
        )
        for c in SUBCOMMANDS
    ]
    width = max(map(len, names)) + 2
    lines = [f"  {n.ljust(width)}{c.help}" for n, c in zip(names, SUBCOMMANDS)]
    return (
        "usage: personalens SUBCOMMAND [RUN | DATA_ROOT] [key=value ...]\n\nsubcommands:\n" + "\n".join(lines) + "\n\n"
        "RUN, if given, is shorthand for run.out_dir=RUN (`report RUN RUN ...` for report.runs, `compare RUN_A\n"
        "RUN_B ...` for compare.runs, `personalbench` for personalbench.out_dir); DATA_ROOT for data.root=DATA_ROOT.\n"
        "A positional argument a command does not take is refused. --strict for data.strict=true (quirks of\n"
        "the release that its own code tolerates, warnings by default, become errors). Everything else is a\n"
        "Hydra override, e.g. `personalens generate data.users=sample50 model@assistant=llama31_8b\n"
        "assistant.path=/models/llama`. `personalens SUBCOMMAND --help` shows the config."
    )


def run(cfg: DictConfig, stop: Stop | None = None) -> int:
    """generate, judge and report in one process. Every model's layout is planned before any loads.
    model@judge shares the dialogue engines where its model config is a dialogue role's (loaded once);
    otherwise the dialogue engines, managed servers included, are freed before the judges load. Each
    further model of a judge panel loads after the one before it is freed."""
    from personalens.config import run as R
    from personalens.judge.command import judge, judge_groups, settings
    from personalens.simulate.command import generate

    roles = R.run_roles(cfg)
    shared = "judge" in roles
    engines = R.engines(cfg, roles, stop)
    # a panel or a judge setting that cannot work fails now, not after the dialogues
    groups = judge_groups(cfg, engines if shared else None, stop)
    settings(cfg)
    code = generate(cfg, engines, stop)
    if not shared:
        engines.close()
    code = code or judge(cfg, stop=stop, planned=groups)
    if code:
        return code
    from personalens.report.command import report  # matplotlib and pandas: seconds, only once there is a report

    return report(cfg)


def _positional(arg: str) -> bool:
    # a path that exists is positional even when it holds "=" (a key=value override otherwise); "~key"
    # deletes a key in Hydra
    return not arg.startswith(("-", "~")) and ("=" not in arg or Path(arg).exists())


def _hydra_args(rest: list[str], command: str = "validate", positional: Positional | None = DATA_ROOT) -> list[str]:
    """Turn the leading positional arguments into `positional`'s overrides, and --strict into
    data.strict=true. A positional argument the command does not take, or one among the overrides
    (not the value of a flag such as `--cfg job`), is refused with a UsageError."""
    strict = ["data.strict=true"] if "--strict" in rest else []
    rest = [arg for arg in rest if arg != "--strict"]
    k = next((i for i, arg in enumerate(rest) if not _positional(arg)), len(rest))
    stray = [arg for i, arg in enumerate(rest[k:], k) if _positional(arg) and not rest[i - 1].startswith("-")]
    if stray:
        where = f"{positional.name} goes before the overrides" if positional else "it takes no positional argument"
        raise UsageError(f"personalens {command}: error: {stray[0]!r} is not a key=value override, and {where}")
    if k and positional is None:
        raise UsageError(f"personalens {command}: error: takes no positional argument, got {' '.join(rest[:k])}")
    removed = next((arg for arg in rest[k:] if _NULL_SAMPLING.fullmatch(arg)), None)
    if removed:  # Hydra cannot delete a null key, and its message says the key does not exist
        raise UsageError(
            f"personalens {command}: error: {removed}: a sampling key is not removed; "
            f"{removed[1:]}=null leaves it to the model's own value, else the paper's (docs/models.md)"
        )
    _check_served(command, rest[k:])
    return [*(positional.overrides(command, rest[:k]) if positional else []), *rest[k:], *strict]


def _check_served(command: str, overrides: list[str]) -> None:
    """A role's server keys need the option that composes its server block (conf/engine/server.yaml,
    conf/model/server.yaml), which Hydra's own message for the missing key does not name; an
    experiment config may compose it, so only overrides without one are checked."""
    if any(arg.lstrip("+").startswith("experiment=") for arg in overrides):
        return
    for arg in overrides:
        served = _SERVER_KEY.match(arg)
        role = served and served.group(1)
        served_by = (f"engine@{role}=server", f"model@{role}=server")
        if role and not any(other.lstrip("+") in served_by for other in overrides):
            raise UsageError(
                f"personalens {command}: error: {arg}: {role}'s server block comes with engine@{role}=server "
                f"(its model config on a server the lab runs, docs/cluster.md); give it before {role}.server keys"
            )


# an override of a role's server block
_SERVER_KEY = re.compile(r"(user_agent|assistant|judge|builder)\.server\.")
# the protocol's sampling keys that are null unless a config sets them (conf/protocol/*.yaml)
_NULL_SAMPLING = re.compile(r"~protocol\.(user_agent|assistant|judge)\.(temperature|top_p|thinking_budget)")


def build(cfg: DictConfig, engine: Callable | None = None, stop: Stop | None = None) -> int:
    """Build new data (datagen), then describe it as `personalens stats` would (validation)."""
    from personalens.datagen.command import build as build_data
    from personalens.validation.command import describe_built

    built = build_data(cfg, engine, stop)
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


def _last_word(line: str, log_file: Path | None) -> None:
    """A command's closing line on the terminal and, when there is one, at the end of its log file,
    where `personalens merge` reads why a shard is incomplete (merge/why.py)."""
    from personalens import console

    print(line, file=console.err())
    if log_file is not None:
        print(line, file=sys.stderr, flush=True)  # descriptor 2 is the log file


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
    label, rest, action = command.name, argv[1:], ""
    if command.actions:
        action = argv[1] if len(argv) > 1 else ""
        if action not in command.actions:
            print(
                f"personalens {command.name}: error: say which action: {' or '.join(command.actions)}, "
                f"e.g. `personalens {command.name} {command.actions[0]} runs/x`",
                file=sys.stderr,
            )
            sys.exit(2)
        label, rest = f"{command.name} {action}", argv[2:]
    from personalens.config.layout_plan import check, expand
    from personalens.errors import PersonalensError

    try:
        # `layout=plan.json` (generate, judge): the layout plan chose, as overrides (config/layout_plan.py)
        overrides, layout = expand(command.name, command.overrides(rest, action))
    except UsageError as err:
        print(err, file=sys.stderr)
        sys.exit(2)
    except PersonalensError as err:
        print(f"personalens {label}: error: {err}", file=sys.stderr)
        sys.exit(2)
    function = command.function()
    register_resolvers()

    @hydra.main(config_path=str(project_path("conf")), config_name="config", version_base="1.3")
    def app(cfg: DictConfig) -> None:
        from personalens import console

        log_file = _route_library_output(command, label, cfg)
        console.show_personalens_logs()
        # a command that takes a `stop` (one that loads models) has one way to stop early
        # (engines/stop.py): SIGTERM, Ctrl-C and SLURM's warning signal SIGUSR1 ask for it, its engines and
        # steps check it, and what it started is stopped when it ends, however it ends
        stop = Stop()
        stops = {"stop": stop} if "stop" in inspect.signature(function).parameters else {}
        try:
            if layout is not None:
                check(layout, cfg)
                print(layout.line(), file=console.err())
            with stop.on_signals() if stops else nullcontext():
                code = function(cfg, **stops)
        except Stopped as err:
            _last_word(f"personalens {label}: {err}; what was finished is written, run it again to resume", log_file)
            sys.exit(err.exit_status)
        except PersonalensError as err:
            _last_word(f"personalens {label}: error: {err}", log_file)
            sys.exit(2)
        except Exception:
            traceback.print_exc()  # to the log file, when there is one
            if log_file is None:
                raise
            _last_word(f"personalens {label}: failed: {sys.exc_info()[1]!r}; the traceback is in {log_file}", log_file)
            sys.exit(1)
        finally:
            stop.close()
        if log_file is not None:
            print(f"personalens {label}: {'exited with code ' + str(code) if code else 'finished'}", file=sys.stderr)
        if code:
            sys.exit(code)

    sys.argv = [f"personalens {label}", *overrides]
    app()


if __name__ == "__main__":
    main()
