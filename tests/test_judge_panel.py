"""A judge panel through the `judge` and `report` commands with scripted judges (the real-vLLM run is
tests/test_judge_panel_vllm.py): each judge's rows kept apart under its key and resumable on its own,
a stored run re-judged by a new judge (only its rows added), rows written before judge keys counted
as the run's judge's, bad panels refused, and the report's tables per judge with their agreement."""

from __future__ import annotations

import csv
import hashlib
from collections import Counter

import pytest
from cli_helpers import read_rows
from test_fidelity import PromptRecorder, config, layout

from personalens.config.judges import panel
from personalens.engines.base import Generation
from personalens.errors import PersonalensError
from personalens.judge import command as judge_command
from personalens.report import command as report_command
from personalens.simulate import command as simulate_command

WARM = "judges=[{name: warm, sampling: {temperature: 0.7}}]"
SCORES = {"VERDICT": 2, "Personalization": 4, "Naturalness": 5, "Coherence": 5}


class Judge(PromptRecorder):
    """Scores a request from a hash of its prompt; at temperature > 0 one score in three moves up
    by one (wrapping), so two such judges agree to a degree."""

    name = "scripted-judge"

    def generate(self, requests, on_finished=None):
        self.requests += requests
        return [Generation(self.verdict(r), prompt_tokens=10, completion_tokens=2) for r in requests]

    @staticmethod
    def verdict(request) -> str:
        key = next(k for k in SCORES if k in request.grammar)
        digest = int(hashlib.sha256(request.messages[-1]["content"].encode()).hexdigest(), 16)
        score = digest % SCORES[key]
        if request.sampling.temperature > 0 and digest % 3 == 0:
            score = (score + 1) % SCORES[key]
        if key == "VERDICT":
            return f"VERDICT: {'True' if score else 'False'}\nEXPLANATION: done"
        return layout(key.lower(), str(score + 1), ["- a", "b", "- c"][: 3 if key == "Personalization" else 1])


def generated(tmp_path, *overrides):
    out = tmp_path / "run"
    cfg = config(f"run.out_dir={out}", "data.kinds=SD", *overrides)
    recorder = PromptRecorder()
    assert simulate_command.generate(cfg, lambda: {"user_agent": recorder, "assistant": recorder}) == 0
    return out, cfg


def by_key(out) -> Counter:
    return Counter(r["judge_key"] for r in read_rows(out / "judgments"))


def test_rejudging_adds_only_the_new_judges_rows_and_each_resumes_alone(tmp_path):
    out, cfg = generated(tmp_path)
    judge = Judge()
    assert judge_command.judge(cfg, lambda: {"judge": judge}) == 0
    (first,) = by_key(out).items()
    parts = {p: p.read_bytes() for p in (out / "judgments").rglob("part-*.parquet")}

    panel_cfg = config(f"run.out_dir={out}", "data.kinds=SD", WARM)
    judge.requests.clear()
    assert judge_command.judge(panel_cfg, lambda: {"judge": judge}) == 0
    keys = by_key(out)
    assert len(keys) == 2 and keys[first[0]] == first[1] and sum(keys.values()) == 2 * first[1]
    assert len(judge.requests) == first[1] and all(r.sampling.temperature == 0.7 for r in judge.requests)
    assert all(p.read_bytes() == data for p, data in parts.items())  # the first judge's rows untouched
    assert (out / "judge.yaml").is_file() and (out / "judge-warm.yaml").is_file()

    judge.requests.clear()
    assert judge_command.judge(panel_cfg, lambda: {"judge": judge}) == 0
    assert not judge.requests and by_key(out) == keys  # nothing missing: no request at all


def test_rows_written_before_judge_keys_are_the_runs_judges(tmp_path):
    import pyarrow.parquet as pq

    out, cfg = generated(tmp_path)
    judge = Judge()
    assert judge_command.judge(cfg, lambda: {"judge": judge}) == 0
    for path in (out / "judgments").rglob("part-*.parquet"):  # as a run written before the column
        table = pq.read_table(path)
        pq.write_table(table.drop_columns(["judge_key"]), path)
    judge.requests.clear()
    assert judge_command.judge(config(f"run.out_dir={out}", "data.kinds=SD", WARM), lambda: {"judge": judge}) == 0
    assert all(r.sampling.temperature == 0.7 for r in judge.requests) and judge.requests
    assert report_command.report(cfg) == 0
    with open(out / "report" / "judge_agreement.csv") as f:
        assert len(list(csv.DictReader(f))) == 6  # one pair of judges, six metrics


