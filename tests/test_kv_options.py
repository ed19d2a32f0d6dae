"""The KV options of a model config, pure: kv_cache_dtype fp8 and kv_offload_gib (host memory for
evicted KV) reach vLLM's arguments, size the KV cache and the dialogues in flight, are known to the
fingerprint, and are refused in one line where the platform or vLLM release cannot run them. The real
engine run with fp8 KV is tests/test_kv_vllm.py; vLLM's own parser reads the flags back in
tests/test_managed_vllm.py (EVERY_SETTING sets both)."""

import dataclasses
import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from personalens.config import model_identity
from personalens.engines.models.config import ModelConfig, ModelConfigError
from personalens.engines.placement.architecture import Architecture
from personalens.engines.placement.gpus import GIB, GpuSpec
from personalens.engines.placement.inflight import Cache, held
from personalens.engines.placement.sizing import ModelNeed
from personalens.engines.vllm.args import cli_flags, engine_args
from personalens.engines.vllm.check import problem
from personalens.engines.vllm.kv import kv_refusal
from personalens.plan.engine_model import Turn, simulate
from personalens.plan.gpu_model import GpuModel

ROOT = Path(__file__).parent.parent
LLAMA_70B = json.loads((Path(__file__).parent / "fixtures" / "architectures" / "llama31_70b.json").read_text())
H100S = GpuSpec(8, 80 * GIB, "test", capabilities=("9.0",) * 8)
A100S = GpuSpec(8, 80 * GIB, "test", capabilities=("8.0",) * 8)


def test_the_options_are_checked_and_reach_the_engine_arguments_only_when_set():
    with pytest.raises(ModelConfigError, match=r"m\.kv_cache_dtype: expected one of .*'fp8'.*got 'int8'"):
        ModelConfig.from_mapping({"name": "x", "kv_cache_dtype": "int8"}, where="m")
    with pytest.raises(ModelConfigError, match=r"m\.kv_offload_gib: must be a positive number of GiB, got 0"):
        ModelConfig.from_mapping({"name": "x", "kv_offload_gib": 0}, where="m")
    plain = engine_args(ModelConfig("m"), "/w", "auto")
    assert not {"kv_cache_dtype", "kv_offloading_size", "kv_offloading_backend"} & set(plain)
    both = ModelConfig("m", kv_cache_dtype="fp8_e4m3", kv_offload_gib=64.0)
    args = engine_args(both, "/w", "auto")
    assert args["kv_cache_dtype"] == "fp8_e4m3"
    assert (args["kv_offloading_size"], args["kv_offloading_backend"]) == (64.0, "native")
    flags = cli_flags(args)
    assert flags[flags.index("--kv-offloading-size") + 1] == "64.0"
    # a server's flags pass the release check only as arguments the table lists
    found = ("vllm", "0.32.0")
    assert problem("server", found, flags, find=lambda target: object()) is None


def test_fp8_changes_a_models_identity_offloading_does_not():
    raw = OmegaConf.load(ROOT / "conf" / "model" / "llama31_8b.yaml")
    before = OmegaConf.create({k: v for k, v in raw.items() if k not in ("kv_cache_dtype", "kv_offload_gib")})
    assert model_identity(raw) == model_identity(before)  # runs started before the options still resume
    offloaded = raw.copy()
    offloaded.kv_offload_gib = 200
    assert model_identity(offloaded) == model_identity(raw)  # a reloaded block holds what was computed
    fp8 = raw.copy()
    fp8.kv_cache_dtype = "fp8"
    assert model_identity(fp8) != model_identity(raw)  # rounded keys and values: other replies


