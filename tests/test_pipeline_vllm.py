"""The README's main command, `personalens run`, end to end on this CPU through the real vLLM
engine with grammar-constrained judging: dialogues, judgments, report. Its dialogues are also where
`personalens generate`'s output is checked (well-formed rows, the step trace, the saved config, a
rerun that finds everything done, the refusal to mix configurations): one vLLM start serves both."""

from __future__ import annotations

import csv
import json
import re
import struct
from collections import Counter, defaultdict

import numpy as np
import pytest
from cli_helpers import REPO, read_rows, run_cli
from omegaconf import OmegaConf

from personalens.data import load_scenarios
from personalens.engines.dtype import choose_dtype, read_cpu_flags

pytestmark = pytest.mark.vllm

RANGES = {
    "task_completion": (0.0, 1.0),
    "personalization": (1.0, 4.0),
    "naturalness": (1.0, 5.0),
    "coherence": (1.0, 5.0),
}


# short replies: nearly every reply of the embedded model runs to its budget, so the run's time grows
# with it; these tests check the pipeline's outputs, not what the replies say
SELECTION = (
    "data.users=0",
    "protocol=quick",
    "protocol.user_agent.max_tokens=16",
    "protocol.assistant.max_tokens=24",
    "judging.turn_level=true",
)


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    out = tmp_path_factory.mktemp("pipeline") / "run"
    proc = run_cli("run", *SELECTION, f"run.out_dir={out}", "report.bootstrap=200")
    return out, proc


def test_every_dialogue_is_judged_on_every_dimension_with_a_parsed_score(pipeline):
    out, _ = pipeline
    dialogues = read_rows(out / "dialogues")
    judgments = read_rows(out / "judgments")
    scenarios = load_scenarios(REPO / "data" / "sample", "0", "both")
    assert len(dialogues) == len(scenarios)

    whole = [j for j in judgments if j["turn"] == -1]
    per_dialogue = Counter((j["user_id"], j["task_id"]) for j in whole)
    # TC, P, and naturalness + coherence once for each speaker
    assert set(per_dialogue.values()) == {6}
    assert set(per_dialogue) == {(d["user_id"], d["task_id"]) for d in dialogues}
    for j in judgments:
        assert j["parsed"], j["judge_text"]
        lo, hi = RANGES[j["dimension"]]
        assert lo <= j["score"] <= hi
        assert j["judge_model"] == "SmolLM2-135M-Instruct"
        assert len(j["prompt_hash"]) == 64
    speakers = Counter((j["dimension"], j["speaker"]) for j in whole)
    assert speakers[("naturalness", "user")] == speakers[("naturalness", "assistant")] == len(dialogues)

    # turn-level personalization: one judgment per assistant reply
    turn_level = Counter((j["user_id"], j["task_id"]) for j in judgments if j["turn"] >= 1)
    assert turn_level == Counter({(d["user_id"], d["task_id"]): d["rounds"] for d in dialogues})


def keys(rows: list[dict]) -> list[tuple]:
    return [(r["user_id"], r["task_id"], r["setting"], r["trial"]) for r in rows]