def test_the_report_gives_table3_per_judge_their_agreement_and_the_panel_score(tmp_path):
    out, _ = generated(tmp_path)
    cfg = config(f"run.out_dir={out}", "data.kinds=SD", WARM, "report.bootstrap=200")
    assert judge_command.judge(cfg, lambda: {"judge": Judge()}) == 0
    assert report_command.report(cfg) == 0
    report = out / "report"
    md = (report / "report.md").read_text()
    assert "Table 3 under judge judge (SmolLM2-135M-Instruct)" in md
    assert "Table 3 under judge warm (SmolLM2-135M-Instruct)" in md
    assert "Agreement between judges" in md and "Table 3 under the panel score of 2 judges" in md
    page = (report / "report.html").read_text()
    assert "Table 3 under judge warm" in page and "Agreement between judges" in page
    from personalens.report.browse import browsable

    shown = browsable([out], 100, 0).dialogues  # the page's dialogue browser: model@judge's scores alone
    assert shown and all(len([j for j in d["judgments"] if j["turn"] == -1]) == 6 for d in shown)
    # the assistant and both judges are SmolLM2 (family: smollm): named beside the numbers
    assert md.count("Self-preference: judge") >= 3
    with open(report / "judge_agreement.csv") as f:
        rows = list(csv.DictReader(f))
    weights = {r["metric"]: r["weights"] for r in rows}
    assert weights == {"TCR (%)": "none", **{m: "quadratic" for m in weights if m != "TCR (%)"}} and len(weights) == 6
    p = next(r for r in rows if r["metric"] == "P")
    assert float(p["kappa_mean"]) < 1 and p["kappa_n"] == "4"  # the warm judge moved some scores
    # the paper's judge-human kappa beside the judges' own, and what to add against self-preference
    from personalens.data.paper import paper_table5

    assert float(p["paper_cohen"]) == paper_table5()[("personalization", "")].cohen
    assert "Add a judge of another family (" in md
    # two judgings of every dialogue: the report splits each metric's noise down to the judge
    with open(report / "noise.csv") as f:
        noise = {r["metric"]: r for r in csv.DictReader(f)}
    assert float(noise["P"]["judgings"]) == 2.0 and float(noise["P"]["trials"]) == 1.0
    assert noise["P"]["judging_mean"] != "" and noise["P"]["trial_mean"] == ""  # one trial: not split off
    # the report's own Table 3 holds model@judge's rows alone: as many dialogues as one judge scored
    with open(report / "table3.csv") as f, open(report / "table3_judge.csv") as g:
        assert next(csv.DictReader(f))["SD_TCR_n"] == next(csv.DictReader(g))["SD_TCR_n"]
    # every per-judge table is named by its judge, in its file name and in its judge column
    for stem in ("table3", "table3_unflagged", "table3_flag_difference", "length_score"):
        for saved, name in (("judge", "judge"), ("judge-warm", "warm")):
            with open(report / f"{stem}_{saved}.csv") as f:
                rows = list(csv.DictReader(f))
            assert rows and {(r["judge"], r["judge_model"]) for r in rows} == {(name, "SmolLM2-135M-Instruct")}
    assert not list(report.glob("table3_judge1.*"))


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("judges=[{name: judge}]", "no judge name"),
        ("judges=[{name: a},{name: a, sampling: {temperature: 0.5}}]", "names two judges"),
        ("judges=[{name: a, sampling: {temprature: 0.5}}]", r"judges\[0\]\.sampling: unknown field"),
        ("judges=[{name: a, model: nosuch}]", "not a model config"),
        ("judges=[{name: a, colour: red}]", "unknown field"),
    ],
)
def test_bad_panels_are_refused_in_one_line(override, message):
    with pytest.raises(PersonalensError, match=message):
        panel(config(override))


