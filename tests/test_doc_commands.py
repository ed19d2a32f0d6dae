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


# option names the docs write in prose that are not config keys, and why (none today; a doc that needs one
# names it here)
NOT_OPTIONS: dict[str, str] = {}


def _markdown() -> list:
    return [dc.REPO / "README.md", *sorted((dc.REPO / "docs").glob("*.md"))]


def test_every_option_name_in_the_docs_prose_is_a_config_key():
    """`plan.time_limit`, `protocol.assistant.max_tokens=1825`: each dotted name in a doc's inline code
    whose first part is a top-level key of the config resolves in it (tests/doc_commands.py options)."""
    found = dc.options(_markdown(), dc.top_level_keys())
    assert len(found) > 150, len(found)  # the check reads the docs: it cannot pass by finding nothing
    assert {"plan.time_limit", "protocol.assistant.temperature", "lockstep.in_flight"} <= {o.name for o in found}
    stale = [o for o in dc.unresolved(found) if o.name not in NOT_OPTIONS]
    assert not stale, "option names in the docs that are not config keys:\n" + "\n".join(map(str, stale))


def test_a_planted_stale_option_name_is_caught_where_it_is_written(tmp_path):
    doc = tmp_path / "planted.md"
    doc.write_text(
        "Set `plan.time_limit=24:00:00` and `protocol.assistant.max_tokens`, read `report.md` and\n"
        "`runs/x/plan.json`; the old `protocol.assistant.thinking_rule=auto` is gone,\n"
        "as is `plan.gpu_kind`, while `assistant.chat_template_kwargs.reasoning_effort` takes any key.\n"
        "```bash\npersonalens plan plan.not_here=1   # code blocks are the command check's\n```\n"
    )
    found = dc.options([doc], dc.top_level_keys(), repo=tmp_path)
    assert [o.name for o in found] == [
        "plan.time_limit",
        "protocol.assistant.max_tokens",
        "protocol.assistant.thinking_rule",
        "plan.gpu_kind",
        "assistant.chat_template_kwargs.reasoning_effort",
    ]
    assert [str(o) for o in dc.unresolved(found)] == [
        "planted.md:2: `protocol.assistant.thinking_rule`",
        "planted.md:3: `plan.gpu_kind`",
    ]