def test_generate_writes_one_wellformed_row_per_dialogue_and_resumes(pipeline):
    out, first = pipeline
    args = ["generate", *SELECTION, f"run.out_dir={out}", "progress=false"]
    rows = read_rows(out / "dialogues")
    selected = {
        (s.user.user_id, s.task.task_id, "base", 0) for s in load_scenarios(REPO / "data" / "sample", "0", "both")
    }
    assert sorted(keys(rows)) == sorted(selected)
    assert "dialogues simulated" in first.stderr and "tokens/s" in first.stderr
    # later turns of a dialogue extend its earlier prompts, and every dialogue shares the fixed
    # instructions: a good part of the prompt tokens must come from vLLM's prefix cache
    cached = re.search(r"prompts (\d+) tokens, (\d+)% from the prefix cache", first.stderr)
    assert cached and int(cached[1]) > 0 and int(cached[2]) >= 30, first.stderr
    for row in rows:
        roles = [t["role"] for t in row["turns"]]
        assert roles[0] == "user" and all(a != b for a, b in zip(roles, roles[1:]))
        assert row["rounds"] == roles.count("assistant")
        # the default fidelity option (official): after the 3rd assistant reply the user agent still
        # answers, and a TERMINATE there earns a 4th assistant reply
        if row["ended"] == "terminated":
            assert roles[-1] == "assistant" and row["rounds"] <= 4
        else:
            assert row["ended"] == "max_rounds" and roles[-1] == "user" and row["rounds"] == 3
        assert all(t["completion_tokens"] > 0 and t["prompt_tokens"] > 0 for t in row["turns"])
        assert all("TERMINATE" not in t["text"] for t in row["turns"][1:])
        assert row["assistant_model"] == row["user_model"] == "SmolLM2-135M-Instruct"
        assert row["kind"] == ("SD" if row["task_id"].startswith("SD-") else "MD")
    # the step trace: one row per batched call (one engine serves both roles: one call per step),
    # with vLLM's per-request finishes all reported, in order within the call's wall time
    trace = sorted(read_rows(out / "trace" / "shard-000-of-001"), key=lambda r: r["step"])
    assert [r["step"] for r in trace] == list(range(1, len(trace) + 1)) and all(r["call"] == 0 for r in trace)
    assert sum(r["requests"] for r in trace) == sum(len(row["turns"]) for row in rows)
    assert sum(r["completion_tokens"] for r in trace) == sum(
        t["completion_tokens"] for row in rows for t in row["turns"]
    )
    for r in trace:
        assert r["reported"] == r["requests"] and r["roles"] in (["user"], ["assistant"], ["assistant", "user"])
        assert 0 < r["first_finished"] <= r["last_finished"] <= r["seconds"] and 0 <= r["tail"] <= r["last_finished"]
        assert r["prompt_tokens"] > r["cached_tokens"] >= 0 and r["model"] == "SmolLM2-135M-Instruct"
    assert all(a["started"] + a["seconds"] <= b["started"] for a, b in zip(trace, trace[1:]))
    assert re.search(rf"{len(trace)} batched calls, \d+% of their wall time in the straggler tail", first.stderr)
    saved = OmegaConf.load(out / "generate.yaml")
    assert saved.config.assistant.dtype == "auto"  # as configured; what it became is recorded beside it
    expected = choose_dtype("auto", on_cpu=True, cpu_flags=read_cpu_flags())
    assert saved.resolved.assistant.dtype == OmegaConf.create(vars(expected))
    assert "vllm" in (out / "logs" / "run.log").read_text()

    # same command again: nothing left to do, nothing duplicated
    again = run_cli(*args)
    assert "0 dialogues simulated" in again.stderr
    assert sorted(keys(read_rows(out / "dialogues"))) == sorted(keys(rows))

    # a changed configuration into the same output is refused, and writes nothing
    refused = run_cli(*args, "protocol.assistant.max_tokens=50", check=False)
    assert refused.returncode == 2
    assert "different configuration" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert len(read_rows(out / "dialogues")) == len(rows)


def test_the_report_holds_the_tables_and_figures(pipeline):
    out, proc = pipeline
    report = out / "report"
    for table in ("table3", "table12", "table13"):
        for ext in ("md", "csv", "tex"):
            assert (report / f"{table}.{ext}").stat().st_size > 0
    for figure in ("figure4.png", "figure5.png"):
        data = (report / figure).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
        width, height = struct.unpack(">II", data[16:24])
        assert width > 100 and height > 100
    # the Table 3 layout is printed at the end
    assert "SmolLM2-135M-Instruct" in proc.stdout and "TCR" in proc.stdout


def csv_rows(path) -> list[dict]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def test_the_report_checks_the_simulated_user_and_length_against_score(pipeline):
    out, _ = pipeline
    report = out / "report"
    dialogues = read_rows(out / "dialogues")
    (agent,) = {d["user_model"] for d in dialogues}
    flags = {row["assistant_model"]: row for row in csv_rows(report / "user_flags.csv")}
    assert set(flags) == {"SmolLM2-135M-Instruct", "all assistants"}
    total = flags["all assistants"]
    assert total["user_agent"] == agent and int(total["dialogues"]) == len(dialogues)
    # the leak rule was checked: the prompts were rebuilt from generate.yaml's templates and data
    assert total["leak"] != ""
    rules = [int(total[r]) for r in ("role_break", "leak", "early_terminate", "repeated", "empty")]
    flagged = int(total["flagged"])
    assert max(rules) <= flagged <= min(sum(rules), len(dialogues))
    assert int(total["early_terminate"]) == sum(d["opening_terminate"] for d in dialogues)
    assert float(total["flagged_share"]) == pytest.approx(100 * flagged / len(dialogues), abs=1e-9)
    # Table 3 without the flagged dialogues has the others, and the difference is of the two tables
    (whole,) = csv_rows(report / "table3.csv")
    (difference,) = csv_rows(report / "table3_flag_difference.csv")
    # a row unless the embedded model's user agent spoilt every dialogue
    (clean,) = csv_rows(report / "table3_unflagged.csv") or [{}]
    assert sum(int(clean.get(f"{kind}_TCR_n") or 0) for kind in ("SD", "MD")) == len(dialogues) - flagged
    for key in ("SD_TCR", "SD_P", "MD_TCR", "MD_P"):
        if clean.get(f"{key}_mean") and whole[f"{key}_mean"]:
            expected = float(clean[f"{key}_mean"]) - float(whole[f"{key}_mean"])
            assert float(difference[key]) == pytest.approx(expected)
    # length against score: one rank correlation per metric over the dialogues with a parsed score
    lengths = {row["assistant_model"]: row for row in csv_rows(report / "length_score.csv")}
    assert set(lengths) == {"SmolLM2-135M-Instruct", "all assistants"}
    for key in ("TCR", "P", "Nat", "Coh"):
        cell = lengths["all assistants"]
        assert int(cell[f"{key}_n"]) == len(dialogues)  # every score parsed, every dialogue has a reply
        if cell[f"{key}_mean"]:  # empty when every score was the same
            assert -1 <= float(cell[f"{key}_lo"]) <= float(cell[f"{key}_mean"]) <= float(cell[f"{key}_hi"]) <= 1
    shown = (report / "report.md").read_text()
    assert "### Checks of the simulated user" in shown and "### Length against score" in shown
    assert "Table 3 without the dialogues a check of the simulated user flags" in (report / "report.html").read_text()