def test_a_panel_judge_on_a_server_the_lab_runs_takes_the_server_block_its_model_config_lacks():
    served = "{engine: server, server: {base_url: 'http://gpu-node-8:8000/v1', api_key_env: LAB_KEY}}"
    default, remote = panel(config(f"judges=[{{name: remote, model: llama31_8b, set: {served}}}]"))
    assert "server" not in default.cfg.judge and remote.cfg.judge.engine == "server"
    assert (remote.cfg.judge.server.base_url, remote.cfg.judge.family) == ("http://gpu-node-8:8000/v1", "llama")
    with pytest.raises(PersonalensError, match=r"judges\[0\]\.set: unknown field\(s\) \['servr'\]"):
        panel(config("judges=[{name: remote, set: {servr: {base_url: x}}}]"))


def test_the_same_judge_twice_is_refused_before_any_work(tmp_path):
    out, _ = generated(tmp_path)
    cfg = config(f"run.out_dir={out}", "data.kinds=SD", "judges=[{name: again}]")
    with pytest.raises(PersonalensError, match="again is the same judge as judge"):
        judge_command.judge(cfg, lambda: {"judge": Judge()})
    assert not (out / "judgments").exists()


def test_compare_puts_two_judges_of_one_run_side_by_side_as_a_distinct_mode(tmp_path):
    from personalens.compare import build_comparison
    from personalens.compare.judges import HEADING

    out, _ = generated(tmp_path)
    cfg = config(f"run.out_dir={out}", "data.kinds=SD", WARM)
    assert judge_command.judge(cfg, lambda: {"judge": Judge()}) == 0
    result = build_comparison([out], tmp_path / "cmp", bootstrap=200, judges=["judge", "warm"])
    (comparison,) = result.comparisons
    assert comparison.kind == "judges" and comparison.title.startswith(
        "judge warm (SmolLM2-135M-Instruct) - judge judge"
    )
    p = next(r for r in comparison.rows if r.kind == "SD" and r.metric.key == "P")
    assert p.difference is not None and p.difference.n == 4
    md = (tmp_path / "cmp" / "compare.md").read_text()
    assert HEADING in md and "Self-preference: judge warm" in md
    with pytest.raises(PersonalensError, match="has no judge cold"):
        build_comparison([out], tmp_path / "cmp2", judges=["judge", "cold"])
    with pytest.raises(PersonalensError, match="give one run, not 2"):
        build_comparison([out, tmp_path], tmp_path / "cmp3", judges=["judge", "warm"])


def test_agreement_score_sets_judges_beside_the_annotators_in_one_table(tmp_path, sample_root):
    from agreement_helpers import JUDGED, write_sample_run
    from omegaconf import OmegaConf
    from run_rows import judgment_row
    from test_agreement import BOOT, filled, judge_of, judge_score, read_sheet, write_sheet

    from personalens.agreement import METRICS, export, score_sheets
    from personalens.data import load_scenarios
    from personalens.store import JUDGMENT_SCHEMA, PartWriter, shard_dir

    run = tmp_path / "run"
    dialogues = write_sample_run(run, sample_root, judge_score)  # model@judge's rows, written before keys
    # a second judge of the panel that scores every third dialogue one step higher
    moved = lambda i, dim, spk: judge_score(i + (i % 3 == 0), dim, spk)  # noqa: E731
    rows = [
        judgment_row(d, dim, moved(i, dim, spk), speaker=spk) for i, d in enumerate(dialogues) for dim, spk in JUDGED
    ]
    PartWriter(shard_dir(run, "judgments", 0, 1), JUDGMENT_SCHEMA).write([{**r, "judge_key": "k2"} for r in rows])
    OmegaConf.save({"fingerprint": "k2", "config": {"judge": {"name": "Other-7B"}}}, run / "judge-other.yaml")

    export(run, lambda users: load_scenarios(sample_root, users, "both"), tmp_path / "x", dialogues=12, seed=0)
    sheet = read_sheet(tmp_path / "x" / "sheet.csv")
    judge = judge_of(dialogues)
    paths = [
        write_sheet(tmp_path / f"{n}.csv", filled(sheet, lambda r: judge[(r["user_id"], r["task_id"])]))
        for n in ("a", "b")
    ]
    alone = score_sheets(tmp_path / "x", paths, run, BOOT)  # as before panels: model@judge's rows alone
    assert [c.key for c in alone.columns] == ["cohen", "fleiss"]
    assert alone.cell(("Personalization",), "cohen").mean == pytest.approx(1.0)
    both = score_sheets(tmp_path / "x", paths, run, BOOT, ["judge", "other"])
    assert [c.key for c in both.columns] == ["cohen_judge", "cohen_other", "fleiss", "fleiss_all"]
    assert "Cohen's Kappa (other (Other-7B))" in [c.label for c in both.columns]
    for m in METRICS:
        assert both.cell((m.label,), "cohen_judge").mean == pytest.approx(1.0)
        assert both.cell((m.label,), "cohen_other").mean < 1 and both.cell((m.label,), "fleiss_all").mean < 1
        assert both.cell((m.label,), "fleiss_all").n == 12
    with pytest.raises(PersonalensError, match="has no judge nosuch"):
        score_sheets(tmp_path / "x", paths, run, BOOT, ["nosuch"])


