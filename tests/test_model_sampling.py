"""A model config's own sampling (its card's, `sampling:`): checked, resolved per role where the protocol leaves
a value null (a value the config writes wins), sent to vLLM (top_k, min_p) in process and to servers, recorded with its
origin in the fingerprint and the saved config, warned about when greedy against the card or without a
thinking budget; the thinking budget beside the answer's max_tokens; rope scaling as vLLM's hf_overrides;
a family config pointed at a lab's own server by one override."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_helpers import run_cli
from engine_fixtures import chat
from omegaconf import OmegaConf
from test_fidelity import PromptRecorder, config

from personalens.config import run as R
from personalens.config.core import quoted_value
from personalens.config.sampling import CONFIG, MODEL, PAPER, notes, resolve
from personalens.engines.models.config import ModelConfig, ModelConfigError
from personalens.engines.serving.engine import chat_body
from personalens.errors import PersonalensError
from personalens.paths import PROJECT_ROOT
from personalens.simulate import command as simulate_command

MODEL_CONF = PROJECT_ROOT / "conf" / "model"
REASONING = ("qwen3_8b", "qwen3_32b", "qwen3_30b_a3b", "deepseek_r1_distill_qwen_7b", "gpt_oss_20b", "gpt_oss_120b")
ENTRY = {"temperature": None, "max_tokens": 800, "top_p": None, "thinking_budget": None}  # conf/protocol/paper.yaml's
RESOLVED = {"temperature": 0.0, "max_tokens": 800, "top_p": 1.0, "thinking_budget": None}  # with the paper's values


def quoted(value):
    return quoted_value(value) if isinstance(value, str) else value


def card(name: str) -> dict:
    return OmegaConf.to_container(OmegaConf.load(MODEL_CONF / f"{name}.yaml").sampling)


@pytest.mark.parametrize("name", REASONING)
def test_each_reasoning_config_carries_its_cards_sampling_with_a_source_and_a_budget(name, tmp_path):
    raw = OmegaConf.load(MODEL_CONF / f"{name}.yaml")
    raw.path = str(tmp_path)
    config = ModelConfig.from_mapping(raw)
    values = config.sampling.as_dict
    assert values["temperature"] > 0 and values["thinking_budget"] > 0
    assert "model card" in config.sampling.source and raw.name.split("-")[0].lower() in config.sampling.source.lower()
    # the cards that forbid greedy decoding say why, in a line quoted when a role decodes greedily
    assert bool(config.sampling.greedy_warning) == (not name.startswith("gpt_oss"))
    if name.startswith("qwen3"):
        assert (values["top_p"], values["top_k"], values["min_p"]) == (0.95, 20, 0.0)
        assert dict(config.rope_scaling)["rope_type"] == "yarn"


def test_a_models_sampling_is_checked_in_one_line():
    def load(**sampling):
        return ModelConfig.from_mapping({"name": "m", "sampling": sampling}, where="model@assistant")

    with pytest.raises(
        ModelConfigError,
        match=r"model@assistant.sampling: unknown key\(s\) \['max_tokens'\] \(max_tokens is the protocol's",
    ):
        load(max_tokens=10, source="card")
    with pytest.raises(
        ModelConfigError, match=r"model@assistant.sampling.top_k: expected a number >= 0 or null, got 'x'"
    ):
        load(top_k="x", source="card")
    with pytest.raises(ModelConfigError, match=r"values \['temperature'\] need a source"):
        load(temperature=0.6)
    assert load(temperature=None, source=None).sampling.values == ()


def test_the_card_fills_what_the_protocol_leaves_null_and_a_value_the_config_writes_wins():
    model = {"temperature": 0.6, "top_k": 20, "min_p": 0.0, "thinking_budget": 512, "source": "card"}
    plain = resolve("assistant", ENTRY, {})
    assert plain.section == RESOLVED and set(plain.origins.values()) == {PAPER}
    carded = resolve("assistant", ENTRY, model)
    assert carded.section == {**RESOLVED, "temperature": 0.6, "top_k": 20, "min_p": 0.0, "thinking_budget": 512}
    assert carded.origins == {"temperature": MODEL, "top_p": PAPER, "top_k": MODEL, "min_p": MODEL} | {
        "thinking_budget": MODEL
    }
    # a value written anywhere in the config (protocol.assistant.temperature=0) keeps greedy decoding; the caps
    # stay the protocol's
    kept = resolve("assistant", {**ENTRY, "temperature": 0}, model)
    assert (kept.section["temperature"], kept.origins["temperature"], kept.section["max_tokens"]) == (0, CONFIG, 800)
    assert resolve("user_agent", {"max_tokens": 800}, {}).section == {
        "max_tokens": 800,
        "temperature": 0.5,
        "top_p": 1.0,
    }
    with pytest.raises(PersonalensError, match=r"protocol.judge.max_tokens: None: the answer's cap is the protocol's"):
        resolve("judge", {**ENTRY, "max_tokens": None}, model)
    # a reply generates at most the budget's thinking and the answer's 800 (engines/chat/budget.py)
    assert carded.request_max_tokens == 512 + 800 and carded.section["max_tokens"] == 800
    # a fingerprint as before where all is the paper's; else with the origins (as fingerprints named them
    # before this rule: the config's an override, the paper's the protocol's) and the reply's budgets
    assert plain.identity() == {"temperature": 0.0, "max_tokens": 800, "top_p": 1.0}
    assert carded.identity()["origins"] == {
        "min_p": MODEL,
        "temperature": MODEL,
        "thinking_budget": MODEL,
        "top_k": MODEL,
        "top_p": "protocol",
    }
    assert kept.identity()["origins"]["temperature"] == "override"
    assert (carded.identity()["request_max_tokens"], carded.identity()["answer_max_tokens"]) == (1312, 800)


def test_greedy_decoding_against_the_card_and_a_missing_budget_are_said():
    entry = {**ENTRY, "temperature": 0.0}
    greedy = resolve("assistant", entry, card("qwen3_8b") | {"thinking_budget": None})
    said = notes("assistant", "Qwen3-8B", greedy, "qwen3")
    assert len(said) == 2
    assert "decodes greedily (temperature 0, as the config sets it)" in said[0] and "DO NOT use greedy" in said[0]
    assert "without a thinking budget" in said[1] and "assistant.sampling.thinking_budget" in said[1]
    assert notes("assistant", "Qwen3-8B", resolve("assistant", ENTRY, card("qwen3_8b")), "qwen3") == []


def test_top_k_and_min_p_reach_vllm_in_process_and_through_a_server():
    from personalens.engines.vllm.local import sampling_params

    # (under temperature 0 vLLM drops top_k and min_p: greedy decoding takes the likeliest token anyway)
    request = chat(
        "Hi", max_tokens=64, temperature=0.6, top_k=20, min_p=0.05, presence_penalty=1.5, repetition_penalty=1.1
    )
    params = sampling_params(request)
    assert (params.top_k, params.min_p, params.presence_penalty, params.repetition_penalty) == (20, 0.05, 1.5, 1.1)
    body = chat_body("m", request, system_role=True)
    assert {k: body[k] for k in ("top_k", "min_p", "presence_penalty", "repetition_penalty")} == {
        "top_k": 20,
        "min_p": 0.05,
        "presence_penalty": 1.5,
        "repetition_penalty": 1.1,
    }
    # vLLM's OpenAI server reads them as fields of its chat request
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    parsed = ChatCompletionRequest(**body)
    assert (parsed.top_k, parsed.min_p) == (20, 0.05)
    assert "top_k" not in chat_body("m", chat("Hi", max_tokens=64), system_role=True)


def test_generate_runs_each_role_with_its_models_sampling_and_records_where_it_came_from(tmp_path):
    engine = PromptRecorder()
    cfg = config(
        f"run.out_dir={tmp_path / 'run'}",
        "assistant.reasoning_parser=deepseek_r1",
        *(
            f"assistant.sampling.{k}={quoted(v)}"
            for k, v in card("deepseek_r1_distill_qwen_7b").items()
            if v is not None
        ),
        "assistant.sampling.top_k=20",
        "assistant.sampling.min_p=0.05",
    )
    assert simulate_command.generate(cfg, lambda: {"user_agent": engine, "assistant": engine}) == 0
    assistant = [r.sampling for r in engine.requests if not r.messages[-1]["content"].startswith("<user_profile>")]
    assert {(s.temperature, s.top_p, s.top_k, s.min_p, s.thinking_budget, s.max_tokens) for s in assistant} == {
        (0.6, 0.95, 20, 0.05, 4096, 96)  # the thinking's budget beside the answer's max_tokens
    }
    saved = OmegaConf.load(tmp_path / "run" / "generate.yaml")
    assert saved.parts.protocol.assistant.origins.temperature == MODEL
    assert saved.parts.protocol.user_agent == {"temperature": 0.5, "max_tokens": 64, "top_p": 1.0}  # as before
    assert "model card" in saved.resolved.sampling.assistant.source
    assert saved.resolved.sampling.user_agent.origins.temperature == PAPER


def test_a_value_on_the_real_command_line_wins_and_greedy_is_warned(tmp_path):
    """Qwen3-8B as the assistant (not in this cache: refused before anything loads, after its sampling
    was read): the value written on the command line keeps temperature 0 and the card's reason is quoted."""
    proc = run_cli(
        "generate",
        "protocol=quick",
        "model@assistant=qwen3_8b",
        "protocol.assistant.temperature=0",
        "assistant.sampling.thinking_budget=null",  # the model's own: none (a null protocol key takes the card's)
        f"run.out_dir={tmp_path / 'run'}",
        check=False,
        timeout=120,
    )
    assert "decodes greedily (temperature 0, as the config sets it)" in proc.stderr, proc.stderr
    assert "DO NOT use greedy decoding" in proc.stderr and "without a thinking budget" in proc.stderr
    quiet = run_cli(
        "generate", "protocol=quick", "model@assistant=qwen3_8b", f"run.out_dir={tmp_path / 'q'}", check=False
    )
    assert "greedily" not in quiet.stderr and "without a thinking budget" not in quiet.stderr, quiet.stderr


