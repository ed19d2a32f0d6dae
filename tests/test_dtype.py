"""`dtype: auto` on a CPU: bfloat16 only with native bf16 instructions, float32 elsewhere."""

from pathlib import Path

import pytest

from personalens.engines.dtype import choose_dtype, read_cpu_flags

# flag sets as /proc/cpuinfo reports them (trimmed)
AVX2_EPYC_ZEN3 = {"fpu", "sse4_2", "avx", "avx2", "fma", "bmi2", "sha_ni"}
AVX512_NO_BF16 = AVX2_EPYC_ZEN3 | {"avx512f", "avx512bw", "avx512vl", "avx512_vnni"}  # Cascade Lake
ZEN4 = AVX512_NO_BF16 | {"avx512_bf16"}
SAPPHIRE_RAPIDS = AVX512_NO_BF16 | {"avx512_bf16", "amx_bf16", "amx_tile", "amx_int8"}


@pytest.mark.parametrize(
    "flags, dtype",
    [
        (AVX2_EPYC_ZEN3, "float32"),
        (AVX512_NO_BF16, "float32"),
        (set(), "float32"),
        (ZEN4, "bfloat16"),
        (SAPPHIRE_RAPIDS, "bfloat16"),
        ({"amx_bf16"}, "bfloat16"),
    ],
)
def test_auto_on_cpu_follows_native_bf16(flags, dtype):
    choice = choose_dtype("auto", on_cpu=True, cpu_flags=flags)
    assert (choice.configured, choice.dtype) == ("auto", dtype)
    if dtype == "bfloat16":
        assert any(f in choice.reason for f in flags & {"avx512_bf16", "amx_bf16"})
    else:
        assert "without native bf16" in choice.reason


@pytest.mark.parametrize("configured", ["bfloat16", "float32", "float16", "half"])
@pytest.mark.parametrize("on_cpu", [True, False])
def test_an_explicit_dtype_is_always_honoured(configured, on_cpu):
    for flags in (AVX2_EPYC_ZEN3, SAPPHIRE_RAPIDS):
        choice = choose_dtype(configured, on_cpu=on_cpu, cpu_flags=flags)
        assert choice.dtype == configured and "config" in choice.reason


def test_accelerators_keep_vllms_own_auto():
    assert choose_dtype("auto", on_cpu=False, cpu_flags=AVX2_EPYC_ZEN3).dtype == "auto"


def test_cpu_flags_are_read_from_the_first_processor(tmp_path: Path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu avx2 avx512_bf16\n\nprocessor\t: 1\nflags\t\t: fpu\n"
    )
    assert read_cpu_flags(cpuinfo) == {"fpu", "avx2", "avx512_bf16"}
    assert read_cpu_flags(tmp_path / "absent") == frozenset()
