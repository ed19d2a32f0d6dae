"""The `personalens ...` command lines that the docs write, and whether each one's config resolves.

Collected from README.md, docs/*.md (code blocks and inline code), the comments of conf/**/*.yaml
and of slurm/*.sh / *.sbatch (`slurm/submit.sh N OVERRIDES` stands for generate, judge and report
with those overrides). Each command goes through the real CLI's argument handling (personalens/cli.py:
subcommand, action, positional RUN / DATA_ROOT, --strict) and then Hydra's composition of conf/ in
this process, in struct mode, as `personalens <cmd> --cfg job` would: an unknown key, a missing group
option or a malformed override fails, while a command needing data or models it cannot have here
still parses, because nothing is loaded. Placeholders (`$VAR`, `<N-1>`, `...`, `/path/to/...`) keep
their key checked but not their value."""

from __future__ import annotations

import functools
import re
import shlex
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from personalens import cli
from personalens.config.layout_plan import JOBS as LAYOUT_JOBS

REPO = Path(__file__).resolve().parents[1]
_PROGRAM = re.compile(r"(?:^|[\s;&|(`'\"])(?:\S*/)?personalens\s+(?=[a-z])")
_SUBMIT = re.compile(r"(?:^|\s)(?:\S*/)?slurm/submit\.sh\s+(?:\d+|\$\w+|\$\{\w+\}|SHARDS|N)\s+")
_PLACEHOLDER = re.compile(r"\$|<[^=]*>|\.\.\.|^[A-Z][A-Z_]*$")
_FLAGS_WITH_VALUE = ("--cfg", "-c", "--package", "-p", "--info")


@dataclass(frozen=True)
class DocCommand:
    where: str  # "docs/cluster.md:12"
    text: str  # the command as written, from `personalens` on

    def __str__(self) -> str:
        return f"{self.where}: {self.text}"


def sources(repo: Path = REPO) -> list[Path]:
    """README.md, docs/*.md, conf/**/*.yaml and slurm/*.sh / *.sbatch."""
    return [
        repo / "README.md",
        *sorted((repo / "docs").glob("*.md")),
        *sorted((repo / "conf").rglob("*.yaml")),
        *sorted((repo / "slurm").glob("*.sh")),
        *sorted((repo / "slurm").glob("*.sbatch")),
    ]


def collect(paths: Iterable[Path], repo: Path = REPO) -> list[DocCommand]:
    """Every command line the files write (a file outside `repo` is named by its full path)."""
    found = []
    for path in paths:
        name = str(path.relative_to(repo)) if path.is_relative_to(repo) else str(path)
        comment = path.suffix in (".yaml", ".sh", ".sbatch")
        for number, line, code in _logical_lines(path):
            for text in _commands_in(line, code, comment):
                found.append(DocCommand(f"{name}:{number}", text))
    return found


def _logical_lines(path: Path) -> Iterator[tuple[int, str, bool]]:
    """(first line number, text, in a markdown code block) per line of what the file shows: markdown
    whole, comments only of YAML and shell; lines ending in a backslash joined with the next."""
    comments = path.suffix in (".yaml", ".sh", ".sbatch")
    pending: tuple[int, str] | None = None
    fenced = False
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        if comments:
            hash_at = raw.find("#")
            if hash_at < 0:
                pending = None
                continue
            raw = raw[hash_at + 1 :]
        elif raw.lstrip().startswith("```"):
            fenced, pending = not fenced, None
            continue
        line = raw.strip()
        if pending is not None:
            number, line = pending[0], f"{pending[1]} {line}"
        if line.endswith("\\"):
            pending = (number, line[:-1].rstrip())
            continue
        pending = None
        yield number, line, fenced