def test_the_terminal_shows_results_on_stdout_and_a_few_lines_on_stderr(pipeline):
    out, proc = pipeline
    # stdout carries the Table 3 layout alone, so `personalens run > table.md` captures just it
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert lines[0].startswith("### Table 3") and all(line.startswith(("|", "### ", "_")) for line in lines), (
        proc.stdout
    )
    # stderr: where the logs are, one line per model load, progress bars, summaries
    terminal = proc.stderr.splitlines()  # each progress-bar refresh counts as a line
    assert len(terminal) <= 40, proc.stderr
    log_file = out / "logs" / "run.log"
    assert terminal[0] == f"personalens run: library logs (vLLM, torch) go to {log_file}"
    loads = [line for line in terminal if line.startswith("loaded SmolLM2-135M-Instruct: ")]
    assert len(loads) == 1 and ", on cpu, in " in loads[0]  # one engine serves all three roles
    assert not any("INFO" in line or "WARNING" in line for line in terminal), proc.stderr
    # the judge's summary says how much of its prompts the prefix cache served, as generate's does
    # (personalization prompts share their long instructions across dialogues and turns)
    judged = re.search(
        r"judge: \d+ judgments in [\d.]+ s, 0 outputs without a valid score "
        r"\(0 refused by the engine, 0 cut at max_tokens, 0 stopped in their thinking\), "
        r"0 thinking tokens, 0 out-of-range scores kept as the released code keeps them; "
        r"prompts (\d+) tokens, (\d+)% from the prefix cache",
        proc.stderr,
    )
    assert judged and int(judged[1]) > 0 and int(judged[2]) > 0, proc.stderr
    # the libraries' logs, worker processes included, are in the log file
    log = log_file.read_text()
    assert "(EngineCore pid=" in log and "INFO" in log and "vllm" in log
    assert "loaded SmolLM2-135M-Instruct" in log  # personalens' own lines are kept there too


def test_rerunning_the_pipeline_judges_nothing_twice(pipeline):
    out, _ = pipeline
    before = read_rows(out / "judgments")
    proc = run_cli(
        "judge", "data.users=0", "protocol=quick", "judging.turn_level=true", f"run.out_dir={out}", "progress=false"
    )
    assert "judge: 0 judgments" in proc.stderr
    assert len(read_rows(out / "judgments")) == len(before)


def test_the_run_writes_report_html_and_exports_an_annotation_sheet(pipeline, tmp_path):
    out, _ = pipeline
    dialogues = read_rows(out / "dialogues")
    html = (out / "report" / "report.html").read_text()
    assert f"All {len(dialogues)} dialogues of the runs." in html
    assert all(d["task_id"] in html for d in dialogues)
    # Table 5's sheet from this real run: 3 dialogues, SD and MD both drawn, no judge output
    proc = run_cli(
        "agreement", "export", f"run.out_dir={out}", f"agreement.out_dir={tmp_path}", "agreement.dialogues=3"
    )
    assert "3 dialogues" in proc.stdout
    with open(tmp_path / "sheet.csv", newline="", encoding="utf-8-sig") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 3 and {r["kind"] for r in rows} == {d["kind"] for d in dialogues}
    judged = {j["judge_text"] for j in read_rows(out / "judgments")}
    guide = (tmp_path / "guide.html").read_text()
    assert not any(text.strip() and text in guide for text in judged)


