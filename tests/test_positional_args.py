"""The command line's positional arguments (personalens/cli.py): a command whose subject is a run
takes its directory as RUN, one about data its DATA_ROOT, and a positional argument a command does
not take is refused with one line and exit 2, not ignored."""

from __future__ import annotations

import pytest
from cli_helpers import run_cli
from synthetic_runs import write_run

from personalens import cli


def _args(command: str, *rest: str) -> list[str]:
    return cli._hydra_args(list(rest), command, cli.COMMANDS[command].positional)


@pytest.mark.parametrize(
    ("command", "rest", "expected"),
    [
        ("report", ["runs/x"], ["run.out_dir='runs/x'"]),
        ("report", ["runs/x", "runs/y", "report.out_dir=t3"], ["report.runs=['runs/x','runs/y']", "report.out_dir=t3"]),
        ("judge", ["runs/x", "shard.index=1"], ["run.out_dir='runs/x'", "shard.index=1"]),
        ("merge", ["runs/x"], ["run.out_dir='runs/x'"]),
        ("diversity", ["runs/x"], ["run.out_dir='runs/x'"]),
        ("agreement", ["runs/x"], ["run.out_dir='runs/x'"]),
        ("personalbench", ["runs/pb"], ["personalbench.out_dir='runs/pb'"]),
        ("compare", ["runs/a", "runs/b"], ["compare.runs=['runs/a','runs/b']"]),
        ("validate", ["data/sample", "--strict"], ["data.root='data/sample'", "data.strict=true"]),
        ("generate", ["data/sample"], ["data.root='data/sample'"]),
        ("validate", ["--cfg", "job", "~data.kinds"], ["--cfg", "job", "~data.kinds"]),  # a flag's value, a deletion
    ],
)
def test_positional_arguments_set_the_command_s_subject(command, rest, expected):
    assert _args(command, *rest) == expected


@pytest.mark.parametrize(
    ("command", "rest", "says"),
    [
        ("judge", ["runs/x", "runs/y"], "takes one RUN, got 2 positional arguments: runs/x runs/y"),
        ("validate", ["data/a", "data/b"], "takes one DATA_ROOT, got 2 positional arguments"),
        ("build", ["somewhere"], "takes no positional argument, got somewhere"),
        ("report", ["runs/x", "report.bootstrap=10", "runs/y"], "'runs/y' is not a key=value override, and RUN goes"),
        # a null sampling key, which Hydra cannot delete (it would say the key does not exist)
        (
            "generate",
            ["~protocol.assistant.temperature"],
            r"protocol.assistant.temperature=null leaves it to the model",
        ),
    ],
)
def test_positional_arguments_a_command_does_not_take_are_refused(command, rest, says):
    with pytest.raises(cli.UsageError, match=says):
        _args(command, *rest)


def test_report_of_a_positional_run_reports_that_run(tmp_path):
    """`personalens report RUN` writes RUN/report from RUN's judgments (not runs/default's)."""
    run = write_run(tmp_path / "x", users=4)
    done = run_cli("report", str(run), "report.bootstrap=20", "report.html_dialogues=5")
    assert f"report written to {run}/report" in done.stderr
    assert (run / "report" / "table3.md").read_text().count("synthetic") >= 1


def test_the_command_line_refuses_an_argument_with_one_line(tmp_path):
    refused = run_cli("judge", str(tmp_path), str(tmp_path / "y"), check=False)
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.strip().splitlines() == [
        f"personalens judge: error: takes one RUN, got 2 positional arguments: {tmp_path} {tmp_path / 'y'}"
    ]
    refused = run_cli("agreement", "export", "runs/x", "runs/y", check=False)
    assert refused.returncode == 2 and "personalens agreement export: error: takes one RUN" in refused.stderr


def test_removing_a_null_sampling_key_is_refused_with_one_line():
    refused = run_cli("generate", "~protocol.judge.top_p", "--cfg", "job", check=False)
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.strip().splitlines() == [
        "personalens generate: error: ~protocol.judge.top_p: a sampling key is not removed; "
        "protocol.judge.top_p=null leaves it to the model's own value, else the paper's (docs/models.md)"
    ]


def test_a_server_key_without_the_option_that_composes_the_server_block_is_refused_with_one_line():
    """`X.server.base_url=` alone names `engine@X=server`, which composes X's server block; with it (or
    `model@X=server`) the same key composes."""
    url = "assistant.server.base_url=http://gpu-node-7:8000/v1"
    refused = run_cli("generate", url, "--cfg", "job", check=False)
    assert refused.returncode == 2 and refused.stdout == ""
    [line] = refused.stderr.strip().splitlines()
    assert line.startswith(
        f"personalens generate: error: {url}: assistant's server block comes with engine@assistant=server"
    )
    for option in ("engine@assistant=server", "model@assistant=server"):
        composed = run_cli("generate", option, url, "--cfg", "job")
        assert "base_url: http://gpu-node-7:8000/v1" in composed.stdout