def test_a_family_is_declared_or_inferred_from_the_architecture(tmp_path):
    import json

    from personalens.engines.models.family import family_of

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3_moe"}))
    inferred = family_of({"name": "x", "path": str(tmp_path), "family": None})
    assert inferred.name == "qwen" and "model_type qwen3_moe" in inferred.source
    nested = tmp_path / "gemma"
    nested.mkdir()
    (nested / "config.json").write_text(
        json.dumps({"model_type": "gemma3", "text_config": {"model_type": "gemma3_text"}})
    )
    assert family_of({"path": str(nested)}).name == "gemma"
    declared = family_of({"path": str(tmp_path), "family": "DeepSeek"})
    assert declared.name == "deepseek" and declared.source == "declared"
    unknown = family_of({"path": None, "family": None})
    assert unknown.name is None and not unknown.shared_with(unknown)  # an unknown family is never named
    assert inferred.shared_with(family_of({"family": "qwen"}))


def test_merge_wants_every_judgment_of_every_judge_of_the_panel(tmp_path, capsys):
    import pyarrow.parquet as pq

    from personalens.merge import command as merge_command

    out, _ = generated(tmp_path)
    cfg = config(f"run.out_dir={out}", "data.kinds=SD", WARM)
    assert judge_command.judge(cfg, lambda: {"judge": Judge()}) == 0
    assert merge_command.merge(cfg) == 0  # both judges' rows, none counted twice
    assert "merge: complete" in capsys.readouterr().out
    assert report_command.report(config(f"run.out_dir={out}", "data.kinds=SD", WARM, "report.bootstrap=50")) == 0
    assert "Incomplete" not in (out / "report" / "report.md").read_text()  # every judge's rows were read
    from personalens.config.saved import read_judges

    warm = read_judges(out)["warm"].fingerprint
    for path in (out / "judgments").rglob("part-*.parquet"):  # the warm judge's rows lost
        table = pq.read_table(path)
        pq.write_table(table.filter([k != warm for k in table.column("judge_key").to_pylist()]), path)
    assert merge_command.merge(cfg) == 1
    printed = capsys.readouterr().out
    assert "judgments missing (judge warm: 24; " in printed and "judge judge:" not in printed  # named per judge


def test_runs_of_one_judge_each_reported_together_are_no_panel(tmp_path):
    from personalens.report import build_report

    runs = []
    for name, temperature in (("a", 0.0), ("b", 0.7)):
        out, _ = generated(tmp_path / name, f"run.name={name}")
        cfg = config(
            f"run.out_dir={out}", f"run.name={name}", "data.kinds=SD", f"protocol.judge.temperature={temperature}"
        )
        assert judge_command.judge(cfg, lambda: {"judge": Judge()}) == 0
        runs.append(out)
    report = build_report(runs, tmp_path / "report", bootstrap=50)
    assert report.panel is None and "Judge panel" not in (tmp_path / "report" / "report.md").read_text()
