"""Every command docs/models.md gives (its recipes' `personalens plan` and `slurm/submit.sh` lines, and
the commands quoted in its text) composes with the real command line's `--cfg job`: its overrides name
keys that exist, under the config groups they pick."""

from __future__ import annotations

import re
import shlex

import pytest
from cli_helpers import run_cli

from personalens.paths import PROJECT_ROOT

DOC = PROJECT_ROOT / "docs" / "models.md"


def commands() -> list[list[str]]:
    """Each command as personalens arguments: a submit.sh line runs `generate` with its overrides."""
    text = DOC.read_text()
    found = [line for block in re.findall(r"```bash\n(.*?)```", text, re.S) for line in block.strip().splitlines()]
    found += re.findall(r"`(personalens [^`]+)`", text)
    out = []
    for line in found:
        words = shlex.split(line)
        while words and "=" in words[0] and not words[0].startswith("personalens"):
            words.pop(0)  # GPUS=8 and the like: submit.sh's settings
        if words[0] == "slurm/submit.sh":
            out.append(["generate", *words[2:]])
        elif words[0] == "personalens":
            out.append(words[1:])
    return out


def test_the_doc_gives_a_recipe_per_family():
    given = " ".join(" ".join(c) for c in commands())
    for family in ("qwen3_8b", "gpt_oss_20b", "deepseek_r1_distill_qwen_7b"):
        assert "generate data=paper50 data.root=/data/PersonaLens/data run.name=" in given
        assert f"model@assistant={family} model@user_agent=llama33_70b model@judge=llama33_70b" in given


@pytest.mark.parametrize("command", commands(), ids=lambda c: " ".join(c)[:80])
def test_each_command_of_the_doc_composes(command):
    proc = run_cli(*command, "--cfg", "job", timeout=120)
    assert "assistant:" in proc.stdout
