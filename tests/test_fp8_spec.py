"""bench/fp8_spec.py's CPU side: its four variants (bf16 and fp8 weights, each with and without n-gram
drafts) composed into the run's real configs, and `personalens plan`'s prediction of each on one H200,
as its `--dry-run` records them; the GPU run itself is the device script's (docs/performance.md)."""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

from cli_helpers import REPO


def _bench():
    spec = importlib.util.spec_from_file_location("fp8_spec", REPO / "bench" / "fp8_spec.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_dry_run_composes_each_variant_and_predicts_fp8_weights_faster(tmp_path):
    bench = _bench()
    args = argparse.Namespace(
        arch="llama31_8b",
        arch_config="llama31_8b",
        users="0",
        protocol="paper",
        rounds="1,1",
        reply_tokens="20,40",
        judge_tokens=None,
        tokenizer=None,
        gpu_type="h200",
        plan_gib=140.4,
        dry_run=True,
        tiny=False,
        cohorts=False,
        root=REPO / "data" / "sample",
    )
    result = bench.run(args, tmp_path)
    assert list(result) == ["bf16", "fp8 weights", "bf16 + ngram", "fp8 weights + ngram"]
    bf16, fp8 = result["bf16"]["plan"], result["fp8 weights"]["plan"]
    # half the weight bytes: more memory for KV, and a decode step that reads less
    [bf16_kv], [fp8_kv] = bf16["kv_tokens"].values(), fp8["kv_tokens"].values()
    assert fp8_kv > bf16_kv and fp8["tokens_per_s"] > bf16["tokens_per_s"]
    assert "not_modelled" in result["bf16 + ngram"]["plan"] and "not_modelled" not in fp8
    assert result["bf16 + ngram"]["plan"]["tokens_per_s"] == bf16["tokens_per_s"]  # drafts never assumed
    assert all("tokens_per_s" not in row for row in result.values())  # nothing loaded, nothing measured
    steps = json.loads((tmp_path / "variant-3.plan.json").read_text())["placement"]["jobs"]["generate"]
    [step] = steps["throughput"]["decode_step"].values()
    assert (step["quantization"], step["speculative"], step["fp8_compute"]) == ("fp8", "ngram", True)


def test_the_variants_name_every_role_alike():
    variants = _bench().variants()
    assert variants["fp8 weights + ngram"] == variants["fp8 weights"] + variants["bf16 + ngram"]
    assert (
        variants["bf16 + ngram"][0]
        == "assistant.speculative={method:ngram,num_speculative_tokens:3,prompt_lookup_max:4}"
    )
    assert {o.split(".")[0] for o in variants["fp8 weights"]} == {"assistant", "user_agent", "judge"}
    assert Path(REPO / "bench" / "results").is_dir()