def _commands_in(line: str, code: bool, comment: bool) -> Iterator[str]:
    """The command texts in one line: a markdown code block's whole line, a comment's whole line
    and, elsewhere, each inline code span. `personalens` must be followed by one of its subcommands
    except at the start of a code block's line (where a misspelt subcommand is caught), so that prose
    ("personalens runs ...") and printed output ("personalens generate: error: ...") are not taken
    for commands."""
    texts = [line] if code or comment else re.findall(r"`([^`]+)`", line)
    for text in texts:
        text = re.sub(r"<[^<>]*>", lambda m: m.group(0).replace(" ", "_"), text)  # <the same overrides>
        for match in _PROGRAM.finditer(text):
            rest = _until_shell_end(text[match.end() :])
            first = rest.split(" ", 1)[0]
            at_start = code and not text[: match.start()].strip(" $;&(")
            if re.match(r"[a-z-]+:", rest) or not (first in cli.COMMANDS or at_start):
                continue
            yield "personalens " + rest
        for match in _SUBMIT.finditer(text):
            overrides = _until_shell_end(text[match.end() :])
            yield from (f"personalens {step} {overrides}" for step in ("generate", "judge", "report"))


def _until_shell_end(text: str) -> str:
    """The command's own words: up to a shell comment, `;`, `&&`, `|`, `>`, a closing quote or
    paren, a backtick or a gap of three spaces (a column of a listing)."""
    out = re.split(r"\s#|`|\s{3,}|\s*(?:;|&&|\|\||\s\|\s|\s>|\)\s*$|\"\s*$|\)\")", text, maxsplit=1)[0]
    return out.strip()


