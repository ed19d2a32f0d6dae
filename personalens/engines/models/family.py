"""A model's family, for naming self-preference (a judge scoring an assistant of its own family):
declared by the model config's `family`, else inferred from the architecture its config.json names
(`model_type`, read as vLLM reads it: a multimodal config's `text_config` first).

An architecture names the code a model runs on, not who trained it: SmolLM2 runs on Llama's, and
DeepSeek's R1 distills on Qwen's. Declare `family` where that matters (conf/model/*.yaml do)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# config.json's model_type -> family
_ARCHITECTURES = {
    "llama": "llama",
    "llama4": "llama",
    "llama4_text": "llama",
    "mistral": "mistral",
    "mixtral": "mistral",
    "mistral3": "mistral",
    "qwen2": "qwen",
    "qwen2_moe": "qwen",
    "qwen3": "qwen",
    "qwen3_moe": "qwen",
    "gemma": "gemma",
    "gemma2": "gemma",
    "gemma3": "gemma",
    "gemma3_text": "gemma",
    "gpt_oss": "gpt-oss",
    "phi3": "phi",
    "deepseek_v3": "deepseek",
}


@dataclass(frozen=True)
class Family:
    name: str | None  # None: neither declared nor inferred
    source: str  # "declared" | "inferred from config.json's model_type <type>" | why it is unknown

    def shared_with(self, other: Family) -> bool:
        return self.name is not None and self.name == other.name

    def describe(self) -> str:
        return f"{self.name} ({self.source})" if self.name else f"unknown ({self.source})"


def family_of(model: Mapping[str, Any], folder: Path | None = None) -> Family:
    """The family of a model config (a conf/model mapping, as a run saves it): its `family`, else
    its architecture's, read from `folder` (the weights' folder; the config's `path` when it is one)."""
    if model.get("family"):
        return Family(str(model["family"]).lower(), "declared")
    path = folder or (Path(str(model["path"])).expanduser() if model.get("path") else None)
    config = path / "config.json" if path is not None else None
    if config is None or not config.is_file():
        return Family(None, "no family declared and no config.json to read")
    try:
        raw = json.loads(config.read_text())
    except (OSError, ValueError):
        return Family(None, f"{config} is not readable")
    text = raw.get("text_config") if isinstance(raw.get("text_config"), Mapping) else raw
    model_type = str(text.get("model_type") or raw.get("model_type") or "")
    family = _ARCHITECTURES.get(model_type) or _ARCHITECTURES.get(str(raw.get("model_type") or ""))
    if family is None:
        return Family(None, f"config.json's model_type {model_type!r} names no known family")
    return Family(family, f"inferred from config.json's model_type {model_type}")
