"""Each command composes only the config sections it reads (personalens/cli.py SECTIONS and each
Subcommand's `reads`), so `personalens generate --cfg job` shows generate's configuration, while the
overrides `slurm/submit.sh` gives generate, judge and report alike still compose, typos caught."""

from __future__ import annotations

import subprocess
import sys

import doc_commands as dc
import yaml

from personalens import cli


def _cfg_job(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "personalens.cli", *args, "--cfg", "job"], capture_output=True, text=True, cwd=dc.REPO
    )


def _key(section: str) -> str:
    return section.split("@", 1)[-1]


def test_generate_prints_its_own_configuration_only():
    done = _cfg_job("generate")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    # under 150 lines: the sections and groups generate reads, an in-process model's config without the
    # server block of conf/engine/server.yaml, the lockstep scheduling without continuous's settings
    assert len(lines) < 150, len(lines)
    shown = yaml.safe_load(done.stdout)
    assert {"assistant", "user_agent", "protocol", "fidelity", "data", "lockstep"} <= set(shown)
    assert "server" not in shown["assistant"] and "continuous" not in shown
    for section in ("personalbench", "datagen", "builder", "judge", "judging", "report", "plan", "compare"):
        assert section not in shown, section
    assert "judge" not in shown["protocol"] and "assistant" in shown["protocol"]


def test_every_command_composes_the_sections_it_reads_and_no_other():
    bare = [dc.DocCommand(c.name, f"personalens {c.name} {'|'.join(c.actions)}") for c in cli.SUBCOMMANDS]
    assert not dc.check_all(bare)
    for command in cli.SUBCOMMANDS:
        overrides = command.overrides([], command.actions[0] if command.actions else "")
        dropped = {o[1:] for o in overrides if o.startswith("~")}
        assert dropped == set(cli.SECTIONS) - set(command.reads), command.name
    assert cli.COMMANDS["judge"].reads >= ("model@judge", "judges", "judging", "protocol.judge")


def test_a_section_an_override_names_is_composed_and_checked():
    # submit.sh gives generate the judge's overrides too: they compose, and a misspelt key still fails
    done = _cfg_job("generate", "model@judge=llama31_8b", "judge.tensor_parallel_size=2", "report.bootstrap=10")
    assert done.returncode == 0, done.stderr
    shown = yaml.safe_load(done.stdout)
    assert shown["judge"]["tensor_parallel_size"] == 2 and shown["report"]["bootstrap"] == 10
    assert "personalbench" not in shown
    bad = _cfg_job("generate", "judge.temprature=0.5")
    assert bad.returncode != 0 and "temprature" in bad.stderr
    assert cli.COMMANDS["generate"].dropped(["protocol=quick"]) == cli.COMMANDS["generate"].dropped([])
    assert "~protocol.judge" not in cli.COMMANDS["generate"].dropped(["protocol.judge.temperature=0.2"])


def test_a_served_role_and_continuous_scheduling_compose_their_own_settings():
    done = _cfg_job(
        "generate", "engine@user_agent=server", "user_agent.server.base_url=http://gpu-node-7:8000/v1",
        "scheduling=continuous", "continuous.in_flight=8",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    shown = yaml.safe_load(done.stdout)
    served = shown["user_agent"]
    assert served["engine"] == "server" and served["server"]["base_url"] == "http://gpu-node-7:8000/v1"
    assert served["family"] == "smollm" and "server" not in shown["assistant"]
    scheduling = (shown["scheduling"], shown["continuous"]["in_flight"], shown["lockstep"]["token_ids"])
    assert scheduling == ("continuous", 8, True)
    # an in-process model has no server block: the override that forgets the group is refused, naming it
    bare = _cfg_job("generate", "user_agent.server.base_url=http://gpu-node-7:8000/v1")
    assert bare.returncode == 2 and "engine@user_agent=server" in bare.stderr
    # generate leaves the judge out, but keeps it where an override names its engine
    assert cli.COMMANDS["generate"].dropped(["engine@judge=server"]) == [
        s for s in cli.COMMANDS["generate"].dropped([]) if s != "~model@judge"
    ]
