"""Where the project's own folders are (conf/, prompts/, data/sample/)."""

from __future__ import annotations

from pathlib import Path

# personalens is installed from a clone (`pip install -e .`): its config, templates and sample
# data live beside the package, not inside it.
PROJECT_ROOT = Path(__file__).resolve().parents[1]


def project_path(relative: str) -> Path:
    path = PROJECT_ROOT / relative
    if not path.exists():
        raise FileNotFoundError(
            f"{path} is missing: personalens reads conf/, prompts/ and data/ from its source tree; "
            "install it from a clone with `pip install -e .`"
        )
    return path
