"""bench/gpu_row.py at its CPU size: a tiny architecture with random weights (`load_format: dummy`)
through generate, the raw replay, judge and report (on a GPU it runs a Table-3 row of a shipped
model's architecture); its `--cohorts` mode's composition (two distinct engines, loaded once, two
generate runs) on scripted engines, whose real-vLLM run is docs/performance.md's on an H200."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time

import pytest
from cli_helpers import REPO, read_rows
from omegaconf import OmegaConf

from personalens.data import load_scenarios
from personalens.engines import factory
from personalens.engines.base import Generation


@pytest.mark.vllm
def test_a_tiny_row_with_random_weights_runs_every_stage(tmp_path):
    # vLLM's engine core in the bench's own process: spawning it (and its worker) costs a second and
    # third import of vLLM, tens of seconds on a 2-core CPU, for a row that runs in seconds
    env = {**os.environ, "PYTHONPATH": str(REPO), "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    proc = subprocess.run(
        [sys.executable, "bench/gpu_row.py", "--tiny", "--keep", str(tmp_path)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))[7:])
    dialogues = len(load_scenarios(REPO / "data" / "sample", "0", "both"))
    # one round under the official rules: user, assistant, and the user agent's answer to the capped reply
    assert (result["dialogues"], result["turns"]) == (dialogues, 3 * dialogues)
    # random weights: replies run to their 8-token budget (end-of-text is one token in 49,152), in
    # lockstep and in the raw replay of the same requests alike
    assert result["generated"] == result["raw_generated"]
    assert 0.9 * 8 * 3 * dialogues <= result["generated"] <= 8 * 3 * dialogues
    assert result["judgments"] == 6 * dialogues  # TC, P, and naturalness and coherence per speaker
    assert "lockstep / raw batched = " in proc.stdout and "straggler tail" in proc.stdout
    assert len(read_rows(tmp_path / "run" / "trace")) == 3  # one call per step
    saved = OmegaConf.load(tmp_path / "run" / "generate.yaml")
    assert saved.config.assistant.load_format == "dummy"
    assert json.loads((tmp_path / "model" / "config.json").read_text())["num_hidden_layers"] == 2


class ReplyingEngine:
    """Eight tokens per reply, a few milliseconds per call; counts its prefix-cache resets."""

    def __init__(self, config):
        self.name, self.seed = config.name, config.seed
        self.calls, self.resets, self.closed = 0, 0, False

    def generate(self, requests, on_finished=None):
        self.calls += 1
        time.sleep(0.005)
        return [Generation("fine, thanks", prompt_tokens=10, completion_tokens=8) for _ in requests]

    def reset_prefix_cache(self):
        self.resets += 1

    def close(self):
        self.closed = True


def test_cohorts_mode_runs_two_distinct_engines_with_one_cohort_then_two(tmp_path, monkeypatch, capsys):
    built = []

    def build(config, stop=None):
        built.append(ReplyingEngine(config))
        return built[-1]

    monkeypatch.setattr(factory, "build_engine", build)
    monkeypatch.setattr(sys, "argv", ["gpu_row.py", "--tiny", "--cohorts", "--keep", str(tmp_path)])
    spec = importlib.util.spec_from_file_location("bench_gpu_row", REPO / "bench" / "gpu_row.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    bench.main()
    out = capsys.readouterr().out
    result = json.loads(next(line for line in out.splitlines() if line.startswith("RESULT "))[7:])
    # one load: the user agent a model of its own, its prefix cache reset before each run like the assistant's
    assert [(e.name, e.seed, e.resets, e.closed) for e in built] == [
        ("user-agent", 1, 2, True),
        ("SmolLM2-135M-Instruct", 0, 2, True),
    ]
    one, two = result["cohorts_1"], result["cohorts_2"]
    dialogues = len(load_scenarios(REPO / "data" / "sample", "0", "both"))
    assert (one["dialogues"], one["turns"], one["generated"]) == (dialogues, 3 * dialogues, 8 * 3 * dialogues)
    assert (two["dialogues"], two["turns"], two["generated"]) == (one["dialogues"], one["turns"], one["generated"])
    assert (one["calls"], two["calls"]) == (3, 6)  # each step a call per cohort
    assert sorted(one["busy"]) == sorted(two["busy"]) == ["engine 0 (user-agent)", "engine 1 (SmolLM2-135M-Instruct)"]
    assert sum(e.calls for e in built) == 9
    for n in (1, 2):
        saved = OmegaConf.load(tmp_path / f"cohorts-{n}" / "generate.yaml")
        assert saved.config.lockstep.cohorts == n and saved.config.user_agent.name == "user-agent"
        assert saved.resolved.placement  # the loader's layout, kept with each run
    assert "lockstep.cohorts=1: " in out and "lockstep.cohorts=2: " in out and "cohorts=2 / cohorts=1 wall time" in out


def test_levers_mode_builds_each_variant_and_plans_it(tmp_path):
    """`--levers`' arguments, pure: per variant the configs it loads (fp8 KV; a small KV cache, every
    dialogue in flight, without and with host memory) and plan's prediction of each, here on a
    described 80 GB GPU. Its run on an H200 is in docs/performance.md."""
    import argparse

    spec = importlib.util.spec_from_file_location("bench_gpu_row", REPO / "bench" / "gpu_row.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    args = argparse.Namespace(
        tiny=False, cohorts=False, arch_config="llama31_8b", protocol="paper", root=REPO / "data" / "sample",
        users="0", rounds="2,3", reply_tokens="60,200", judge_tokens=None,
    )  # fmt: skip
    model = bench.model_dir("llama31_8b", tmp_path / "model")
    assert json.loads((model / "config.json").read_text())["vocab_size"] == 49152  # the tokenizer's
    variants = bench.lever_overrides(0.5, 48.0)  # 4,096 tokens: less than the 6 dialogues keep
    assert list(variants) == ["bf16 KV", "fp8 KV", "KV cache 0.5 GiB", "KV cache 0.5 GiB + 48 GiB host"]
    plans = {}
    for k, (name, extra) in enumerate(variants.items()):
        cfg = bench.compose_config(
            args, model, tmp_path / f"lever-{k}", *extra, "plan.gpus=1", "plan.gpu_memory_gib=80"
        )
        configs = factory.model_configs({r: cfg[r] for r in ("user_agent", "assistant", "judge")})
        assert len(set(configs.values())) == 1  # one engine serves every role
        plans[name] = bench.predicted(cfg, tmp_path / f"lever-{k}.json", "h100")
    key = "Llama-3.1-8B-Instruct"
    assert abs(plans["fp8 KV"]["kv_tokens"][key] - 2 * plans["bf16 KV"]["kv_tokens"][key]) <= 1  # one budget
    small, offloaded = plans["KV cache 0.5 GiB"], plans["KV cache 0.5 GiB + 48 GiB host"]
    assert small["kv_tokens"][key] == 2**29 // (32 * 8 * 128 * 2 * 2) == offloaded["kv_tokens"][key]
    assert "host_kv_tokens" not in small and offloaded["host_kv_tokens"][key] == 96 * small["kv_tokens"][key]
    assert offloaded["prefilled_share"] < small["prefilled_share"] and offloaded["reloaded_share"] > 0
    assert all(p["tokens_per_s"] > 0 for p in plans.values())
