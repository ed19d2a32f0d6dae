"""Today's open model families (conf/model/): each config loads with its reasoning profile, and each
architecture is sized from its published config.json (tests/fixtures/architectures, sources in its
README.md): mixtures of experts, alternating sliding windows, MXFP4 experts."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from personalens.config import model_identity
from personalens.engines.models.config import ModelConfig, ModelConfigError
from personalens.engines.placement.architecture import Architecture
from personalens.engines.placement.sizing import weights_bytes
from personalens.engines.vllm.args import cli_flags, engine_args
from personalens.paths import PROJECT_ROOT

FIXTURES = Path(__file__).parent / "fixtures" / "architectures"
MODEL_CONF = PROJECT_ROOT / "conf" / "model"

# config file -> (published architecture fixture, reasoning parser, chat_template_kwargs, system_role)
FAMILIES = {
    "qwen3_8b": ("qwen3_8b", "qwen3", {"enable_thinking": True}, "auto"),
    "qwen3_32b": ("qwen3_32b", "qwen3", {"enable_thinking": True}, "auto"),
    "qwen3_30b_a3b": ("qwen3_30b_a3b", "qwen3", {"enable_thinking": True}, "auto"),
    "gpt_oss_20b": ("gpt_oss_20b", "openai_gptoss", {"reasoning_effort": "medium"}, "auto"),
    "gpt_oss_120b": ("gpt_oss_120b", "openai_gptoss", {"reasoning_effort": "medium"}, "auto"),
    "deepseek_r1_distill_qwen_7b": ("deepseek_r1_distill_qwen_7b", "deepseek_r1", {}, False),
    "gemma3_27b": ("gemma3_27b", None, {}, "auto"),
    "llama33_70b": ("llama31_70b", None, {}, "auto"),  # Llama 3.3 70B keeps Llama 3.1 70B's architecture
    "mistral_small31_24b": ("mistral_small31_24b", None, {}, "auto"),
}


def arch(name: str) -> Architecture:
    return Architecture.from_config(OmegaConf.to_container(OmegaConf.load(FIXTURES / f"{name}.json")))


def load(name: str, tmp_path: Path, **changes) -> ModelConfig:
    raw = OmegaConf.load(MODEL_CONF / f"{name}.yaml")
    raw.path = str(tmp_path)  # an existing directory stands for the weights
    for key, value in changes.items():
        raw[key] = value
    return ModelConfig.from_mapping(raw, where=f"model@{name}")


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_each_family_config_loads_with_its_reasoning_profile(name, tmp_path):
    _, parser, kwargs, system_role = FAMILIES[name]
    config = load(name, tmp_path)
    assert (config.reasoning_parser, config.template_kwargs, config.system_role) == (parser, kwargs, system_role)
    assert config.history_reasoning == "family"
    args = engine_args(config, str(tmp_path), "bfloat16")
    assert args.get("reasoning_parser") == parser  # the grammar of a reasoning judge waits for the thinking's end
    assert ("--reasoning-parser" in cli_flags(args)) == (parser is not None)


@pytest.mark.parametrize(
    ("name", "billions"),
    [
        ("qwen3_8b", 8.19),  # model card: 8.2B
        ("qwen3_32b", 32.8),
        ("qwen3_30b_a3b", 30.5),
        ("gpt_oss_20b", 20.9),  # model card: 21B
        ("gpt_oss_120b", 116.8),  # model card: 117B
        ("deepseek_r1_distill_qwen_7b", 7.62),
    ],
)
def test_parameter_counts_of_the_new_families_match_their_model_cards(name, billions):
    assert arch(name).parameters() / 1e9 == pytest.approx(billions, rel=0.01)


def test_mixtures_of_experts_read_either_spelling_and_the_experts_own_size():
    qwen = arch("qwen3_30b_a3b")  # num_experts and moe_intermediate_size beside a dense intermediate_size
    assert (qwen.experts, qwen.experts_per_token, qwen.intermediate) == (128, 8, 768)
    gpt = arch("gpt_oss_120b")  # num_local_experts, as Mixtral
    assert (gpt.experts, gpt.experts_per_token, gpt.intermediate, gpt.quantized) == (128, 4, 2880, True)
    # activations count the routed experts only: 8 of 128 experts of 768 are lighter than one 6,144 MLP
    dense = Architecture.from_config(dict(OmegaConf.to_container(OmegaConf.load(FIXTURES / "qwen3_8b.json"))))
    assert qwen.activation_bytes(8192, 1, 2) < dense.activation_bytes(8192, 1, 2)


@pytest.mark.parametrize(("name", "card_gb"), [("gpt_oss_20b", 16), ("gpt_oss_120b", 80)])
def test_mxfp4_weights_are_sized_from_the_config_within_the_model_cards_memory(name, card_gb, tmp_path):
    a = arch(name)
    size, source = weights_bytes(tmp_path, a, 2)  # no files: from config.json's quantization_config
    assert source == "estimated from config.json's parameter count, mxfp4 weights"
    # the model cards: gpt-oss-20b runs within 16 GB of memory, gpt-oss-120b on one 80 GB GPU; every
    # weight in 4 bits is a floor no real checkpoint goes under
    assert a.parameters() // 2 < size < card_gb * 1e9
    assert size < a.parameters() * 2 // 3  # an unquantized estimate would be 2 bytes per parameter


def test_fp8_keeps_only_the_embeddings_in_the_run_dtype():
    a = dataclasses.replace(arch("qwen3_8b"), quantization="fp8")
    embeddings = a.vocab * a.hidden * (1 if a.tied_embeddings else 2)
    assert weights_bytes(Path("/nonexistent"), a, 2)[0] == a.parameters() + embeddings


def test_gpt_oss_alternates_128_token_windows_with_full_layers():
    a = arch("gpt_oss_20b")
    assert a.windows == (128, None) * 12
    per_layer = 8 * 64 * 2 * 2
    assert a.kv_bytes_for(65_536, 2) == 12 * per_layer * 128 + 12 * per_layer * 65_536


def test_qwen3_and_the_r1_distill_keep_every_token():
    assert arch("qwen3_32b").windows == (None,) * 64
    r1 = arch("deepseek_r1_distill_qwen_7b")  # a Qwen2 whose sliding window is switched off
    assert (r1.layers, r1.kv_heads, r1.vocab, r1.context, r1.windows) == (28, 4, 152_064, 131_072, (None,) * 28)


def test_the_reasoning_profile_is_checked_and_part_of_the_models_identity(tmp_path):
    with pytest.raises(
        ModelConfigError, match=r"history_reasoning: expected one of \('family', 'none', 'last', 'all'\)"
    ):
        load("qwen3_8b", tmp_path, history_reasoning="latest")
    with pytest.raises(ModelConfigError, match=r"chat_template_kwargs\.enable_thinking: expected a name and a plain"):
        load("qwen3_8b", tmp_path, chat_template_kwargs={"enable_thinking": [True]})
    raw = OmegaConf.load(MODEL_CONF / "qwen3_8b.yaml")
    off = OmegaConf.merge(raw, {"chat_template_kwargs": {"enable_thinking": False}})
    assert model_identity(raw) != model_identity(off)  # thinking on or off generates something else
    # a model config written before the profile existed keeps its identity (its runs still resume)
    old = OmegaConf.load(MODEL_CONF / "llama31_8b.yaml")
    older = OmegaConf.create(
        {k: v for k, v in old.items() if k not in ("reasoning_parser", "chat_template_kwargs", "history_reasoning")}
    )
    assert model_identity(old) == model_identity(older)


@pytest.mark.parametrize(
    "trio",
    [
        ("qwen3_8b", "gpt_oss_120b", "llama33_70b"),
        ("qwen3_32b", "qwen3_30b_a3b", "gemma3_27b"),
        ("deepseek_r1_distill_qwen_7b", "gpt_oss_20b", "mistral_small31_24b"),
    ],
    ids=lambda trio: "+".join(trio),
)
def test_plan_places_and_models_every_family_from_its_published_config(trio, tmp_path):
    """`personalens plan` for each family as assistant, user agent or judge on an 8 x 80 GB node, each
    model directory holding only its published config.json (the embedded tokenizer counts the
    prompts): every model placed with its weights sized, both jobs modelled."""
    import json

    from cli_helpers import run_cli

    from personalens.engines.models.embedded import EmbeddedModelError, embedded_model_dir

    try:
        tokenizer = embedded_model_dir()
    except EmbeddedModelError as err:
        pytest.skip(str(err))
    overrides = []
    for role, name in zip(("assistant", "user_agent", "judge"), trio):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "config.json").write_text((FIXTURES / f"{FAMILIES[name][0]}.json").read_text())
        overrides += [f"model@{role}={name}", f"{role}.path={folder}", f"{role}.tokenizer={tokenizer}"]
    out = tmp_path / "plan.json"
    # Qwen3-8B at its native context (no YaRN): the paper's longest multi-domain prompts overflow it
    native = ("assistant.max_model_len=40960", "assistant.rope_scaling=null") if trio[0] == "qwen3_8b" else ()
    proc = run_cli(
        "plan",
        "protocol=paper",
        *overrides,
        *native,
        "plan.gpus=8",
        "plan.gpu_memory_gib=80",
        f"plan.out={out}",
        timeout=120,
    )
    overflows = json.loads(out.read_text())["tokens"]["overflows"]
    if native:
        assert any(
            o.startswith("Qwen3-8B (assistant): max_model_len 40,960 cannot hold the longest MD dialogue prompt")
            for o in overflows
        ), overflows
        assert "OVER its context: Qwen3-8B (assistant)" in proc.stdout
    else:
        assert not [o for o in overflows if "(assistant)" in o], overflows
    jobs = json.loads(out.read_text())["placement"]["jobs"]
    names = {name: OmegaConf.load(MODEL_CONF / f"{name}.yaml").name for name in trio}
    placed = {m["model"]: m for job in jobs.values() for m in job["models"]}
    assert set(placed) == set(names.values())
    for model in names.values():
        assert placed[model]["weights_per_gpu"] > 0 and placed[model]["kv_cache_memory_bytes"] > 0, placed[model]
    for job in ("generate", "judge"):
        assert any("tokens_per_s" in row for row in jobs[job]["throughput"]["layouts"]), jobs[job]
