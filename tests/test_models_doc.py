"""docs/models.md gives a recipe per reasoning family (its `personalens plan` and `slurm/submit.sh`
lines). That every command of it, as of every doc, composes is tests/test_doc_commands.py's check."""

from __future__ import annotations

import re
import shlex

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
        # the Table 3 recipe (conf/experiment/table3.yaml) fixes the data, the user agent and the judge
        assert "generate experiment=table3 data.root=/data/PersonaLens/data run.name=" in given
        assert f"model@assistant={family}" in given and "model@judge" not in given
