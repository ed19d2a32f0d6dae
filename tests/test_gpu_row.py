"""bench/gpu_row.py at its CPU size: a tiny architecture with random weights (`load_format: dummy`)
through generate, the raw replay, judge and report (on a GPU it runs a Table-3 row of a shipped
model's architecture)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from cli_helpers import REPO, read_rows
from omegaconf import OmegaConf

from personalens.data import load_scenarios

pytestmark = pytest.mark.vllm


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
