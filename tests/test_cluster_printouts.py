"""docs/cluster.md's printouts are made by scripts/cluster_printouts.py: every marked printout's
command composes (as `--cfg job` would, tests/doc_commands.py) and names a commit of this
repository; a printout whose command no longer composes, or whose commit is gone, fails here. Fast:
nothing is rerun."""

from __future__ import annotations

import subprocess
import sys

import doc_commands as dc
import pytest

sys.path.insert(0, str(dc.REPO / "scripts"))
import cluster_printouts as cp  # noqa: E402


def _commit_exists(commit: str) -> bool:
    done = subprocess.run(["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=dc.REPO, capture_output=True)
    return done.returncode == 0


def test_every_printout_composes_and_names_a_commit():
    text = cp.DOC.read_text()
    found = cp.printouts(text)
    assert len(found) >= 8, len(found)  # the doc's plan printouts are marked: the test reads them
    assert "scripts/cluster_printouts.py" in text  # the doc names the script that makes them
    lines = text.splitlines()
    for p in found:
        assert lines[p.block[0] + 1].startswith("placement on"), p.command
    bad = dc.check_all([dc.DocCommand(f"docs/cluster.md:{p.line + 1}", p.command) for p in found])
    assert not bad, "printout commands that do not compose:\n" + "\n".join(f"{c}\n  -> {why}" for c, why in bad.items())
    missing = [f"docs/cluster.md:{p.line + 1}: {p.commit}" for p in found if not _commit_exists(p.commit)]
    assert not missing, "printouts made at commits this repository lacks:\n" + "\n".join(missing)


def test_a_stale_printout_is_caught(tmp_path):
    """A planted doc: one printout whose command names an option that no longer exists, one made at a
    commit that does not exist, and a marker without its block."""
    good = "personalens plan plan.gpus=4 plan.gpu_memory_gib=80"
    doc = (
        f"<!-- printout: personalens plan plan.gpus=4 plan.gpu_kind=a100 | until: time | commit: {_head()} -->\n"
        "```\nplacement on 4 GPU(s)\n```\n\n"
        f"<!-- printout: {good} | until: time | commit: 0000000 -->\n```\nplacement on 4 GPU(s)\n```\n"
    )
    found = cp.printouts(doc)
    assert [p.command for p in found] == ["personalens plan plan.gpus=4 plan.gpu_kind=a100", good]
    bad = dc.check_all([dc.DocCommand(str(p.line + 1), p.command) for p in found])
    assert [c.where for c in bad] == ["1"] and "gpu_kind" in next(iter(bad.values()))
    assert [_commit_exists(p.commit) for p in found] == [True, False]
    with pytest.raises(ValueError, match="not followed by a ``` block"):
        cp.printouts(f"<!-- printout: {good} | until: time | commit: abc -->\ntext\n")


def _head() -> str:
    return subprocess.run(
        ["git", "rev-parse", "--short=7", "HEAD"], cwd=dc.REPO, capture_output=True, text=True
    ).stdout.strip()
