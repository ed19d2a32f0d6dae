"""The date chat templates write as today's is the run's (engines/chat/dates.py, config/saved.py
`start_date`): gpt-oss's and Llama 3.x's templates call `strftime_now`, vLLM's harmony renderer reads
VLLM_SYSTEM_START_DATE. The first `generate` fixes it in the run's `start_date` file, the first of
shards racing to create it winning, and keeps it in generate.yaml; every resume, shard and the judge
use it; a variable or a saved config that contradicts it is refused; the transformers tokenizer, the
tokenizer's files and the in-process engine's chat calls render it."""

from __future__ import annotations

import json
import shutil
from datetime import datetime, timezone

import pytest
from omegaconf import OmegaConf
from test_fidelity import PromptRecorder, config

from personalens.engines.chat.dates import ENV, strftime_now
from personalens.engines.chat.messages import render_chat
from personalens.engines.chat.token_ids import ChatTokenizer
from personalens.engines.models.config import ModelConfig
from personalens.engines.models.embedded import embedded_model_dir
from personalens.errors import PersonalensError
from personalens.judge import command as judge_command
from personalens.simulate import command as simulate_command

# the line gpt-oss's template writes into its system message
DATED = "Current date: {{ strftime_now('%Y-%m-%d') }}\n{% for m in messages %}{{ m.content }}\n{% endfor %}"


def test_templates_write_the_runs_date_where_it_is_set(monkeypatch, tmp_path):
    monkeypatch.setenv(ENV, "2031-05-06")
    assert strftime_now("%d %b %Y") == "06 May 2031"  # Llama 3.x's form
    messages = [{"role": "user", "content": "Hi"}]
    assert render_chat(DATED, messages).startswith("Current date: 2031-05-06\n")
    # a tokenizer whose template writes the date, through transformers and from its files
    folder = tmp_path / "dated"
    shutil.copytree(embedded_model_dir(), folder, ignore=shutil.ignore_patterns("*.safetensors", "*.bin"))
    settings = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**settings, "chat_template": DATED}))
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    model = ModelConfig(name="dated", path=str(folder), system_role=True)
    for tokenizer in (ChatTokenizer.load(model), ChatTokenizer.from_files(model)):
        assert tokenizer.render(messages).startswith("Current date: 2031-05-06\n")
    monkeypatch.delenv(ENV, raising=False)
    assert strftime_now("%Y-%m-%d") == datetime.now().strftime("%Y-%m-%d")


def _saved_date(path):
    return OmegaConf.to_container(OmegaConf.load(path))["resolved"]["start_date"]


def test_the_first_generate_keeps_the_date_and_every_resume_shard_and_judge_uses_it(monkeypatch, tmp_path):
    import os

    out = tmp_path / "run"
    monkeypatch.delenv(ENV, raising=False)
    cfg = config(f"run.out_dir={out}", "shard.count=2", "shard.index=0")
    engine = PromptRecorder()
    assert simulate_command.generate(cfg, lambda: {"user_agent": engine, "assistant": engine}) == 0
    today = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    assert _saved_date(out / "generate.yaml") == today and os.environ[ENV] == today
    assert (out / "start_date").read_text() == f"{today}\n"
    # a run saved on another day, before its date had a file of its own: its other shard, a resume and
    # its judge keep that day, whatever today is
    saved = OmegaConf.load(out / "generate.yaml")
    saved.resolved.start_date = "2030-01-02"
    OmegaConf.save(saved, out / "generate.yaml")
    (out / "start_date").unlink()
    monkeypatch.delenv(ENV, raising=False)
    other = config(f"run.out_dir={out}", "shard.count=2", "shard.index=1")
    assert simulate_command.generate(other, lambda: {"user_agent": engine, "assistant": engine}) == 0
    assert os.environ[ENV] == "2030-01-02" and (out / "start_date").read_text() == "2030-01-02\n"
    assert judge_command.judge(cfg, lambda: {"judge": engine}) == 0
    assert _saved_date(out / "judge.yaml") == "2030-01-02"
    # a date the variable contradicts, or one that is no date, is refused before anything runs
    monkeypatch.setenv(ENV, "2030-01-03")
    with pytest.raises(PersonalensError, match="writes 2030-01-02 as today's date"):
        simulate_command.generate(cfg, lambda: {"user_agent": engine, "assistant": engine})
    monkeypatch.setenv(ENV, "tomorrow")
    with pytest.raises(PersonalensError, match="expected a date"):
        judge_command.judge(cfg, lambda: {"judge": engine})


