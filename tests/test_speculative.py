"""A model config's `speculative:` block, pure: checked, passed through to vLLM's speculative_config in
process and as a managed server's flag (tests/test_managed_vllm.py has vLLM's own parser read it back:
EVERY_SETTING sets one), in the model's identity, and refused under `reproducible: true`, through the
engine loader, before anything loads."""

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from personalens.config.core import fingerprint, model_identity
from personalens.engines.models.config import ModelConfig, ModelConfigError
from personalens.engines.vllm.args import cli_flags, engine_args
from personalens.errors import PersonalensError

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}


def test_a_speculative_block_is_checked_and_passed_through():
    config = ModelConfig.from_mapping({"name": "m", "speculative": NGRAM})
    assert engine_args(config, "/w", "bfloat16")["speculative_config"] == NGRAM
    assert "speculative_config" not in engine_args(
        ModelConfig.from_mapping({"name": "m", "speculative": {}}), "/w", "auto"
    )
    flags = cli_flags(engine_args(config, "/w", "bfloat16"))
    assert (
        flags[flags.index("--speculative-config") + 1]
        == '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}'
    )
    assert "--structured-outputs-config.backend" in flags  # a mapping of strings stays dotted
    for bad, message in (
        ({"method": "medusa", "num_speculative_tokens": 2}, r"m\.speculative\.method: expected one of .*'ngram'"),
        ({"method": "ngram"}, r"m\.speculative\.num_speculative_tokens: expected the tokens drafted per step"),
        (
            {"method": "eagle3", "num_speculative_tokens": 3},
            r"m\.speculative\.model: method eagle3 drafts with a model",
        ),
        ({"method": "ngram", "num_speculative_tokens": 3, "x": [1]}, r"m\.speculative\.x: expected a name and a plain"),
        ("ngram", r"m\.speculative: expected a mapping"),
    ):
        with pytest.raises(ModelConfigError, match=message):
            ModelConfig.from_mapping({"name": "m", "speculative": bad}, where="m")


def test_speculative_decoding_is_part_of_the_models_identity_only_when_set():
    raw = {"name": "m", "path": "/w"}
    before = model_identity(OmegaConf.create(raw))
    assert model_identity(OmegaConf.create(raw | {"speculative": None})) == before  # earlier runs still resume
    drafted = model_identity(OmegaConf.create(raw | {"speculative": NGRAM}))
    assert drafted["speculative"] == NGRAM and fingerprint(drafted) != fingerprint(before)


def test_reproducible_refuses_speculative_decoding_before_anything_loads(tmp_path):
    from personalens.engines.factory import EngineLoader

    raw = OmegaConf.load(Path(__file__).parents[1] / "conf" / "model" / "smollm2.yaml")
    raw.speculative = NGRAM
    built = []
    with pytest.raises(
        PersonalensError, match=r"^model SmolLM2-135M-Instruct: speculative ngram refused: reproducible"
    ):
        EngineLoader({"assistant": raw}, tmp_path, gpus=lambda: None, build=built.append, reproducible=True)
    assert built == []
