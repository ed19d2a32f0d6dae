"""Shared paths: the repository, its bundled sample data, and the excerpt of the official release."""

from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


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
