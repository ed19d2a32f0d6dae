"""The safe reader (personalens/data/files.py) and the user listing: every broken input named in
issue 22 gives one clear problem or a named warning, through `validate` and the real CLI."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from cli_helpers import run_cli

from personalens.data import DataError, files, load_scenarios, validate
from personalens.data.files import BOM_SKIPPED, DUPLICATE_KEY
from personalens.data.loading import IGNORED_ENTRY, NO_USERS

PROFILE = "profile/user0/profile.json"
TASKS = "profile/user0/tasks.json"


@pytest.fixture
def root(sample_root, tmp_path) -> Path:
    copy = tmp_path / "data"
    shutil.copytree(sample_root, copy)
    return copy


def problems_of(root: Path, strict: bool = False) -> list[tuple[str, str, str | None]]:
    return [(p.file, p.message, p.kind) for p in validate(root, strict=strict).problems]


def test_a_fifo_where_a_profile_should_be_is_refused_at_once_through_the_cli(root):
    (root / PROFILE).unlink()
    os.mkfifo(root / PROFILE)
    result = run_cli("validate", str(root), check=False, timeout=120)
    assert result.returncode != 0
    assert f"{PROFILE}: is a named pipe (FIFO), not a regular file" in result.stdout + result.stderr
    assert "Traceback" not in result.stderr


def test_a_directory_and_an_oversized_file_are_refused_with_their_path(root, tmp_path):
    (root / PROFILE).unlink()
    (root / PROFILE).mkdir()
    assert (PROFILE, "is a directory, not a regular file", None) in problems_of(root)
    big = tmp_path / "big.json"
    big.write_text("[" + "0," * 600 + "0]")
    with pytest.raises(DataError, match=r"big.json: 1,203 bytes, over the limit of 1,000 bytes"):
        files.read_json(big, "big.json", limit=1000)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
        ('{"a": ' + "7" * 5000 + "}", "a JSON number too long to read"),
        ('{"a": "\\ud800"}', "lone surrogate escape (\\ud800)"),
        ('{"a": ', "malformed JSON"),
    ],
)
def test_json_limits_are_errors_naming_the_file(root, text, message):
    (root / PROFILE).write_text(text)
    found = [m for f, m, k in problems_of(root) if f == PROFILE]
    assert len(found) == 1 and message in found[0]


def test_bad_utf8_names_the_byte(root):
    (root / PROFILE).write_bytes(b'{"a": "\xff"}')
    assert (PROFILE, "not UTF-8 text (byte 0xff)", None) in problems_of(root)


def test_a_bom_is_skipped_with_a_warning_and_counts_nothing_away(root):
    before = validate(root)
    (root / PROFILE).write_bytes(b"\xef\xbb\xbf" + (root / PROFILE).read_bytes())
    after = validate(root)
    assert after.ok and (after.users, after.sd_scenarios) == (before.users, before.sd_scenarios)
    assert [(p.file, p.kind) for p in after.problems] == [(PROFILE, BOM_SKIPPED)]


def test_a_duplicate_task_key_is_a_warning_naming_the_key_and_an_error_under_strict(root):
    text = (root / TASKS).read_text()
    first = json.loads(text)
    key = next(iter(first))
    # the same key again at the end, with the first value: the loader keeps the last, which is the same task
    duplicated = text.rstrip().removesuffix("}") + f", {json.dumps(key)}: {json.dumps(first[key])}}}"
    (root / TASKS).write_text(duplicated)
    report = validate(root)
    assert report.ok
    assert [(p.file, p.message, p.kind) for p in report.problems] == [
        (TASKS, f"duplicate key {json.dumps(key)}: the last value is kept", DUPLICATE_KEY)
    ]
    assert not validate(root, strict=True).ok
    with pytest.raises(DataError, match="duplicate key"):
        load_scenarios(root, strict=True)


def test_json_lines_split_on_newline_only_and_tolerate_crlf():
    text = '{"a": "x\u2028y"}\r\n\n{"b": 1}\n'
    assert list(files.json_lines(text)) == [(1, '{"a": "x\u2028y"}'), (3, '{"b": 1}')]


def test_user_folders_other_than_ascii_user_digits_are_listed_as_ignored(root):
    users = validate(root).users
    shutil.copytree(root / "profile/user1", root / "profile/user1\u0661")  # an Arabic-Indic digit one
    (root / "profile/user77").write_text("{}")  # a file, not a folder
    os.symlink("loop", root / "profile/loop")
    os.symlink("loop", root / "profile/user88")  # dangling into a loop
    (root / "profile").joinpath(os.fsdecode(b"user\xff")).mkdir()  # not UTF-8
    report = validate(root)
    assert report.ok and report.users == users
    ignored = sorted(p.file for p in report.problems if p.kind == IGNORED_ENTRY)
    assert ignored == sorted(
        ["profile/user1\u0661", "profile/user77", "profile/loop", "profile/user88", "profile/user\\xff"]
    )
    result = run_cli("validate", str(root), check=False, timeout=120)
    assert result.returncode == 0 and "Traceback" not in result.stderr
    assert "profile/user\\xff" in result.stdout


def test_an_empty_profile_folder_warns_and_selecting_0_users_is_an_error(root):
    shutil.rmtree(root / "profile")
    (root / "profile").mkdir()
    report = validate(root)
    assert [(p.file, p.kind) for p in report.problems] == [("profile/", NO_USERS)]
    with pytest.raises(DataError, match="0 users selected"):
        load_scenarios(root)


SPECIAL_NAMES = [
    "a ${x} b",
    "a[1]",
    "(a)",
    "a=b",
    "a,b",
    "it's",
    "two  spaces ",
    "emoji 😀",
    "back\\slash\\",
    "q\\'${y}",
]


@pytest.mark.parametrize("name", SPECIAL_NAMES)
def test_quoted_value_composes_back_to_the_same_path(name):
    from hydra import compose, initialize_config_dir

    from personalens.config import register_resolvers
    from personalens.config.core import quoted_value

    register_resolvers()
    with initialize_config_dir(config_dir=str(Path(__file__).resolve().parents[1] / "conf"), version_base="1.3"):
        assert compose("config", overrides=[f"data.root={quoted_value(name)}"]).data.root == name


def test_a_data_root_with_hydra_special_characters_is_taken_as_the_shell_passed_it(sample_root, tmp_path):
    import subprocess
    import sys

    roots = []
    for i, name in enumerate(SPECIAL_NAMES):
        root = tmp_path / str(i) / name
        shutil.copytree(sample_root, root)
        roots.append(root)
    repo = Path(__file__).resolve().parents[1]
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "personalens.cli", "validate", str(root)],
            cwd=repo,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for root in roots
    ]
    for root, proc in zip(roots, procs):
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, (root, err[-2000:])
        assert f"{root}: OK" in out