def test_sampling_and_server_keys_of_a_family_config_are_overrides():
    cfg = config(
        "model@assistant=qwen3_8b",
        "assistant.sampling.temperature=0.7",
        "engine@assistant=server",
        "assistant.server.base_url=http://gpu-node:8000/v1",
    )
    assert (cfg.assistant.sampling.temperature, cfg.assistant.reasoning_parser) == (0.7, "qwen3")
    served = ModelConfig.from_mapping(cfg.assistant)
    assert served.server.base_url == "http://gpu-node:8000/v1" and served.reasoning_parser == "qwen3"
    assert served.template_kwargs == {"enable_thinking": True} and served.sampling.as_dict["top_k"] == 20
    assert R.sampling(cfg, "assistant")[0].temperature == 0.7


def test_yarn_rope_scaling_reaches_vllm_as_hf_overrides_and_sizes_the_context(tmp_path):
    import json

    from personalens.engines.models.embedded import EmbeddedModelError, embedded_model_dir
    from personalens.engines.placement.architecture import Architecture
    from personalens.engines.placement.sizing import scaled_context
    from personalens.engines.vllm.args import engine_args

    qwen = Architecture.from_config(
        json.loads((Path(__file__).parent / "fixtures/architectures/qwen3_8b.json").read_text())
    )
    rope = (("factor", 4.0), ("original_max_position_embeddings", 32768), ("rope_type", "yarn"))
    assert (qwen.context, scaled_context(qwen, rope).context) == (40960, 131072)
    try:
        folder = embedded_model_dir()
    except EmbeddedModelError as err:
        pytest.skip(str(err))
    from vllm.engine.arg_utils import EngineArgs

    scaling = (("factor", 4.0), ("original_max_position_embeddings", 8192), ("rope_type", "yarn"))
    args = engine_args(ModelConfig("m", path=str(folder), rope_scaling=scaling), str(folder), "bfloat16")
    model = EngineArgs(model=str(folder), hf_overrides=args["hf_overrides"], max_model_len=32768).create_model_config()
    assert model.max_model_len == 32768 and model.hf_text_config.rope_parameters["rope_type"] == "yarn"
    published = json.loads((folder / "config.json").read_text())
    theta = published.get("rope_theta") or published["rope_parameters"]["rope_theta"]
    assert model.hf_text_config.rope_parameters["rope_theta"] == theta  # the model's own base frequency kept


def test_plan_counts_the_thinking_budget_in_replies_not_in_history_and_the_thinking_endings():
    from personalens.plan.budget import cap_turns
    from personalens.plan.calibration import Calibration
    from personalens.plan.estimate import _reply_tokens

    cfg = config("model@assistant=qwen3_8b", "protocol=paper")
    requests, answers = _reply_tokens(cfg)
    assert (requests["assistant"], answers["assistant"], requests["user_agent"]) == (4096 + 800, 800, 800)
    kept = config("model@assistant=qwen3_8b", "protocol=paper", "assistant.history_reasoning=all")
    assert _reply_tokens(kept)[1]["assistant"] == 4896  # its thinking comes back in its history
    turns = cap_turns(60, {"user": 800, "assistant": 4896}, {"user": 800, "assistant": 800})
    assert (turns.reply["assistant"], turns.history) == (4896, 800)
    ended = [{"kind": "MD", "ended": e, "turns": []} for e in ("thinking", "terminate", "terminate", "context")]
    run = Calibration("pilot", ended, 0, None, None)
    assert run.context_ended({"MD": 100}, "thinking") == {
        "MD": {"measured": 1, "of": 4, "expected": 25, "planned": 100}
    }