def test_vllms_chat_path_passes_the_runs_strftime_now_to_a_template_that_calls_it(monkeypatch):
    """The in-process engine's chat calls give `strftime_now` among the template kwargs; vLLM keeps
    only the kwargs a template reads (renderers/hf.py), and keeps this one for a dated template."""
    from transformers import AutoTokenizer
    from vllm.renderers.hf import resolve_chat_template_kwargs

    tokenizer = AutoTokenizer.from_pretrained(str(embedded_model_dir()))
    given = {"strftime_now": strftime_now, "enable_thinking": False}
    kept = resolve_chat_template_kwargs(tokenizer, DATED, given)
    assert kept == {"strftime_now": strftime_now}
    monkeypatch.setenv(ENV, "2031-05-06")
    messages = [{"role": "user", "content": "Hi"}]
    assert tokenizer.apply_chat_template(messages, chat_template=DATED, tokenize=False, **kept).startswith(
        "Current date: 2031-05-06\n"
    )


def test_a_resume_whose_date_differs_from_the_runs_is_refused_in_one_line(monkeypatch, tmp_path):
    out = tmp_path / "run"
    monkeypatch.delenv(ENV, raising=False)
    cfg = config(f"run.out_dir={out}")
    engine = PromptRecorder()
    assert simulate_command.generate(cfg, lambda: {"user_agent": engine, "assistant": engine}) == 0
    assert judge_command.judge(cfg, lambda: {"judge": engine}) == 0
    today = (out / "start_date").read_text().strip()
    # the date file changed after the run saved its config: generate refuses, naming both
    (out / "start_date").write_text("2030-01-02\n")
    monkeypatch.delenv(ENV, raising=False)
    with pytest.raises(
        PersonalensError, match=f"the run's date is 2030-01-02, but .*generate.yaml was saved with start_date {today}"
    ) as err:
        simulate_command.generate(cfg, lambda: {"user_agent": engine, "assistant": engine})
    assert "\n" not in str(err.value)
    # a judge saved on another date than its run's now: refused before it judges
    saved = OmegaConf.load(out / "generate.yaml")
    saved.resolved.start_date = "2030-01-02"
    OmegaConf.save(saved, out / "generate.yaml")
    monkeypatch.delenv(ENV, raising=False)
    with pytest.raises(
        PersonalensError, match=f"judge.yaml was written by a run whose prompts carry the date {today}, not 2030-01-02"
    ):
        judge_command.judge(cfg, lambda: {"judge": engine})
    # a damaged date file is named
    (out / "start_date").write_text("soon\n")
    with pytest.raises(PersonalensError, match="start_date='soon': expected a date"):
        judge_command.judge(cfg, lambda: {"judge": engine})


# each racer: waits for the go file, then takes the date of each run directory in turn, as though its
# own clock read `day`
RACER = """
import os, sys, time
from pathlib import Path
from personalens.config import saved

root, day, runs = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
saved.today = lambda: day
(root / f"ready-{day}").touch()
while not (root / "go").exists():
    time.sleep(0.001)
for i in range(runs):
    print(saved.start_date(root / f"run{i}", fix=True))
"""
RUNS = 200  # directories raced on: the racers reach each at about the same moment


def test_shards_that_start_at_once_on_different_days_all_take_the_first_ones_date(tmp_path):
    """Real processes racing on new run directories, each with its own "today" (shards started
    either side of midnight): in each, exactly one date wins, every shard takes it, and it is the one
    kept."""
    import os
    import subprocess
    import sys
    import time

    days = [f"2030-01-{d:02d}" for d in range(1, 7)]
    env = {k: v for k, v in os.environ.items() if k != ENV}
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", RACER, str(tmp_path), day, str(RUNS)], stdout=subprocess.PIPE, text=True, env=env
        )
        for day in days
    ]
    deadline = time.monotonic() + 120
    while len(list(tmp_path.glob("ready-*"))) < len(days) and time.monotonic() < deadline:
        time.sleep(0.01)
    (tmp_path / "go").touch()  # all at once
    taken = [racer.communicate(timeout=120)[0].split() for racer in racers]
    assert all(racer.returncode == 0 for racer in racers)
    for i, dates in enumerate(zip(*taken, strict=True)):
        run = tmp_path / f"run{i}"
        assert set(dates) == {(run / "start_date").read_text().strip()}, f"run{i}: {dates}"
        assert [p.name for p in run.iterdir()] == ["start_date"]  # no temporary file left behind
    assert len({dates[0] for dates in zip(*taken)}) > 1  # the race was won by different shards
