"""Speculative decoding on the real vLLM CPU build: `generate` with the embedded model drafting n-grams
(one engine for the user agent and the assistant) records the engine's own spec-decode counters over the
invocation (engines/vllm/spec_stats.py), once for the model, and `personalens plan plan.calibrate=` on
that run prints the acceptance they give. The server side of the records is tests/test_spec_decode.py."""

from __future__ import annotations

import json

import pytest
from cli_helpers import ENGINE_CORE_HERE, run_cli

pytestmark = pytest.mark.vllm

NGRAM = "{method:ngram,num_speculative_tokens:3,prompt_lookup_max:4}"
# three SD dialogues of one round of short replies each, both roles one speculative model config (one engine)
ARGS = (
    "protocol=quick",
    "protocol.max_rounds_sd=1",
    "protocol.user_agent.max_tokens=32",
    "protocol.assistant.max_tokens=48",
    "data.users=[1]",
    "data.kinds=SD",
    "progress=false",
    f"assistant.speculative={NGRAM}",
    f"user_agent.speculative={NGRAM}",
)


def test_generate_records_its_drafts_and_plan_models_the_measured_acceptance(tmp_path):
    out = tmp_path / "run"
    run_cli("generate", *ARGS, f"run.out_dir={out}", env=ENGINE_CORE_HERE)
    summaries = out / "logs" / "summaries"
    [record] = [json.loads(line) for line in (summaries / "spec_decode.jsonl").read_text().splitlines()]
    [generated] = [json.loads(line) for line in (summaries / "generate.jsonl").read_text().splitlines()]
    assert (record["model"], record["command"]) == ("SmolLM2-135M-Instruct", "generate")
    drafts, drafted, accepted = record["drafts"], record["draft_tokens"], record["accepted_tokens"]
    # n-grams of the prompts found: steps that drafted, at most 3 tokens each, some accepted; each such
    # step of a sequence generated at least its own token
    assert 0 < drafts <= drafted <= 3 * drafts and 0 < accepted <= drafted
    assert drafts < generated["completion_tokens"]

    # a second invocation with nothing left to do loads no engine and records nothing
    run_cli("generate", *ARGS, f"run.out_dir={out}", env=ENGINE_CORE_HERE)
    assert len((summaries / "spec_decode.jsonl").read_text().splitlines()) == 1

    plan = ("plan.gpus=1", "plan.gpu_memory_gib=80", "plan.jobs=[generate]", f"plan.out={tmp_path / 'plan.json'}")
    printed = run_cli("plan", *ARGS, *plan, f"plan.calibrate={out}").stdout
    assert (
        f"speculative decoding (ngram) of SmolLM2-135M-Instruct: {1 + accepted / drafts:.2f} tokens a verifying "
        f"step ({accepted / drafted:.0%} of {drafted / drafts:.1f} drafted accepted), measured by {out}"
    ) in printed
