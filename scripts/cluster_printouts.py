"""Rerun the `personalens plan` commands whose printouts docs/cluster.md shows, and rewrite them.

Each printout in docs/cluster.md follows a marker line

    <!-- printout: personalens plan OVERRIDES | until: WORD | commit: HASH -->

and is the fenced block right after it: the lines of the plan's output from `placement on` up to
the first line that starts with WORD (`reproducible`, `time`, ...). The command runs as written
but for what this machine cannot have: a model directory `/models/<name>` is one holding only that
model's published config.json (tests/fixtures/architectures/), each role whose path or tokenizer is
such a directory is counted with the embedded SmolLM2 tokenizer, and `data.root=/data/release-copy`
is the bundled sample's users copied to 1,500 (bench/release_copy.py). HASH becomes the commit the
printouts were made at (HEAD). tests/test_cluster_printouts.py checks that every marker's command
composes and its commit exists.

    python scripts/cluster_printouts.py [--check]   # --check: exit 1 where a printout would change
"""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "cluster.md"
MARKER = re.compile(r"^<!-- printout: (personalens plan .+?) \| until: (\S+) \| commit: (\w+) -->$")
# /models/<directory> -> its architecture in tests/fixtures/architectures/
ARCHITECTURES = {
    "Llama-3.1-8B-Instruct": "llama31_8b",
    "Llama-3.1-70B-Instruct": "llama31_70b",
    "Qwen2.5-72B-Instruct": "qwen25_72b",
}
RELEASE_COPY = "/data/release-copy"


@dataclass(frozen=True)
class Printout:
    line: int  # 0-based index of the marker line
    command: str
    until: str
    commit: str
    block: tuple[int, int]  # the fenced block's first and last line (its fences), 0-based


def printouts(text: str) -> list[Printout]:
    """The markers of a document and the fenced block after each; a marker without one raises."""
    lines = text.splitlines()
    found = []
    for i, line in enumerate(lines):
        match = MARKER.match(line)
        if not match:
            continue
        if i + 1 >= len(lines) or lines[i + 1] != "```":
            raise ValueError(f"docs/cluster.md:{i + 1}: a printout marker not followed by a ``` block")
        end = next(j for j in range(i + 2, len(lines)) if lines[j] == "```")
        found.append(Printout(i, match.group(1), match.group(2), match.group(3), (i + 1, end)))
    return found


def runnable(command: str, work: Path, tokenizer: str) -> list[str]:
    """The command's arguments with this machine's stand-ins (see the module's docstring)."""
    args = shlex.split(command)[2:]
    out, stood_in = [], set()
    for arg in args:
        key, _, value = arg.partition("=")
        if value.startswith("/models/"):
            role, field = key.split(".", 1)
            stood_in.add(role)
            if field == "tokenizer":
                arg = f"{key}={tokenizer}"
            else:
                folder = work / "models" / value.removeprefix("/models/")
                folder.mkdir(parents=True, exist_ok=True)
                source = REPO / "tests" / "fixtures" / "architectures" / f"{ARCHITECTURES[folder.name]}.json"
                (folder / "config.json").write_text(source.read_text())
                arg = f"{key}={folder}"
        elif arg == f"data.root={RELEASE_COPY}":
            arg = f"data.root={release_copy(work)}"
        out.append(arg)
    return [
        *out,
        *(f"{role}.tokenizer={tokenizer}" for role in sorted(stood_in) if f"{role}.tokenizer=" not in command),
    ]


def release_copy(work: Path) -> Path:
    into = work / "release-copy"
    if not into.exists():
        sys.path.insert(0, str(REPO / "bench"))
        from release_copy import replicate

        replicate(REPO / "data" / "sample", 1500, into)
    return into


def printed(command: str, until: str, work: Path, tokenizer: str) -> list[str]:
    args = runnable(command, work, tokenizer)
    done = subprocess.run(
        [sys.executable, "-m", "personalens.cli", "plan", *args, f"run.out_dir={work / 'run'}"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    lines = done.stdout.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("placement on")), None)
    if start is None:
        raise RuntimeError(f"{command}: no placement printed (exit {done.returncode}): {done.stderr[-2000:]}")
    end = next((i for i in range(start, len(lines)) if lines[i].startswith(until)), len(lines))
    return lines[start:end]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 where a printout differs")
    options = parser.parse_args()
    from personalens.engines.models.embedded import embedded_model_dir

    tokenizer = str(embedded_model_dir())
    head = subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], cwd=REPO, capture_output=True, text=True)
    commit = head.stdout.strip()
    lines = DOC.read_text().splitlines()
    changed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for p in reversed(printouts("\n".join(lines))):
            new = printed(p.command, p.until, Path(tmp), tokenizer)
            first, last = p.block
            if new != lines[first + 1 : last]:
                changed += 1
                print(f"docs/cluster.md:{p.line + 1}: printout changed", file=sys.stderr)
            lines[first + 1 : last] = new
            lines[p.line] = f"<!-- printout: {p.command} | until: {p.until} | commit: {commit} -->"
    if options.check:
        return 1 if changed else 0
    DOC.write_text("\n".join(lines) + "\n")
    print(f"docs/cluster.md: {changed} printout(s) rewritten, made at {commit}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
