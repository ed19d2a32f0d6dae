"""Dialogues that end on a full context or fail, judge outputs cut or refused, through the `generate`,
`judge` and `report` commands with scripted engines (pure logic; tests/test_context_vllm.py runs
`personalens run` with the real vLLM engine and a small max_model_len)."""

from __future__ import annotations

import csv
import dataclasses
from pathlib import Path

from cli_helpers import read_rows
from test_fidelity import PromptRecorder, config

from personalens.config import run as R
from personalens.engines.base import rejected
from personalens.judge import command as judge_command
from personalens.report import command as report_command
from personalens.simulate import command as simulate_command

TOO_LONG = "This model's maximum context length is 2048 tokens. However, your prompt contains 2100 input tokens"


class Dialogues(PromptRecorder):
    """Refuses the first request of the tasks in `refuse` (a task's user intent, which its user agent's
    prompt holds -> message), cuts every assistant reply at its max_tokens, answers the rest as
    PromptRecorder does."""

    def __init__(self, refuse: dict[str, tuple[int, str]]):
        super().__init__()
        self.refuse = dict(refuse)  # user intent -> (requests of the dialogue answered before, message)

    def generate(self, requests, on_finished=None):
        out = []
        for request, gen in zip(requests, super().generate(requests, on_finished)):
            prompt = "".join(m["content"] for m in request.messages)
            task = next((t for t in self.refuse if t in prompt), None)
            if task is not None and self.refuse[task][0] == 0:
                out.append(rejected(self.refuse.pop(task)[1]))
            elif task is not None:
                self.refuse[task] = (self.refuse[task][0] - 1, self.refuse[task][1])
                out.append(dataclasses.replace(gen, finish_reason="stop"))
            elif not request.messages[-1]["content"].startswith("<user_profile>"):  # an assistant turn
                out.append(dataclasses.replace(gen, finish_reason="length"))
            else:
                out.append(dataclasses.replace(gen, finish_reason="stop"))
        return out


class Judge(PromptRecorder):
    """Naturalness outputs cut before their score; coherence requests refused (one over the judge's
    context, the rest as bad requests); the rest parsed."""

    def generate(self, requests, on_finished=None):
        out = []
        for i, (request, gen) in enumerate(zip(requests, super().generate(requests, on_finished))):
            if "Naturalness" in request.grammar:
                out.append(
                    dataclasses.replace(gen, text="<response>\nNatur", completion_tokens=7, finish_reason="length")
                )
            elif "Coherence" in request.grammar:
                out.append(rejected(TOO_LONG if i % 2 else "VLLMValidationError: bad request"))
            else:
                out.append(dataclasses.replace(gen, finish_reason="stop"))
        return out


def csv_rows(path: Path) -> list[dict]:
    with open(path) as f:
        return list(csv.DictReader(f))


def test_endings_refusals_and_cut_outputs_are_stored_counted_and_reported(tmp_path):
    out = tmp_path / "run"
    cfg = config(f"run.out_dir={out}")
    # the first two tasks of user 0: one refused as too long at the user agent's second turn (a context
    # ending), one at its opening for another reason (only user-agent prompts hold the intent)
    scenarios = R.scenarios(cfg)
    tasks = [s.task.task_id for s in scenarios]
    described = [s.task.user_intent for s in scenarios]
    assert len(set(described)) == len(described)
    engine = Dialogues({described[0]: (1, TOO_LONG), described[1]: (0, "VLLMValidationError: bad sampling parameter")})
    assert simulate_command.generate(cfg, lambda: {"user_agent": engine, "assistant": engine}) == 0
    dialogues = {d["task_id"]: d for d in read_rows(out / "dialogues")}
    assert len(dialogues) == len(tasks)
    assert (dialogues[tasks[0]]["ended"], dialogues[tasks[0]]["error"]) == ("context", TOO_LONG)
    assert dialogues[tasks[1]]["ended"] == "failed" and "bad sampling" in dialogues[tasks[1]]["error"]
    assert [t["role"] for t in dialogues[tasks[0]]["turns"]] == ["user", "assistant"] and dialogues[tasks[1]][
        "turns"
    ] == []
    rest = [d for t, d in dialogues.items() if t not in tasks[:2]]
    assert {d["ended"] for d in rest} <= {"terminated", "max_rounds"} and all(d["error"] is None for d in rest)
    # every turn carries its finish reason; one invocation wrote them all
    reasons = {(t["role"], t["finish_reason"]) for d in rest for t in d["turns"]}
    assert reasons == {("user", "stop"), ("assistant", "length")}
    assert len({d["session_started"] for d in dialogues.values()}) == 1
    trace = read_rows(out / "trace")
    assert sum(r["refused"] for r in trace) == 2
    assert sum(r["cut"] for r in trace) == sum(d["rounds"] for d in dialogues.values())

    assert judge_command.judge(cfg, lambda: {"judge": Judge()}) == 0
    judgments = read_rows(out / "judgments")
    judged = {j["task_id"] for j in judgments}
    assert tasks[1] not in judged and tasks[0] in judged  # failed: not judged; context: judged
    for j in judgments:
        if j["dimension"] == "naturalness":
            assert (j["parsed"], j["failure"], j["finish_reason"]) == (False, "cut at 7 tokens", "length")
        elif j["dimension"] == "coherence":
            assert not j["parsed"] and j["finish_reason"] is None
            assert j["failure"].startswith(("refused: VLLMValidationError", "prompt does not fit the judge's context"))
        else:
            assert (j["parsed"], j["failure"], j["finish_reason"]) == (True, None, "stop")

    assert report_command.report(cfg) == 0
    report = out / "report"
    endings = {r["kind"]: r for r in csv_rows(report / "endings.csv")}
    written = list(dialogues.values())
    for kind, row in endings.items():
        of_kind = [d for d in written if d["kind"] == kind]
        assert int(row["dialogues"]) == len(of_kind)
        for ending in ("terminated", "max_rounds", "context", "failed"):
            assert int(row[ending]) == sum(d["ended"] == ending for d in of_kind)
    assert sum(int(r["context"]) for r in endings.values()) == 1
    assert sum(int(r["failed"]) for r in endings.values()) == 1
    cut = {r["role"]: r for r in csv_rows(report / "cut_replies.csv")}
    assert float(cut["assistant"]["cut_share"]) == 100.0 and float(cut["user agent"]["cut_share"]) == 0.0
    judge_outputs = [j for j in judgments if j["finish_reason"] is not None]
    assert int(cut["judge"]["replies"]) == len(judge_outputs)
    assert int(cut["judge"]["cut"]) == sum(j["dimension"] == "naturalness" for j in judgments)
    failures = csv_rows(report / "parse_failures.csv")
    by_dimension = {r["dimension"]: r for r in failures}
    for kind in ("SD", "MD"):
        nat = [j for j in judgments if j["dimension"] == "naturalness" and j["kind"] == kind]
        coh = [j for j in judgments if j["dimension"] == "coherence" and j["kind"] == kind]
        assert int(by_dimension["naturalness (assistant)"][f"{kind}_cut"]) == sum(
            j["speaker"] == "assistant" for j in nat
        )
        assert int(by_dimension["coherence (assistant)"][f"{kind}_refused"]) == sum(
            j["speaker"] == "assistant" for j in coh
        )
    text = (report / "report.md").read_text()
    assert "How dialogues ended" in text and "Replies cut at max_tokens" in text
    assert "ended on a full context" in text  # Table 3's note
