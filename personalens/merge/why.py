"""Why a shard is incomplete, from its commands' log files: every command that loads a model appends
to `<run>/logs/<command>[.shard-KKK-of-NNN].log` a header line per start and, when it ends by itself,
a closing line (`personalens generate: finished`, `...: error: ...`, `...: stopped by SIGUSR1 ...`;
cli.py). A last start with no closing line was killed from outside: a time limit, memory, a node
failure or a preemption, which the scheduler's own log of the task names."""

from __future__ import annotations

from pathlib import Path

STEPS = ("generate", "judge", "run")  # the commands that write a shard's dialogues or judgments
_HEADER = "===== personalens "


def log_path(out_dir: Path, step: str, index: int, count: int) -> Path:
    """Where `step` of shard `index` of `count` logs (cli.py names it so)."""
    shard = f".shard-{index:03d}-of-{count:03d}" if count > 1 else ""
    return Path(out_dir) / "logs" / f"{step}{shard}.log"


def shard_story(out_dir: Path, index: int, count: int) -> str:
    """How each step's last start of this shard ended, or that none ever started, in one line."""
    told = [told for step in STEPS if (told := _last_start(log_path(out_dir, step, index, count), step))]
    if told:
        return "; ".join(told)
    return "no log of its generate or judge (never started, or ran with verbose=true, which keeps no log)"


def _last_start(path: Path, step: str) -> str | None:
    """'generate: <its closing line>' for the last start logged in `path`; None without a log."""
    if not path.is_file():
        return None
    lines = path.read_text(errors="replace").splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith(_HEADER)]
    if not starts:
        return None
    closing = f"personalens {step}: "
    ended = [line for line in lines[starts[-1] :] if line.startswith(closing)]
    if ended:
        return f"{step}: {ended[-1][len(closing) :]}"
    started = lines[starts[-1]].rsplit(" at ", 1)[-1]
    return (
        f"{step}: started at {started} and never ended by itself (killed by a time limit, memory, a node "
        f"failure or a preemption, or still running: the scheduler's log of the task says which; {path})"
    )
