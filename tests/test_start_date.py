"""The date chat templates write as today's is the run's (engines/chat/dates.py, config/saved.py
`start_date`): gpt-oss's and Llama 3.x's templates call `strftime_now`, vLLM's harmony renderer reads
VLLM_SYSTEM_START_DATE. The first `generate` keeps it in generate.yaml; every resume, shard and the
judge use it; a variable that contradicts it is refused; the transformers tokenizer, the tokenizer's
files and the in-process engine's chat calls render it."""

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
    monkeypatch.delenv(ENV)
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
    # a run saved on another day: its other shard, a resume and its judge keep that day, whatever today is
    saved = OmegaConf.load(out / "generate.yaml")
    saved.resolved.start_date = "2030-01-02"
    OmegaConf.save(saved, out / "generate.yaml")
    monkeypatch.delenv(ENV)
    other = config(f"run.out_dir={out}", "shard.count=2", "shard.index=1")
    assert simulate_command.generate(other, lambda: {"user_agent": engine, "assistant": engine}) == 0
    assert os.environ[ENV] == "2030-01-02"
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
