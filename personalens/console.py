"""What a person sees in the terminal: personalens' own lines there, the libraries' logs in a file.

vLLM, torch and transformers write dozens of lines per model load, from this process, from C++
and from vLLM's worker processes (forked or spawned). The one place all of them meet is the
process's file descriptors 1 and 2: `to_log_file` points both at the log file, so every writer,
children included, lands there, while personalens keeps duplicates of the terminal's descriptors
for its results (`out`), progress bars, warnings and errors (`err`).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path
from typing import TextIO

_terminal: dict[str, TextIO] = {}

log = logging.getLogger("personalens")


def out() -> TextIO:
    """Where results go (the Table 3 layout): the terminal's stdout."""
    return _terminal.get("out", sys.stdout)


def err() -> TextIO:
    """Where progress, warnings and errors go: the terminal's stderr."""
    return _terminal.get("err", sys.stderr)


def show_personalens_logs(level: int = logging.INFO) -> None:
    """personalens' own log lines (model loads, summaries, data warnings) on the terminal's stderr,
    as bare messages; they still reach the log file through the root logger."""
    handler = logging.StreamHandler(_TerminalErr())
    handler.setFormatter(logging.Formatter("%(message)s"))
    log.addHandler(handler)
    log.setLevel(level)


def to_log_file(path: Path) -> None:
    """Send everything written to descriptors 1 and 2 (libraries, C++, worker processes, Python
    warnings and stray prints) to `path`, appending; keep the terminal for `out()` and `err()`."""
    if _terminal:
        return  # already redirected (`run` goes through generate, judge and report)
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    _terminal["out"] = _terminal_stream(1)
    _terminal["err"] = _terminal_stream(2)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    handler = logging.StreamHandler(sys.stderr)  # descriptor 2: the file; personalens' lines too
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.getLogger().addHandler(handler)
    logging.captureWarnings(True)  # Python warnings go through logging, hence to the file
    with open(path, "a", encoding="utf-8") as f:
        f.write(f"\n===== personalens {' '.join(sys.argv[1:])} at {time.strftime('%Y-%m-%d %H:%M:%S')}\n")


def libraries_to_stderr() -> None:
    """Verbose mode: libraries stay on the terminal, but on stderr, so stdout carries results only."""
    if _terminal:
        return
    sys.stdout.flush()
    _terminal["out"] = _terminal_stream(1)
    os.dup2(2, 1)


def _terminal_stream(fd: int) -> TextIO:
    """A duplicate of the terminal's descriptor `fd`: text that cannot be encoded (a file name that is
    not UTF-8, carried as surrogates) is written escaped rather than failing the message it is in."""
    return os.fdopen(os.dup(fd), "w", buffering=1, encoding="utf-8", errors="backslashreplace")


class _TerminalErr:
    """A stream that resolves `err()` on every write, so a handler made before a redirect follows it."""

    def write(self, text: str) -> int:
        return err().write(text)

    def flush(self) -> None:
        err().flush()
