"""The planner's KV sizes against what vLLM allocates on this CPU: the embedded model's capacity, and
for the published configs of other families (copies with fewer layers and a small MLP and
vocabulary, which no layer's KV depends on, started with random weights; a multimodal model's
language model alone) the KV bytes per token and the window of every layer."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from engine_fixtures import TINY_MODEL

from personalens.engines.models.embedded import embedded_model_dir
from personalens.engines.placement.architecture import DTYPE_BYTES, Architecture

pytestmark = pytest.mark.vllm

REPO = Path(__file__).resolve().parents[1]
ARCHITECTURES = Path(__file__).parent / "fixtures" / "architectures"


def test_kv_per_token_and_capacity_match_vllm(engine):
    arch = Architecture.from_config(json.loads((embedded_model_dir() / "config.json").read_text()))
    per_token = arch.kv_bytes_per_token(DTYPE_BYTES[engine.dtype.dtype])
    cache = engine._llm.llm_engine.vllm_config.cache_config
    vllm_tokens = cache.num_gpu_blocks * cache.block_size
    planned_tokens = TINY_MODEL.kv_cache_memory_bytes // per_token
    # vLLM rounds down to whole blocks: at most one block fewer than the planner's exact count
    assert vllm_tokens == pytest.approx(planned_tokens, rel=0.02)
    assert planned_tokens - cache.block_size < vllm_tokens <= planned_tokens


# the language model of a multimodal checkpoint: this CPU build cannot start the multimodal classes
# (they need torchvision), and the vision tower holds no KV cache
TEXT_ONLY = {"gemma3_text": "Gemma3ForCausalLM", "mistral": "MistralForCausalLM"}


def shrunk(name: str, layers: int, directory: Path) -> dict:
    """The published config with `layers` layers, an MLP of 256 and a vocabulary of 1,024, written to
    `directory`; a nested `text_config` as the config of its text-only architecture."""
    config = json.loads((ARCHITECTURES / f"{name}.json").read_text())
    if "text_config" in config:
        text = config["text_config"]
        config = dict(text, architectures=[TEXT_ONLY[text["model_type"]]], torch_dtype=config["torch_dtype"])
    config.update(num_hidden_layers=layers, intermediate_size=256, vocab_size=1024)
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(config))
    return config


FAMILIES = {  # published config: layers in the copy, dtype
    "gemma2_27b": (2, "bfloat16"),  # no layer_types: a sliding layer, then a global one
    "gemma3_27b": (6, "bfloat16"),  # text_config without its pattern: five sliding layers to a global one
    "mistral_small31_24b": (1, "bfloat16"),  # text_config
    "qwen25_72b": (1, "float32"),  # a sliding window switched off; float32 doubles the KV
}


@pytest.fixture(scope="module")
def allocated(tmp_path_factory) -> dict[str, tuple[dict, dict]]:
    """Per family: the copy's config, and what vLLM allocated for each of its layers (one process
    starts the four copies one after another)."""
    root = tmp_path_factory.mktemp("families")
    configs = {name: shrunk(name, layers, root / name) for name, (layers, _) in FAMILIES.items()}
    proc = subprocess.run(
        [sys.executable, str(REPO / "tests" / "vllm_kv_layers.py")]
        + [f"{dtype}:{root / name}" for name, (_, dtype) in FAMILIES.items()],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    found = [json.loads(x[10:]) for x in proc.stdout.splitlines() if x.startswith("KV LAYERS ")]
    assert len(found) == len(FAMILIES), proc.stdout[-3000:] + proc.stderr[-3000:]
    return {Path(f["path"]).name: (configs[Path(f["path"]).name], f["layers"]) for f in found}


@pytest.mark.parametrize("name", FAMILIES)
def test_every_layers_kv_matches_what_vllm_allocates(allocated, name):
    layers, dtype = FAMILIES[name]
    config, by_layer = allocated[name]
    ours = Architecture.from_config(config)
    per_layer = ours.kv_bytes_per_layer_token(DTYPE_BYTES[dtype])
    got = {int(i): (layer["bytes_per_token"], layer["kept"]) for i, layer in by_layer.items()}
    assert got == {i: (per_layer, window) for i, window in enumerate(ours.windows)}
    # the published config, read whole (text_config nested), has the same layers: the copy only has fewer
    published = Architecture.from_config(json.loads((ARCHITECTURES / f"{name}.json").read_text()))
    assert published.windows[:layers] == ours.windows
    assert published.kv_bytes_per_layer_token(DTYPE_BYTES[dtype]) == per_layer