def words(text: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError:  # an unbalanced quote in prose: split on spaces
        return text.split()


def check_all(commands: Iterable[DocCommand], config_dir: Path = REPO / "conf") -> dict[DocCommand, str]:
    """The commands whose config does not compose, with why, in one line each (Hydra initialized once)."""
    _composed.cache_clear()  # a composition is only valid for the config folder it was made from
    with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
        return {c: problem for c in commands if (problem := check(c))}


def check(command: DocCommand) -> str | None:
    """None when the command's config composes; else why not, in one line. Inside `check_all`."""
    text = re.sub(r"\[[^\[\]=]*\.\.\.\]|\[key=value \.\.\.\]", " ", command.text)  # [hydra overrides...]
    argv = words(text)[1:]
    argv = [a for a in argv if a not in ("-m", "--multirun", "--help", "-h", "--resolve", "...")]
    argv = [a for a in argv if not re.fullmatch(r"<[^<>=]*>", a)]  # a placeholder word: <the_same_overrides>
    for flag in _FLAGS_WITH_VALUE:
        while flag in argv:
            at = argv.index(flag)
            del argv[at : at + 2]
    if not argv or argv[0] not in cli.COMMANDS:
        return f"unknown subcommand {argv[0] if argv else '(none)'!r}"
    sub = cli.COMMANDS[argv[0]]
    actions = [""]
    rest = argv[1:]
    if sub.actions:
        if not rest:
            return None  # the command named, not run: "`personalens agreement`"
        named = list(sub.actions) if rest[0] == "ACTION" else rest[0].split("|")
        if not set(named) <= set(sub.actions):
            return f"{sub.name}: say which action: {' or '.join(sub.actions)}"
        actions, rest = named, rest[1:]
    for action in actions:
        try:
            overrides = sub.overrides(rest, action)
        except cli.UsageError as err:
            return str(err)
        # `layout=plan.json` names a file the user's `plan` writes: the CLI takes it on generate and judge
        # (config/layout_plan.py) and composes the overrides it holds; only where it may stand is checked
        planned = [o for o in overrides if o.startswith("layout=")]
        if planned and sub.name not in LAYOUT_JOBS:
            return f"{planned[0]}: only generate and judge run a planned layout"
        problem = _composed(tuple(o for o in overrides if o not in planned))
        if problem:
            return problem
    return None


@functools.cache
def _composed(overrides: tuple[str, ...]) -> str | None:
    return _compose(list(overrides))


def _compose(overrides: list[str]) -> str | None:
    exact = [o for o in overrides if not _placeholder(o)]
    keys = [o.split("=", 1)[0] for o in overrides if _placeholder(o) and not _placeholder(o.split("=", 1)[0])]
    try:
        cfg = compose("config", overrides=exact)
    except (HydraException, OmegaConfBaseException, ValueError) as err:
        return " ".join(str(err).split())
    for key in keys:
        plain = key.lstrip("+~")
        if "@" in plain or "/" in plain:
            continue  # a group choice with a placeholder option
        node = OmegaConf.to_container(cfg, resolve=False)
        for part in plain.split("."):
            if not isinstance(node, dict) or part not in node:
                return f"Could not override '{plain}': Key '{plain}' is not in the config"
            node = node[part]
    return None


def _placeholder(token: str) -> bool:
    value = token.split("=", 1)[-1]
    return bool(_PLACEHOLDER.search(value))


_OPTION = re.compile(r"^~?\+{0,2}([a-z_][a-z0-9_]*(?:\.[a-z_][a-z0-9_]*)+)(?:=\S*)?$")
_FILE_SUFFIXES = {
    "md",
    "html",
    "json",
    "yaml",
    "yml",
    "log",
    "py",
    "parquet",
    "sh",
    "sbatch",
    "csv",
    "png",
    "txt",
    "svg",
    "tex",
}


@dataclass(frozen=True)
class DocOption:
    where: str  # "docs/cluster.md:12"
    name: str  # the dotted option name as written, without its value: `plan.time_limit`

    def __str__(self) -> str:
        return f"{self.where}: `{self.name}`"


def options(paths: Iterable[Path], top: Iterable[str], repo: Path = REPO) -> list[DocOption]:
    """Every dotted option name a markdown file writes in an inline code span of its prose
    (`plan.time_limit`, `protocol.assistant.max_tokens=1825`) whose first part is one of `top`, the
    config's top-level keys; file names (`report.md`) are not option names."""
    top = set(top)
    found = []
    for path in paths:
        name = str(path.relative_to(repo)) if path.is_relative_to(repo) else str(path)
        for number, line, code in _logical_lines(path):
            if code:
                continue
            for span in re.findall(r"`([^`]+)`", line):
                match = _OPTION.match(span.strip())
                if not match:
                    continue
                parts = match.group(1).split(".")
                if parts[0] in top and parts[-1] not in _FILE_SUFFIXES:
                    found.append(DocOption(f"{name}:{number}", match.group(1)))
    return found


# group options whose keys the default composition lacks: a role's server block (conf/engine/server.yaml)
# and continuous scheduling's own settings (conf/scheduling/continuous.yaml)
WITH_THEIR_KEYS = (
    *(f"engine@{role}=server" for role in ("assistant", "user_agent", "judge", "builder")),
    "scheduling=continuous",
)


def _whole(config_dir: Path) -> dict:
    """`conf/config.yaml` with every command's sections (each command composes a part of it:
    personalens/cli.py SECTIONS) and the group options of WITH_THEIR_KEYS."""
    with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
        return OmegaConf.to_container(compose("config", overrides=list(WITH_THEIR_KEYS)), resolve=False)


def unresolved(found: Iterable[DocOption], config_dir: Path = REPO / "conf") -> list[DocOption]:
    """The option names that are not keys of the whole composed config (`_whole`)."""
    whole = _whole(config_dir)
    out = []
    for option in found:
        node = whole
        for part in option.name.split("."):
            if node == {}:
                break  # a mapping that takes any key: `assistant.chat_template_kwargs.reasoning_effort`
            if not isinstance(node, dict) or part not in node:
                out.append(option)
                break
            node = node[part]
    return out


def top_level_keys(config_dir: Path = REPO / "conf") -> list[str]:
    return list(_whole(config_dir))
