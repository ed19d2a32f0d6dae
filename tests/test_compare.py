"""`personalens compare` on hand-built runs: a golden case worked out by hand, the refusal of runs
that differ in more than the assistant or its prompt setting, Table 4's settings against base, the
outputs, and the command line (docs/compare.md)."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from cli_helpers import run_cli
from omegaconf import OmegaConf
from test_fidelity import PromptRecorder, config
from test_report import judge_all, make_dialogue, write_run

from personalens import cli
from personalens.compare import build_comparison
from personalens.compare.power import PowerPlan
from personalens.errors import PersonalensError
from personalens.judge import command as judge_command
from personalens.simulate import command as simulate_command
from personalens.store import JUDGMENT_SCHEMA

B = 2000  # resamples


def scenario(user: str, task: int, setting: str = "base", trial: int = 0, model: str = "m1") -> dict:
    d = make_dialogue(task, "SD", ["Books"], setting=setting, model=model)
    d.update(user_id=user, trial=trial, seed=100 * task + trial)
    return d


def save_configs(run_dir: Path, *overrides: str) -> Path:
    """generate.yaml and judge.yaml as the commands save them, for a run made under `overrides`
    (without the fingerprinted parts, as runs saved before they were kept)."""
    cfg = OmegaConf.to_container(config(*overrides), resolve=True)
    for step in ("generate", "judge"):
        OmegaConf.save(OmegaConf.create({"fingerprint": step, "config": cfg}), run_dir / f"{step}.yaml")
    return run_dir


def make_run(run_dir: Path, rows: list[tuple[dict, float | None, float | None]], *overrides: str, **scores) -> Path:
    dialogues = [d for d, _, _ in rows]
    judgments = [j for d, tc, p in rows for j in judge_all(d, tc, p, **scores)]
    write_run(run_dir, dialogues, judgments, shards=1)
    return save_configs(run_dir, *overrides)


# ---- golden -------------------------------------------------------------------------------------


@pytest.fixture
def golden(tmp_path):
    """Users u1 (tasks 1, 2) and u2 (tasks 3, 4) in both runs; task 5 of u3 in A only, task 6 of u4
    in B only. B's task 4 ran twice (P 3 and 4). B's naturalness of task 2 did not parse."""
    a = make_run(
        tmp_path / "a",
        [
            (scenario("u1", 1), 0.0, 2.0),
            (scenario("u1", 2), 1.0, 3.0),
            (scenario("u2", 3), 0.0, 1.0),
            (scenario("u2", 4), 0.0, 2.0),
            (scenario("u3", 5), 1.0, 3.0),
        ],
    )
    rows = [
        (scenario("u1", 1, "vanilla"), 1.0, 3.0),
        (scenario("u1", 2, "vanilla"), 1.0, 4.0),
        (scenario("u2", 3, "vanilla"), 1.0, 2.0),
        (scenario("u2", 4, "vanilla"), 0.0, 3.0),
        (scenario("u2", 4, "vanilla", trial=1), 0.0, 4.0),
        (scenario("u4", 6, "vanilla"), 1.0, 1.0),
    ]
    b = make_run(tmp_path / "b", rows, "prompt=vanilla")
    for part in (b / "judgments").rglob("*.parquet"):
        judgments = pq.read_table(part).to_pylist()
        for j in judgments:
            if j["task_id"] == "SD-Books-task-2" and j["dimension"] == "naturalness" and j["speaker"] == "assistant":
                j["score"], j["parsed"] = None, False
        pq.write_table(pa.Table.from_pylist(judgments, schema=JUDGMENT_SCHEMA), part)
    return a, b


def test_golden_comparison_worked_out_by_hand(golden, tmp_path):
    a, b = golden
    result = build_comparison([a, b], tmp_path / "out", bootstrap=B, seed=3)
    (c,) = result.comparisons
    assert (c.kind, c.a.setting, c.b.setting, c.only_a, c.only_b, c.users) == ("runs", "base", "vanilla", 1, 1, 2)
    rows = {(r.kind, r.name): r for r in c.rows}
    # P over tasks 1-4: A 2, 3, 1, 2; B 3, 4, 2, (3 + 4) / 2. Differences +1, +1 (u1) and +1, +1.5 (u2).
    p = rows[("SD", "P")]
    assert (p.a.mean, p.b.mean, p.difference.mean, p.difference.n, p.users, p.left_out) == (2.0, 3.125, 1.125, 4, 2, 2)
    # two users: a resample holds u1 twice, each once, or u2 twice; the expanded interval at two
    # units reaches both ends, u1's mean difference 1 and u2's 1.25
    assert (p.difference.lo, p.difference.hi) == (1.0, 1.25)
    # the t-test over users: user sums S = 2 and 2.5 over N = 2 scenarios each, residuals S - 1.125 N =
    # -0.25 and 0.25, se^2 = 2 / 1 * 0.125 / 4^2, se = 0.125: t = 9 on 1 degree of freedom
    p_hand = 1 - 2 * math.atan(9) / math.pi
    assert p.p == pytest.approx(p_hand)
    # TC: differences +1, 0 (u1) and +1, 0 (u2): every resample's mean is 0.5, shown in percent
    tc = rows[("SD", "TCR (%)")]
    assert (tc.a.mean, tc.b.mean, tc.difference.mean) == (25.0, 75.0, 50.0)
    assert (tc.difference.lo, tc.difference.hi, tc.a.lo, tc.a.hi) == (50.0, 50.0, 0.0, 50.0)
    # both users' mean differences are 0.5: a standard error of 0, so p = 0
    assert tc.p == 0.0
    # naturalness and coherence are the same in both runs: difference 0, standard error 0, p = 1;
    # B's unparsed naturalness of task 2 leaves it out (with tasks 5 and 6)
    nat = rows[("SD", "Nat. (assistant)")]
    assert (nat.difference.mean, nat.difference.lo, nat.difference.hi, nat.p) == (0.0, 0.0, 0.0, 1.0)
    assert (nat.difference.n, nat.left_out) == (3, 3)
    # Holm over the six SD metrics with a p-value (MD has no scenarios), sorted 0, p_hand, 1, 1, 1, 1:
    # 6 * 0, 5 * p_hand, then 1
    assert all(math.isnan(r.p) and r.difference is None for r in c.rows if r.kind == "MD")
    assert (c.tests, c.family) == (6, 6)
    assert tc.p_holm == 0.0 and p.p_holm == pytest.approx(5 * p_hand) and nat.p_holm == 1.0
    assert [r.name for r in c.rows if r.significant(0.05)] == ["TCR (%)"]
    # the power table's variance: two users, P's n * se^2 = 2 * 0.125^2; TC's 0
    assert p.per_user_variance == pytest.approx(2 * 0.125**2) and tc.per_user_variance == 0.0


def test_outputs_hold_every_comparison(golden, tmp_path):
    a, b = golden
    out = tmp_path / "out"
    result = build_comparison([a, b], out, bootstrap=200)
    names = {p.name for p in result.files}
    assert names == {"compare.md", "compare.csv", "compare.tex", "power.csv", "power.tex", "forest.png", "compare.html"}
    assert (out / "forest.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with open(out / "compare.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 12 and {r["comparison"] for r in rows} == {"runs"}
    p = next(r for r in rows if r["kind"] == "SD" and r["metric"] == "P")
    assert float(p["difference_mean"]) == pytest.approx(1.125) and int(p["difference_n"]) == 4
    assert p["run_a"] == "a (m1, base)" and p["run_b"] == "b (m1, vanilla)"
    md = (out / "compare.md").read_text()
    assert "vanilla" in md and "only 2 users" in md and "Holm" in md and "Compared despite" not in md
    assert "compare.family=all): families of 6 tests, 6 tests in all" in md and "## Power" in md
    with open(out / "power.csv") as f:
        power = list(csv.DictReader(f))
    assert len(power) == 12 and {r["users"] for r in power if r["kind"] == "SD"} == {"2"}
    assert "\\begin{tabular}" in (out / "compare.tex").read_text()


# ---- settings inside a run (Table 4) ------------------------------------------------------------


def test_each_setting_of_a_run_against_its_base(tmp_path):
    rows = []
    for task, user in enumerate(["u1", "u1", "u2", "u2", "u3"]):
        rows += [
            (scenario(user, task, "base"), 0.0, 2.0),
            (scenario(user, task, "base+D"), 1.0, 2.0 + task % 2),
            (scenario(user, task, "vanilla"), 0.0, 1.0),
        ]
    run = make_run(tmp_path / "ablation", rows)
    result = build_comparison([run], tmp_path / "out", bootstrap=300)
    assert [(c.kind, c.a.setting, c.b.setting) for c in result.comparisons] == [
        ("settings", "base", "vanilla"),
        ("settings", "base", "base+D"),
    ]
    vanilla, with_d = result.comparisons
    assert [(r.kind, r.metric.key) for r in with_d.rows] == [("SD", "TCR"), ("SD", "P"), ("MD", "TCR"), ("MD", "P")]
    assert with_d.rows[0].difference.mean == 100.0 and with_d.rows[1].difference.mean == pytest.approx(2 / 5)
    assert vanilla.rows[1].difference.mean == -1.0 and vanilla.title == "vanilla - base in ablation (m1)"
    # compare.family: both settings' SD tests (MD has none) are one family by default, or each its own
    assert [c.family for c in result.comparisons] == [4, 4]
    assert "compare.family=all): families of 4 tests, 4 tests in all" in result.heading_lines()[0]
    apart = build_comparison([run], tmp_path / "apart", bootstrap=300, family="comparison")
    assert [c.family for c in apart.comparisons] == [2, 2] and "none across comparisons" in apart.heading_lines()[0]
    alone = build_comparison([run], tmp_path / "alone", bootstrap=300, family="none")
    assert [r.p_holm for r in alone.comparisons[0].rows[:2]] == [r.p for r in alone.comparisons[0].rows[:2]]
    assert "each of the 4 tests is marked where its own p is below 0.05" in alone.heading_lines()[0]
    with pytest.raises(PersonalensError, match="compare.family: 'settings' is none of all, comparison, none"):
        build_comparison([run], tmp_path / "x", family="settings")
    with pytest.raises(PersonalensError, match="unknown metric 'Q'; the metrics are Coh, Nat, P, TCR"):
        build_comparison([run], tmp_path / "x", power=PowerPlan(0.8, (("Q", 0.2),)))


def test_runs_of_several_settings_meet_on_the_settings_they_share(tmp_path):
    a = make_run(tmp_path / "a", [(scenario("u1", 1, s), 1.0, 2.0) for s in ("base", "base+D")])
    b = make_run(tmp_path / "b", [(scenario("u1", 1, s, model="m2"), 0.0, 3.0) for s in ("base", "vanilla")])
    result = build_comparison([a, b], tmp_path / "out", bootstrap=100)
    assert [(c.kind, c.a.label, c.b.label) for c in result.comparisons] == [
        ("runs", "a (m1, base)", "b (m2, base)"),
        ("settings", "a (m1, base)", "a (m1, base+D)"),
        ("settings", "b (m2, base)", "b (m2, vanilla)"),
    ]
    c = make_run(tmp_path / "c", [(scenario("u1", 1, s), 0.0, 3.0) for s in ("base+I", "base+S")])
    result = build_comparison([a, c], tmp_path / "out2", bootstrap=100)
    assert [x.kind for x in result.comparisons] == ["settings"]
    assert "none in common" in result.notes[0] and "none in common" in (tmp_path / "out2" / "compare.md").read_text()
    with pytest.raises(PersonalensError, match="nothing to compare"):
        build_comparison([c], tmp_path / "out3")


# ---- comparability ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("override", "check", "named"),
    [
        ("model@judge=llama31_8b", "judge", "differ in judge model: name: 'SmolLM2-135M-Instruct' vs 'Llama"),
        ("model@user_agent=mistral7b_v02", "user_agent", "differ in user agent model"),
        ("fidelity=paper", "fidelity,templates", "differ in fidelity option: "),  # its own templates too
        ("protocol.max_rounds_sd=5", "protocol", "dialogue.max_rounds_sd: 3 vs 5"),
        (
            "prompt.dir=/somewhere/else",
            "templates",
            "differ in prompt templates: folder (text not recorded): 'official' vs 'else'",
        ),
        ("data.users=1", "selection", "users: 0 vs 1"),
    ],
)
def test_runs_that_differ_beyond_the_assistant_are_refused_by_name(tmp_path, override, check, named):
    a = make_run(tmp_path / "a", [(scenario("u1", 1), 1.0, 2.0)])
    b = make_run(tmp_path / "b", [(scenario("u1", 1, model="m2"), 0.0, 3.0)], override)
    with pytest.raises(PersonalensError, match="not comparable") as refused:
        build_comparison([a, b], tmp_path / "out", bootstrap=50)
    assert named in str(refused.value) and f"compare.allow=[{check}]" in str(refused.value)
    assert not (tmp_path / "out").exists()  # nothing half-written
    result = build_comparison([a, b], tmp_path / "out", bootstrap=50, allow=check.split(","))
    assert [x.mismatch.check for x in result.accepted] == check.split(",")
    for page in ("compare.md", "compare.html"):
        assert "Compared despite a difference" in (tmp_path / "out" / page).read_text()


def test_a_run_without_saved_configs_cannot_be_checked(tmp_path):
    a = make_run(tmp_path / "a", [(scenario("u1", 1), 1.0, 2.0)])
    b = make_run(tmp_path / "b", [(scenario("u1", 1, model="m2"), 0.0, 3.0)])
    (b / "judge.yaml").unlink()
    with pytest.raises(PersonalensError, match="differ in judge model: not recorded for run B"):
        build_comparison([a, b], tmp_path / "out")
    with pytest.raises(PersonalensError, match="unknown check"):
        build_comparison([a, b], tmp_path / "out", allow=["assistant"])
    with pytest.raises(PersonalensError, match="nowhere does not exist"):
        build_comparison([a, tmp_path / "nowhere"], tmp_path / "out")
    with pytest.raises(PersonalensError, match="given twice"):
        build_comparison([a, tmp_path / "a"], tmp_path / "out")


def test_runs_made_by_the_commands_are_compared_by_their_saved_parts(tmp_path):
    """generate and judge (scripted engines) save their fingerprinted parts; two runs that differ in
    the prompt setting alone are comparable, and a third judged with another judge budget is not."""
    engine = PromptRecorder()
    engines = lambda: {"user_agent": engine, "assistant": engine, "judge": engine}  # noqa: E731
    runs = {}
    for name, extra in (("base", ()), ("vanilla", ("prompt=vanilla",)), ("budget", ("protocol.judge.max_tokens=256",))):
        cfg = config(f"run.out_dir={tmp_path / name}", *extra)
        assert simulate_command.generate(cfg, engines) == 0 and judge_command.judge(cfg, engines) == 0
        runs[name] = tmp_path / name
    saved = OmegaConf.load(runs["base"] / "generate.yaml")
    assert saved.parts.templates and saved.parts.data_root
    result = build_comparison([runs["base"], runs["vanilla"]], tmp_path / "out", bootstrap=100)
    (c,) = result.comparisons
    assert (c.a.setting, c.b.setting, c.only_a, c.only_b) == ("base", "vanilla", 0, 0) and result.accepted == ()
    with pytest.raises(PersonalensError, match=r"differ in protocol .*: judge.max_tokens: 192 vs 256"):
        build_comparison([runs["base"], runs["budget"]], tmp_path / "out2")


# ---- the command line ---------------------------------------------------------------------------


def test_positional_runs_fill_compare_runs():
    compare = cli.COMMANDS["compare"].positional
    args = cli._hydra_args(["runs/a", "runs/b=c", "compare.alpha=0.1"], "compare", compare)
    assert args == ["compare.runs=['runs/a']", "runs/b=c", "compare.alpha=0.1"]  # b=c is no path here
    assert cli._hydra_args(["data/sample", "x=1"]) == ["data.root='data/sample'", "x=1"]


def test_compare_command_writes_the_page_and_refuses_with_one_line(golden, tmp_path):
    a, b = golden
    out = tmp_path / "cli"
    done = run_cli("compare", str(a), str(b), f"compare.out_dir={out}", "compare.bootstrap=200")
    assert "| SD | P |" in done.stdout and (out / "compare.html").is_file()
    save_configs(b, "prompt=vanilla", "fidelity=paper")
    refused = run_cli("compare", str(a), str(b), f"compare.out_dir={tmp_path / 'x'}", check=False)
    assert (
        refused.returncode == 2
        and "error: the runs are not comparable: " in refused.stderr
        and "differ in fidelity option" in refused.stderr
    )


def test_compare_marks_a_large_effect_at_20_users_and_plans_its_power(tmp_path):
    """`personalens compare A B` on two 20-user runs whose P differs by about +0.45 and nothing else:
    P is marked significant after Holm over 12 tests, and the power table gives the users needed for
    the differences asked, as the power functions compute them from the printed per-user SD."""
    from test_compare_stats import _raised_pair

    from personalens.tables.power import users_needed

    a, b = _raised_pair(tmp_path, 20)
    out = tmp_path / "out"
    done = run_cli("compare", str(a), str(b), f"compare.out_dir={out}", "compare.power.differences={P:0.2,TCR:5}")
    significant = [
        line.split("|")[1:4] for line in done.stdout.splitlines() if line.startswith("| ") and "| yes |" in line
    ]
    assert [[x.strip() for x in row] for row in significant] == [["SD", "P", "yes"], ["MD", "P", "yes"]]
    assert "families of 12 tests, 12 tests in all" in (out / "compare.md").read_text()
    with open(out / "power.csv") as f:
        power = {(r["kind"], r["metric"]): r for r in csv.DictReader(f)}
    p = power[("SD", "P")]
    assert (p["users"], p["planned"]) == ("20", "0.2")
    needed = users_needed(0.2, float(p["per_user_sd"]) ** 2, 0.05 / 12)
    assert abs(int(p["users_needed"]) - needed) <= 1  # the CSV's SD is rounded
    assert power[("SD", "Nat. (assistant)")]["users_needed"] == ""  # no difference asked for it
    assert "| SD | P | 20 |" in done.stdout and "data.users=0-<N-1>" in done.stdout