def test_where_the_options_run_and_where_they_are_refused():
    fp8, offload = ModelConfig("m", kv_cache_dtype="fp8"), ModelConfig("m", kv_offload_gib=100.0)
    every = {"takes": lambda name: True}
    assert kv_refusal(fp8, gpus=H100S, cpu_build=False, cpu_flags=(), **every) is None
    assert kv_refusal(offload, gpus=H100S, cpu_build=False, cpu_flags=(), **every) is None
    assert kv_refusal(fp8, gpus=None, cpu_build=True, cpu_flags={"avx512f"}, **every) is None
    refusals = {
        "ampere": kv_refusal(fp8, gpus=A100S, cpu_build=False, cpu_flags=(), **every),
        "avx2": kv_refusal(fp8, gpus=None, cpu_build=True, cpu_flags={"avx2"}, **every),
        "cpu offload": kv_refusal(offload, gpus=None, cpu_build=True, cpu_flags={"avx512f"}, **every),
        "old release": kv_refusal(offload, gpus=H100S, cpu_build=False, cpu_flags=(), takes=lambda name: False),
        "reproducible": kv_refusal(offload, gpus=H100S, cpu_build=False, cpu_flags=(), reproducible=True, **every),
    }
    assert "compute capability 8.9 or higher (Ada, Hopper), and these are 8.0" in refusals["ampere"]
    assert "x86 with AVX-512 or AMX only" in refusals["avx2"]
    assert "keeps the KV cache in host memory already" in refusals["cpu offload"]
    assert "has no kv_offloading_size" in refusals["old release"]
    assert "reproducible: true" in refusals["reproducible"]
    for why in refusals.values():
        assert why.startswith("model m: kv_") and "\n" not in why


def test_fp8_halves_the_kv_bytes_per_token_and_doubles_the_dialogues_in_flight():
    arch = Architecture.from_config(LLAMA_70B)
    bf16 = ModelNeed("m", ("user_agent",), arch, weights=0, dtype_bytes=2, tp=4)
    fp8 = dataclasses.replace(bf16, kv_value_bytes=1)
    assert fp8.kv_per_token * 2 == bf16.kv_per_token == 80 * 2 * 2 * 128 * 2  # 8 KV heads over 4 GPUs
    assert fp8.kv_for(1000) * 2 == bf16.kv_for(1000)
    tokens = {"user_agent": 5_000.0, "assistant": 5_000.0}
    gpu_only = [Cache(("user_agent", "assistant"), 400_000, 256)]
    with_host = [Cache(("user_agent", "assistant"), 400_000, 256, host_tokens=600_000)]
    assert held(gpu_only, tokens) == 40 and held(with_host, tokens) == 100


def _dialogues(n: int, turns: int, step: int) -> list[list[Turn]]:
    out = []
    for _ in range(n):
        prompt, kept = 0, []
        for t in range(turns):
            role = "user" if t % 2 == 0 else "assistant"
            prompt += step
            kept.append(Turn(role, prompt, max(0, prompt - 2 * step) if t > 1 else 0, 100))
        out.append(kept)
    return out


def test_offloaded_histories_are_reloaded_instead_of_prefilled_again():
    """Continuous batching over a cache too small for the dialogues in flight: without host memory the
    evicted histories are prefilled again, with it they are copied back, which is cheaper."""
    work = _dialogues(64, 8, 1_000)
    small = GpuModel(kv_tokens=40_000)
    alone = simulate(work, small, "continuous")
    host = simulate(work, dataclasses.replace(small, host_tokens=2_000_000), "continuous")
    assert alone.reloaded == 0 and host.reloaded > 0
    assert host.computed + host.reloaded <= alone.computed
    assert host.computed < alone.computed and host.seconds < alone.seconds
    assert simulate(work, GpuModel(kv_tokens=4_000_000), "continuous").reloaded == 0  # nothing evicted


def test_the_engine_loader_refuses_before_anything_loads(tmp_path):
    """Through the factory, on this machine: vLLM's CPU build refuses offloading (its KV cache is in
    host memory already) before a layout is planned or an engine built."""
    from personalens.engines.dtype import vllm_is_cpu_build
    from personalens.engines.factory import EngineLoader
    from personalens.errors import PersonalensError

    if not vllm_is_cpu_build():
        pytest.skip("vLLM's CPU build")
    raw = OmegaConf.load(ROOT / "conf" / "model" / "smollm2.yaml")
    raw.kv_offload_gib = 8
    built = []
    with pytest.raises(PersonalensError, match=r"^model SmolLM2-135M-Instruct: kv_offload_gib 8 refused: vLLM's CPU"):
        EngineLoader({"assistant": raw}, tmp_path, gpus=lambda: None, build=built.append)
    assert built == []
