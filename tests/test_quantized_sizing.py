"""AWQ, GPTQ and compressed-tensors checkpoints sized from their quantization_config, on published
configs (tests/fixtures/architectures/README.md says where each was read)."""

import json
from pathlib import Path

import pytest

from personalens.engines.placement.architecture import Architecture
from personalens.engines.placement.sizing import weights_bytes

FIXTURES = Path(__file__).parent / "fixtures"
QUANTIZED = json.loads((FIXTURES / "quantization_configs.json").read_text())


def _config(name: str) -> dict:
    return json.loads((FIXTURES / "architectures" / f"{name}.json").read_text())


def _expected(arch: Architecture, bits: int, per: int) -> int:
    """Linear layers at `bits` with a 16-bit scale and a `bits` zero point per `per` weights; the
    embeddings and the output layer in 16 bits."""
    embeddings = 2 * arch.vocab * arch.hidden  # untied: the embeddings and the output layer
    linear = arch.parameters() - embeddings
    return int(linear * bits / 8 + linear // per * (2 + bits / 8)) + embeddings * 2


def test_an_awq_int4_70b_is_sized_from_its_quantization_config(tmp_path):
    arch = Architecture.from_config(_config("llama31_70b_awq"))
    assert (arch.quantization, arch.quant_bits, arch.quant_group) == ("awq", 4, 128)
    size, source = weights_bytes(tmp_path, arch, 2)  # no safetensors in the directory: from the config
    assert size == _expected(arch, 4, 128) and "awq weights" in source
    assert 0.27 < size / (arch.parameters() * 2) < 0.29  # about 39.7 GB against 141 GB in bf16


def test_a_gptq_int4_checkpoint_is_sized_from_its_quantization_config(tmp_path):
    gptq = QUANTIZED["gptq"]
    arch = Architecture.from_config(_config(gptq["base"]) | {"quantization_config": gptq["quantization_config"]})
    assert (arch.quantization, arch.quant_bits, arch.quant_group) == ("gptq", 4, 128)
    assert weights_bytes(tmp_path, arch, 2)[0] == _expected(arch, 4, 128)
    per_channel = gptq["quantization_config"] | {"group_size": -1}  # GPTQ's -1: one group per output channel
    wide = Architecture.from_config(_config(gptq["base"]) | {"quantization_config": per_channel})
    assert wide.quant_group is None and weights_bytes(tmp_path, wide, 2)[0] == _expected(wide, 4, wide.hidden)


def test_a_compressed_tensors_w8a8_70b_matches_its_published_size(tmp_path):
    scheme = QUANTIZED["compressed-tensors"]
    arch = Architecture.from_config(_config(scheme["base"]) | {"quantization_config": scheme["quantization_config"]})
    assert (arch.quantization, arch.quant_bits, arch.quant_group) == ("compressed-tensors", 8, None)
    size = weights_bytes(tmp_path, arch, 2)[0]
    assert size == _expected(arch, 8, arch.hidden)
    # RedHatAI/Meta-Llama-3.1-70B-Instruct-quantized.w8a8, this scheme on this architecture: 72.7 GB of files
    assert size == pytest.approx(72.7e9, rel=0.01)


def test_a_method_without_a_known_layout_is_not_sized_from_its_config():
    arch = Architecture.from_config(_config("llama31_8b") | {"quantization_config": {"quant_method": "bitsandbytes"}})
    assert arch.quant_bits is None and arch.quantized_bytes(2) is None
