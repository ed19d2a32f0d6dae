"""The subcommand table and the typed fidelity option (docs/architecture.md)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
from cli_helpers import REPO
from omegaconf import OmegaConf

from personalens import cli
from personalens.config.fidelity import Fidelity
from personalens.errors import PersonalensError
from personalens.paths import project_path


def test_every_subcommand_names_a_function_that_exists():
    for command in cli.SUBCOMMANDS:
        module, function = command.target.split(":")
        assert importlib.util.find_spec(module) is not None, command
        assert callable(command.function()), command


def test_usage_lists_every_subcommand_and_its_actions():
    out = subprocess.run([sys.executable, "-m", "personalens.cli", "--help"], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0
    listed = [line.split()[0] for line in out.stdout.splitlines() if line.startswith("  ") and line.strip()]
    assert listed == [c.name for c in cli.SUBCOMMANDS]
    assert "personalbench run|export|score" in out.stdout and "agreement export|score" in out.stdout


def test_validate_imports_neither_vllm_nor_torch():
    code = (
        "import atexit, sys; "
        "atexit.register(lambda: print('LOADED', 'vllm' in sys.modules, 'torch' in sys.modules)); "
        "from personalens import cli; cli.main(['validate', 'data/sample'])"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert "LOADED False False" in out.stdout, out.stdout + out.stderr


@pytest.mark.parametrize("name", ["official", "paper"])
def test_fidelity_is_built_from_each_option_file(name):
    raw = OmegaConf.to_container(OmegaConf.load(project_path("conf") / "fidelity" / f"{name}.yaml"))
    raw["prompts"]["dir"] = "/somewhere"  # the interpolation needs the app's resolver
    option = Fidelity.from_mapping(raw)
    assert option.name == name and option.judge_format == name
    assert option.reproduces_release == (name == "official")
    assert option.terminate == raw["terminate"] and option.reply_after_cap == raw["reply_after_cap"]
    assert "dir" not in option.identity()["prompts"] and option.identity()["name"] == name


def test_fidelity_of_a_run_saved_before_the_option_existed_is_paper_over_both_kinds():
    option = Fidelity.from_saved({"assistant": {"name": "m"}})
    assert option.name == "paper" and option.figure4_kinds == ("SD", "MD") and not option.reproduces_release


def test_a_malformed_fidelity_option_is_a_clear_error():
    with pytest.raises(PersonalensError, match="fidelity: not a fidelity option"):
        Fidelity.from_mapping({"prompts": {}})


def test_no_folder_is_named_like_build_output():
    """Standard .gitignore templates and linters skip `build/` and `dist/` at any depth: a source
    folder named so would silently drop out of commits and lint runs."""
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    folders = {part for path in tracked.splitlines() for part in path.split("/")[:-1]}
    assert not folders & {"build", "dist"}