def test_plan_counts_what_the_run_counted(pipeline, tmp_path):
    """`personalens plan` of the same config, before and after: the first prompts it renders and counts
    are the engine's; calibrated by the run, its token totals are the run's."""
    out, _ = pipeline
    dialogues = read_rows(out / "dialogues")
    run_cli("plan", *SELECTION, f"run.out_dir={out}", f"plan.out={tmp_path / 'plan.json'}")
    plan = json.loads((tmp_path / "plan.json").read_text())
    first = sum(d["turns"][0]["prompt_tokens"] for d in dialogues)
    assert plan["tokens"]["first_prompts"]["user_agent_total"] == pytest.approx(first, rel=0.05)
    assert plan["tokens"]["at_cap"]["all"]["generated"] >= sum(
        t["completion_tokens"] for d in dialogues for t in d["turns"]
    )

    run_cli(
        "plan", *SELECTION, f"run.out_dir={out}", f"plan.calibrate={out}", f"plan.out={tmp_path / 'calibrated.json'}"
    )
    calibrated = json.loads((tmp_path / "calibrated.json").read_text())
    estimate = calibrated["tokens"]["calibrated"]["all"]
    total = sum(t["prompt_tokens"] + t["completion_tokens"] for d in dialogues for t in d["turns"])
    assert estimate["prompt"] + estimate["generated"] == pytest.approx(total, rel=0.10)
    judged = calibrated["calibration"]["judge"]  # the judge's own summary of this run
    assert estimate["judgments"] == len(read_rows(out / "judgments")) == judged["items"]
    assert estimate["judge_prompt"] + estimate["judge_generated"] == pytest.approx(
        judged["prompt_tokens"] + judged["completion_tokens"], rel=0.10
    )
    rates = calibrated["time"]["rates_tokens_per_s"]
    assert rates["generate"] > 0 and rates["judge"] > 0 and calibrated["time"]["generate_s"]["all"] > 0


def test_a_second_trial_and_a_second_judging_split_each_scores_noise(pipeline, tmp_path):
    """The pipeline's run continued with `trials=2` and a second judge (the embedded model again at
    temperature 0.8): generate adds the second trial, model@judge judges it, the new judge judges
    both, and the report splits each Table 3 metric's variance down to the judge (report/noise.py)."""
    import shutil

    from cli_helpers import ENGINE_CORE_HERE

    out = tmp_path / "run"
    shutil.copytree(pipeline[0], out)  # its first trial, judged once: reused, not generated again
    again = "judges=[{name: again, sampling: {temperature: 0.8}}]"
    run_cli("run", *SELECTION, "trials=2", again, f"run.out_dir={out}", "report.bootstrap=200", env=ENGINE_CORE_HERE)
    judgments = [j for j in read_rows(out / "judgments") if j["turn"] == -1]
    assert len({(j["user_id"], j["task_id"], j["trial"]) for j in judgments}) == 2 * len(
        read_rows(pipeline[0] / "dialogues")
    )
    assert len({j["judge_key"] for j in judgments}) == 2
    rows = {(r["kind"], r["metric"]): r for r in csv_rows(out / "report" / "noise.csv")}
    assert {kind for kind, _ in rows} == {"SD", "MD"} and len(rows) == 8
    for row in rows.values():
        assert (row["users"], float(row["trials"]), float(row["judgings"])) == ("1", 2.0, 2.0)
        assert row["user_mean"] == "" and row["mde"] == ""  # one user: its scenarios are the resampled units
        assert all(row[f"{level}_mean"] != "" for level in ("scenario", "trial", "judging"))
    # the judge's share recomputed here: the pooled variance of a dialogue's two judgings around
    # their mean, each judge's mean offset removed first (one degree of freedom for the second judge)
    p = [j for j in judgments if j["kind"] == "SD" and j["dimension"] == "personalization" and j["parsed"]]
    offset = {k: np.mean([j["score"] for j in p if j["judge_key"] == k]) for k in {j["judge_key"] for j in p}}
    centred = defaultdict(list)
    for j in p:
        centred[(j["task_id"], j["trial"])].append(j["score"] - offset[j["judge_key"]])
    squares = sum(sum((x - np.mean(xs)) ** 2 for x in xs) for xs in centred.values())
    df = sum(len(xs) - 1 for xs in centred.values()) - (len(offset) - 1)
    assert float(rows[("SD", "P")]["judging_mean"]) == pytest.approx(squares / df, abs=1e-9)
    assert "Where a score's noise comes from" in (out / "report" / "report.md").read_text()
