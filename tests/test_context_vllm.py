"""`personalens run` with a context smaller than the protocol's prompts, on the real vLLM engine: the
dialogues that outgrow it end on context and are counted, the judge prompts that do not fit are
refused one by one, the run exits 0 with its report, and a resumed run adds nothing. The same
dialogues generated through a managed vLLM server end the same way after as many turns."""

from __future__ import annotations

from collections import Counter

import pytest
from cli_helpers import read_rows
from test_endings import csv_rows

from personalens.data import load_scenarios
from personalens.paths import PROJECT_ROOT

CONTEXT = 1000
REPLY = {"user": 64, "assistant": 96}  # conf/protocol/quick.yaml
ROLES = ("assistant", "user_agent", "judge")


@pytest.mark.vllm
def test_a_run_whose_prompts_outgrow_the_context_finishes_with_every_scenario_once(tmp_path):
    from cli_helpers import ENGINE_CORE_HERE, run_cli

    out = tmp_path / "run"
    args = (
        "run",
        "protocol=quick",
        "data.users=[0]",
        f"run.out_dir={out}",
        "progress=false",
        # the judge's longest prompts (personalization reads the profile) and its shortest
        "judging.dimensions=[task_completion,personalization]",
        # one engine for all three roles (same model config), with a context the official prompts outgrow
        *(f"{role}.max_model_len={CONTEXT}" for role in ROLES),
    )
    first = run_cli(*args, timeout=3000, env=ENGINE_CORE_HERE)

    scenarios = load_scenarios(PROJECT_ROOT / "data" / "sample", [0], "both")
    dialogues = read_rows(out / "dialogues")
    keys = [(d["user_id"], d["task_id"]) for d in dialogues]
    assert sorted(keys) == sorted(s.key for s in scenarios)  # every scenario, once
    ended = Counter(d["ended"] for d in dialogues)
    assert ended["context"] > 0 and ended["failed"] == 0, ended
    # no request was sent that left less than its reply's budget inside the context
    for d in dialogues:
        for turn in d["turns"]:
            assert turn["prompt_tokens"] + REPLY[turn["role"]] <= CONTEXT, (d["task_id"], turn["prompt_tokens"])
            assert turn["finish_reason"] in ("stop", "length")
    assert f"{ended['context']} context full" in first.stderr
    trace = read_rows(out / "trace")
    assert sum(r["context_ended"] for r in trace) == ended["context"]

    # judge prompts longer than the context are refused one by one; the others are judged
    judgments = read_rows(out / "judgments")
    refused = [j for j in judgments if (j["failure"] or "").startswith("prompt does not fit the judge's context")]
    assert refused and len(refused) < len(judgments)
    assert all(not j["parsed"] and j["finish_reason"] is None for j in refused)
    judged = {(j["user_id"], j["task_id"]) for j in judgments}
    assert judged == {k for k, d in zip(keys, dialogues) if d["turns"]}  # context endings judged too

    report = out / "report"
    endings = {r["kind"]: r for r in csv_rows(report / "endings.csv")}
    assert sum(int(r["context"]) for r in endings.values()) == ended["context"]
    failures = csv_rows(report / "parse_failures.csv")
    assert sum(int(r[f"{k}_refused"]) for r in failures for k in ("SD", "MD")) == len(refused)
    assert "ended on a full context" in (report / "report.md").read_text()

    # the same dialogues through a managed vLLM server (one for the three roles' model) end the same
    # way after as many turns: the server engine measures prompts with the model's tokenizer too
    served_out = tmp_path / "served"
    served_args = [a for a in args[1:] if not a.startswith("run.out_dir=")]
    served_args += [f"run.out_dir={served_out}", *(f"{r}.placement=managed_server" for r in ROLES)]
    served = run_cli("generate", *served_args, timeout=3000)
    assert "managed vLLM server" in served.stderr, served.stderr[-4000:]
    ended_in_process = {(d["user_id"], d["task_id"]): (d["ended"], len(d["turns"])) for d in dialogues}
    served_rows = read_rows(served_out / "dialogues")
    ended_served = {(d["user_id"], d["task_id"]): (d["ended"], len(d["turns"])) for d in served_rows}
    assert ended_served == ended_in_process
    assert all(t["prompt_tokens"] + REPLY[t["role"]] <= CONTEXT for d in served_rows for t in d["turns"])

    # a resumed run finds everything done
    second = run_cli(*args, timeout=3000, env=ENGINE_CORE_HERE)
    assert f"0 dialogues simulated ({len(dialogues)} already done" in second.stderr
    assert len(read_rows(out / "dialogues")) == len(dialogues)
    assert len(read_rows(out / "judgments")) == len(judgments)
