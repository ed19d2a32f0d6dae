"""Every `personalens ...` command the README, docs/*.md, the conf/ comments and the slurm/ comments
write resolves its config as written (tests/doc_commands.py): an option name that does not exist,
a group option that does not exist or a malformed override fails here, as it would fail a user."""

from __future__ import annotations

import re
import subprocess
import sys

import doc_commands as dc

BAD = "personalens run data=official data.root=/data/personalens protocol=quick assistant.temprature=0.7"


def test_every_documented_command_resolves_its_config():
    commands = dc.collect(dc.sources())
    # every kind of source is read: the test cannot pass by finding nothing
    assert len(commands) > 150, len(commands)
    for where in ("README.md:", "docs/cluster.md:", "conf/", "slurm/submit.sh:"):
        assert any(c.where.startswith(where) for c in commands), where
    assert {c.text.split()[1] for c in commands} >= {"run", "generate", "judge", "report", "plan", "compare"}
    bad = dc.check_all(commands)
    assert not bad, "commands in the docs that do not resolve:\n" + "\n".join(f"{c}\n  -> {p}" for c, p in bad.items())


def test_a_planted_bad_override_is_reported_where_it_is_written(tmp_path):
    doc = tmp_path / "planted.md"
    doc.write_text(
        "Prose that says personalens runs dialogues, and `personalens plan plan.gpus=8`.\n\n"
        f"```bash\n{BAD}\npersonalens report runs/x \\\n    report.html_dialogues=20\n"
        "personalens generate model@assistant=llama99_8b   # no such model config\n"
        "personalens generate: error: printed output, not a command\n```\n"
    )
    conf = tmp_path / "planted.yaml"
    conf.write_text("# e.g. `personalens compare runs/a runs/b compare.familly=none`\nkey: 1\n")
    commands = dc.collect([doc, conf], repo=tmp_path)
    assert [(c.where, c.text.split()[1]) for c in commands] == [
        ("planted.md:1", "plan"),
        ("planted.md:4", "run"),
        ("planted.md:5", "report"),
        ("planted.md:7", "generate"),
        ("planted.yaml:1", "compare"),
    ]
    bad = {c.where: problem for c, problem in dc.check_all(commands).items()}
    assert set(bad) == {"planted.md:4", "planted.md:7", "planted.yaml:1"}, bad
    assert "assistant.temprature" in bad["planted.md:4"]
    assert "llama99_8b" in bad["planted.md:7"]
    assert "compare.familly" in bad["planted.yaml:1"]


def test_the_check_agrees_with_the_real_cli():
    """The in-process check and `personalens <cmd> --cfg job` accept and refuse the same commands."""
    good = "personalens report runs/x report.html_dialogues=20"
    for text, ok in ((good, True), (BAD, False)):
        done = subprocess.run(
            [sys.executable, "-m", "personalens.cli", *dc.words(text)[1:], "--cfg", "job"],
            capture_output=True,
            text=True,
            cwd=dc.REPO,
        )
        assert (done.returncode == 0) == ok, done.stderr
        if not ok:
            assert "temprature" in done.stderr
        problems = dc.check_all([dc.DocCommand("x", text)])
        assert (not problems) == ok, problems


def test_the_readme_is_short_and_maps_every_doc():
    readme = (dc.REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 160
    mapped = set(re.findall(r"^\| \[[\w.-]+\]\(docs/([\w.-]+\.md)\) \|", readme, re.MULTILINE))
    assert mapped == {p.name for p in (dc.REPO / "docs").glob("*.md")}
