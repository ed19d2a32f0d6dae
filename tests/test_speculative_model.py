"""Speculative decoding in `plan`, pure: modelled only from the spec-decode counters a calibration run
recorded (plan/speculative.py), as a model whose `speculative:` is unset or unmeasured runs without
it; the counters read where the calibration is read, as `generate` and `judge` write them
(tests/test_spec_decode.py)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from personalens.engines.models.config import ModelConfig
from personalens.engines.placement.architecture import Architecture
from personalens.engines.placement.gpus import GIB
from personalens.engines.placement.placed import Placement
from personalens.engines.placement.sizing import ModelNeed
from personalens.engines.spec_decode import SpecDecodeRecord
from personalens.plan.calibration import read_calibration
from personalens.plan.engine_model import Turn
from personalens.plan.gpu_model import GPUS, decode_step, engine_of
from personalens.plan.limit import node_limit
from personalens.plan.speculative import SpecDecode, measured
from personalens.plan.text import _speculative
from personalens.store import append_summary
from personalens.store.summaries import summaries_dir

ARCHITECTURES = Path(__file__).parent / "fixtures" / "architectures"
NGRAM = (("method", "ngram"), ("num_speculative_tokens", 3), ("prompt_lookup_max", 4))


def _calibration_run(run: Path) -> Path:
    (run / "dialogues").mkdir(parents=True)
    turns = [{"role": "user", "prompt_tokens": 10, "completion_tokens": 20}]
    row = {"user_id": "u", "user_index": 0, "task_id": "t", "kind": "SD", "turns": turns}
    pq.write_table(pa.Table.from_pylist([row]), run / "dialogues" / "part-0.parquet")
    return run


def test_a_calibration_run_gives_each_models_spec_decode_counters_summed(tmp_path):
    run = _calibration_run(tmp_path / "run")
    assert read_calibration(run).spec_decode == {}  # a run that recorded none
    for index in (0, 1):  # two shards' invocations
        append_summary(run, "spec_decode", index, 2, SpecDecodeRecord("m", "generate", 400, 1200, 300))
    append_summary(run, "spec_decode", 0, 1, SpecDecodeRecord("never drafted", "judge", 0, 0, 0))
    with open(summaries_dir(run) / "spec_decode.jsonl", "a") as f:
        f.write(json.dumps({"model": "m", "drafts": 5}) + "\n" + '{"model": "m", "dra')  # partial, cut off
    [measured] = read_calibration(run).spec_decode.values()
    assert (measured.model, measured.drafts, measured.draft_tokens, measured.accepted_tokens) == ("m", 800, 2400, 600)
    assert measured.source == str(run)
    # a quarter of the drafts accepted: 1.75 tokens a verifying step, 3 drafted in each
    assert (measured.tokens_per_step, measured.drafted, measured.acceptance) == (1.75, 3.0, 0.25)


def _need(speculative=()) -> ModelNeed:
    arch = Architecture.from_config(json.loads((ARCHITECTURES / "llama31_8b.json").read_text()))
    config = ModelConfig("Llama-3.1-8B-Instruct", speculative=speculative)
    return ModelNeed(config.name, ("assistant",), arch, arch.parameters() * 2, 2, config=config)


def test_a_speculative_model_is_modelled_from_its_measurement_only(tmp_path):
    need, plain = _need(NGRAM), _need()
    placed = Placement(need.config, need.roles, "in_process", need.config, need.key, (0,), kv_per_token_per_gpu=1)
    placed = dataclasses.replace(placed, kv_cache_memory_bytes=40 * GIB)
    h100 = GPUS["h100"]
    spec = SpecDecode(need.config.name, 100, 300, 100, "runs/pilot")  # 2 tokens a verifying step
    runs = {need.config.name: spec}
    assert measured(plain, runs) is None and measured(need, {}) is None  # not speculative; unmeasured
    without = engine_of(need, placed, h100, measured(need, {}))
    assert without == engine_of(plain, placed, h100)  # as without it
    drafting = engine_of(need, placed, h100, measured(need, runs))
    assert (drafting.tokens_per_step, drafting.drafted) == (2.0, 3.0)
    # 16 sequences decoding: memory-bound even with 3 drafts each, so a token takes half the time
    assert drafting.decode_seconds(16, 20_000, 50) == pytest.approx(without.decode_seconds(16, 20_000, 50) / 2)
    assert drafting.step_seconds(16, 0, 20_000) == pytest.approx(without.step_seconds(16, 0, 20_000) / 2)
    # 256 sequences: the drafts' arithmetic (4 tokens each) bounds the step, and gains less than half
    assert drafting.decode_seconds(256, 0, 50) > without.decode_seconds(256, 0, 50) / 2
    # a step that also prefills computes the drafts and gains nothing
    assert drafting.step_seconds(16, 2048, 20_000) > without.step_seconds(16, 2048, 20_000)
    # what plan prints: the measurement, or one line saying none is known
    unmeasured, known = decode_step(need, h100), decode_step(need, h100, spec)
    assert unmeasured["speculative"] == "ngram" and "tokens_per_step" not in unmeasured
    assert _speculative(("m", unmeasured)).endswith(
        "no measured acceptance rate, so modelled as without it "
        + ("(a calibration run that recorded vLLM's spec-decode counters gives one: plan.calibrate=)")
    )
    assert "2.00 tokens a verifying step (33% of 3.0 drafted accepted), measured by runs/pilot" in _speculative(
        ("m", known)
    )
    # the node's limit: weights and KV read once a verifying step for the tokens it gains
    work = [[[Turn("assistant", 1000, 0, 200)] for _ in range(64)]]
    floors = node_limit([need], work, h100, 8)["models"][need.key]
    drafted = node_limit([need], work, h100, 8, runs)["models"][need.key]
    assert drafted["bytes_read"] == pytest.approx(floors["bytes_read"] / 2)
    assert node_limit([plain], work, h100, 8, runs)["models"][need.key] == floors
