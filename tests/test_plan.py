"""`personalens plan`: its rules, pure (turn caps against the dialogue's own state machine, the token
budget, time limits and shard counts), and the command on the sample data with the paper's model
pairs on simulated nodes (placement printed, an impossible layout refused), loading no model."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from cli_helpers import REPO, run_cli
from test_merge import turn_rows

from personalens.data import load_scenarios
from personalens.engines.models.embedded import EmbeddedModelError, embedded_model_dir
from personalens.errors import PersonalensError
from personalens.plan.budget import Fixed, PerDialogue, Turns, cap_turns, fit_history, per_dialogue, turns_at_cap
from personalens.plan.schedule import Rates, array_size, parse_time_limit, shard_loads
from personalens.simulate.dialogue import Dialogue, EndRules
from personalens.store import TURNS_SCHEMA, PartWriter

ARCHITECTURES = Path(__file__).parent / "fixtures" / "architectures"


@pytest.mark.parametrize("reply_after_cap", [False, True])
@pytest.mark.parametrize("max_rounds", [1, 3])
def test_the_turn_cap_is_the_longest_dialogue_the_rules_allow(sample_root, max_rounds, reply_after_cap):
    scenario = load_scenarios(sample_root, "0", "SD")[0]
    longest = 0
    for terminate_at in [None, *range(1, 2 * max_rounds + 3)]:  # the user turn (1-based) that says TERMINATE
        d = Dialogue(scenario, "base", 0, 0, max_rounds, EndRules("word", reply_after_cap))
        while d.waiting_on is not None:
            user_turn = sum(t.role == "user" for t in d.turns) + 1
            text = "TERMINATE" if d.waiting_on == "user" and user_turn == terminate_at else "ok"
            d.add(d.waiting_on, text, 1, 1, 0.0)
        longest = max(longest, len(d.turns))
    assert turns_at_cap(max_rounds, reply_after_cap) == longest


def test_a_dialogues_tokens_follow_its_turns():
    fixed = Fixed(100, 120, 50, {"task_completion/": 200, "personalization/": 300})
    turns = Turns({2: 0.5, 4: 0.5}, {"user": 10, "assistant": 20}, 15, "test")
    one = per_dialogue(fixed, turns, judge_reply=5, judged=["task_completion/", "personalization/"], turn_level=True)
    two = 100 + (50 + 15)  # 2 turns: the user's opening, the assistant with one earlier turn
    four = two + (120 + 30) + (50 + 45)
    assert one.turns == 3 and one.prompt == pytest.approx((two + four) / 2)
    assert one.generated == pytest.approx((30 + 60) / 2)
    # 2 whole-dialogue judgments + one turn-level per assistant reply
    assert one.judgments == pytest.approx((3 + 4) / 2)
    whole2, whole4 = 200 + 300 + 2 * 15 * 2, 200 + 300 + 2 * 15 * 4
    assert one.judge_prompt == pytest.approx((whole2 + 300 + 30 + whole4 + 300 + 30 + 300 + 60) / 2)
    assert one.judge_generated == pytest.approx(5 * 3.5)
    cap = cap_turns(8, {"user": 64, "assistant": 96})
    assert (cap.counts, cap.history) == ({8: 1.0}, 80)
    assert fit_history([(2, 160, 100), (3, 260, 140)]) == pytest.approx((60 + 120) / 3) and fit_history([]) is None


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30", 1800), ("30:15", 1815), ("04:00:00", 14400), ("1-12", 129600), ("1-12:30", 131400), ("2-00:00:01", 172801)],
)
def test_slurm_time_limits(text, seconds):
    assert parse_time_limit(text) == seconds


@pytest.mark.parametrize("bad", ["4h", "", "00:00:00", "1-"])
def test_bad_time_limits_are_refused(bad):
    with pytest.raises(PersonalensError, match="plan.time_limit"):
        parse_time_limit(bad)


def test_the_array_size_keeps_every_shard_under_the_limit(sample_root):
    scenarios = load_scenarios(sample_root)
    per_kind = {k: PerDialogue(6, 0, 1000, 6, 0, 600) for k in ("SD", "MD")}
    rates = Rates(10.0, 10.0, "test")  # 100 s per dialogue to generate, 60 s to judge
    n = array_size(scenarios, 1, per_kind, rates, limit=1000)
    largest = [max(sum(load.values()) for load in shard_loads(scenarios, k, 1)) for k in (n - 1, n)]
    assert largest[1] * 100 <= 1000 < largest[0] * 100
    assert array_size(scenarios, 1, per_kind, rates, limit=50) is None  # not even one user per shard


@pytest.fixture(scope="module")
def paper_models(tmp_path_factory) -> list[str]:
    """The paper's pairs as overrides: model directories with the published config.json (weights sized
    from the parameter count), the embedded model's tokenizer standing in for Llama's."""
    try:
        tokenizer = embedded_model_dir()
    except EmbeddedModelError as err:
        pytest.skip(str(err))
    root = tmp_path_factory.mktemp("models")
    for name in ("llama31_8b", "llama31_70b"):
        (root / name).mkdir()
        shutil.copy(ARCHITECTURES / f"{name}.json", root / name / "config.json")
    overrides = []
    for role, name in (("assistant", "llama31_8b"), ("user_agent", "llama31_70b"), ("judge", "llama31_70b")):
        overrides += [f"model@{role}={name}", f"{role}.path={root / name}", f"{role}.tokenizer={tokenizer}"]
    return overrides


def noisy_run(run_dir: Path) -> Path:
    """A judged run of 6 users x 3 scenarios x 2 trials, each dialogue judged by two judges (keys k1,
    k2): P varies by user, trial and judge; TC by trial alone (both judges agree on it)."""
    from run_rows import dialogue_row, judgment_row
    from test_report import write_run

    rng = np.random.default_rng(0)
    dialogues, judgments = [], []
    for u in range(6):
        level = rng.normal(0, 0.6)
        for t in range(3):
            for trial in range(2):
                d = dialogue_row(f"user{u}", f"SD-Movies-task-{t}", "SD", ["Movies"], trial=trial)
                dialogues.append(d)
                done, p = float(rng.random() < 0.6), 2.5 + level + rng.normal(0, 0.5)
                for key in ("k1", "k2"):
                    score = float(np.clip(round(p + rng.normal(0, 0.7)), 1, 4))
                    judgments += [
                        {**judgment_row(d, "task_completion", done), "judge_key": key},
                        {**judgment_row(d, "personalization", score), "judge_key": key},
                    ]
    return write_run(run_dir, dialogues, judgments, shards=1)


def test_plan_places_an_8b_assistant_with_70b_user_agent_and_judge_on_a_4x80gb_node(tmp_path, paper_models):
    out = tmp_path / "plan.json"
    args = [
        "protocol=quick",
        "plan.gpus=4",
        "plan.gpu_memory_gib=80",
        "plan.tokens_per_s=500",
        "plan.time_limit=00:00:40",
        f"plan.noise_from={noisy_run(tmp_path / 'noisy')}",
    ]
    # a judge panel: model@judge, and the 8B as a second judge, placed alone once the 70B is freed
    eight, tokenizer = (
        next(a.split("=", 1)[1] for a in paper_models if a.startswith(f"assistant.{k}=")) for k in ("path", "tokenizer")
    )
    panel = f"judges=[{{name: small, model: llama31_8b, set: {{path: '{eight}', tokenizer: '{tokenizer}'}}}}]"
    proc = run_cli("plan", *paper_models, *args, panel, f"plan.out={out}", timeout=120)
    plan = json.loads(out.read_text())
    generate, judge = plan["placement"]["jobs"]["generate"], plan["placement"]["jobs"]["judge"]
    small = plan["placement"]["jobs"]["judge-small"]
    assert [(m["model"], m["mode"], m["gpus"]) for m in small["models"]] == [
        ("Llama-3.1-8B-Instruct", "in_process", [0])
    ]
    assert "  judge-small: " in proc.stdout and "judge (2 judges, one after another) at 500.0" in proc.stdout
    # both judges make every judgment: the judge job's time is twice one judge's, at the rate given
    judge_tokens = plan["tokens"]["at_cap"]["all"]["judge_generated"]
    assert plan["time"]["judges"] == 2 and plan["time"]["judge_s"]["all"] == pytest.approx(2 * judge_tokens / 500)
    assert [(m["model"], m["mode"], m["gpus"]) for m in generate["models"]] == [
        ("Llama-3.1-70B-Instruct", "in_process", [0, 1, 2, 3]),
        ("Llama-3.1-8B-Instruct", "in_process", [0]),
    ]
    assert all(m["max_len_seqs"] >= 1 and m["kv_cache_memory_bytes"] > 0 for m in generate["models"] + judge["models"])
    assert "placement on 4 GPU(s) of 80.0 GiB" in proc.stdout and "in process on GPU 0,1,2,3" in proc.stdout
    # the layout the node allows, why, and its modelled throughput (the other needs a fifth GPU)
    assert generate["why"] == "every model in this process, sharing GPUs (own GPUs: they need 5 GPUs, the job has 4)"
    modelled = generate["throughput"]
    assert (modelled["dialogues"], modelled["of"], modelled["basis"]) == (34, 34, "at the protocol's cap")
    assert [(row["name"], row["chosen"], row["fits"]) for row in modelled["layouts"]][-1] == ("own GPUs", False, False)
    assert modelled["layouts"][0]["chosen"] and modelled["layouts"][0]["name"].startswith("in process")
    assert modelled["layouts"][0]["tokens_per_s"] > 0 and "copies" not in modelled["layouts"][0]
    # no layout beats the node's limit
    assert 0 < modelled["node_limit"]["seconds"] < modelled["layouts"][0]["seconds"]
    assert "the node's limit, no layout faster" in proc.stdout
    dialogues = sum(plan["selection"]["dialogues"].values())
    assert plan["selection"]["users"] == 6 and dialogues == 34
    # at the cap (3 rounds, official rules: 8 turns), every reply at its max_tokens
    assert plan["tokens"]["at_cap"]["all"]["generated"] == 34 * 4 * (64 + 96)
    assert plan["tokens"]["at_cap"]["all"]["judgments"] == 34 * 6
    assert plan["time"]["time_limit"]["shards"] >= 2 and "slurm/submit.sh" in proc.stdout
    assert "assumptions:" in proc.stdout
    # without a calibration the judge's replies are at their cap, said so, with the pilot that measures them
    judge_replies = plan["tokens"]["judge_replies"]
    assert (judge_replies["basis"], judge_replies["tokens"]) == (
        "cap",
        plan["tokens"]["at_cap"]["per_dialogue"]["SD"]["judge_generated"] / 6,
    )
    run, calibrated = judge_replies["pilot"]
    assert run.startswith("personalens run ") and "plan." not in run and "protocol=quick" in run
    assert run.endswith("data.users=0-4 run.name=pilot") and all(m in run for m in paper_models)
    assert calibrated.endswith("plan.calibrate=runs/pilot") and "plan.gpus=4" in calibrated
    assert "the judge's replies: CAP BOUND" in proc.stdout and f"    {run}" in proc.stdout
    # a Llama judge of a Llama assistant: named, with the judges of other families to add
    assert any("Self-preference: judge judge (Llama-3.1-70B-Instruct)" in line for line in plan["self_preference"])
    assert "Add a judge of another family (" in proc.stdout and "gemma3_27b (gemma)" in proc.stdout
    # one more trial or one more judging, costed by the plan's time on the node's 4 GPUs
    noise, time = plan["noise"], plan["time"]
    # (the panel's two judges: the judge job's time is both judgings of the one trial)
    assert (noise["trials"], noise["judgings"], noise["unit"]) == (1, 2, "GPU hours (4 GPUs a job)")
    assert noise["trial_cost"] == pytest.approx((time["generate_s"]["all"] + time["judge_s"]["all"]) * 4 / 3600)
    assert noise["judging_cost"] == pytest.approx(time["judge_s"]["all"] / 2 * 4 / 3600)
    by_metric = {r["metric"]: r for r in noise["metrics"]}
    # both judges agree on TC: a judging cuts nothing of its variance, a trial does
    assert by_metric["TCR (%)"]["judging_cut"] == 0 and by_metric["TCR (%)"]["better"] == "trial"
    assert 0 < by_metric["P"]["judging_cut"] and by_metric["P"]["variances"]["judging"] > 0
    assert "noise: from" in proc.stdout and "a trial cuts" in proc.stdout


def test_plan_prefers_free_gpus_and_shows_both_layouts_modelled(tmp_path, paper_models):
    """On 8 GPUs each model gets GPUs of its own; the in-process layout on the first four fits too, and
    both are modelled on the paper protocol's dialogues: with whole GPUs each model's KV cache holds
    more of the histories, so fewer prompt tokens are computed again. The run puts copies of the 8B on
    the three GPUs left (replicas auto): modelled with and without them, and said to be chosen."""
    out = tmp_path / "plan.json"
    args = ["plan.gpus=8", "plan.gpu_memory_gib=80", "plan.jobs=[generate]", "plan.model_dialogues=16"]
    proc = run_cli("plan", *paper_models, *args, "plan.time_limit=00:20:00", f"plan.out={out}", timeout=120)
    plan = json.loads(out.read_text())
    generate = plan["placement"]["jobs"]["generate"]
    assert [(m["model"], m["mode"], m["gpus"]) for m in generate["models"]] == [
        ("Llama-3.1-70B-Instruct", "in_process", [0, 1, 2, 3]),
        ("Llama-3.1-8B-Instruct", "managed_server", [4]),
    ]
    assert generate["why"].startswith("each model on GPUs of its own: chosen, as it fits")
    modelled = generate["throughput"]
    assert modelled["dialogues"] == 16 and modelled["of"] == 34
    held, every, own, one, shared = modelled["layouts"]
    assert (own["name"], own["chosen"], shared["name"], shared["fits"]) == (
        "own GPUs without the copies",
        False,
        "in process",
        True,
    )
    for key in own["kv_tokens"]:
        assert own["kv_tokens"][key] > 4 * shared["kv_tokens"][key]
    assert own["tokens_per_s"] > shared["tokens_per_s"] and own["prefilled_share"] < shared["prefilled_share"]
    # the copies: the 70B's KV cache keeps the histories of a few capped dialogues (its 447,633 tokens
    # over a capped dialogue's longest user-agent prompt and reply), too few for a batch (below a
    # quarter of max_num_seqs), so the run (lockstep.in_flight auto) keeps every dialogue in flight;
    # the window is modelled beside it
    every, held = held, every
    assert held["in_flight"] == modelled["in_flight"] < 16 and every["chosen"] and not held["chosen"]
    assert modelled["lockstep_in_flight"] == "auto" and modelled["run_in_flight"] is None
    assert "the run takes lockstep.in_flight=auto: every dialogue in flight (too few for a batch" in proc.stdout
    assert held["name"].endswith(f", {held['in_flight']} dialogues in flight") and "in_flight" not in own
    assert held["prefilled_share"] < every["prefilled_share"]
    assert every["tokens_per_s"] > own["tokens_per_s"]  # both in two cohorts (below)
    for row in (held, every):
        assert row["copies"] == {"Llama-3.1-8B-Instruct": [[5], [6], [7]]}
        assert set(row["busy_share"]) == {"Llama-3.1-70B-Instruct", "Llama-3.1-8B-Instruct"}
        assert row["cached_share"] == pytest.approx(1 - row["prefilled_share"])
    assert sum(bool(row.get("best")) for row in modelled["layouts"]) == 1
    assert [c["cuda_visible_devices"] for c in generate["models"][1]["copies"]] == ["5", "6", "7"]
    # lockstep cohorts (auto): the 16 dialogues in two cohorts, whose calls join the engines' batches;
    # at the protocol's cap every reply is the cap, and the cohorts drift apart only as far as the
    # order their prompts were prefilled in lets one finish its turn sooner: never slower than one
    # (tests/test_engine_model.py has replies that differ). The window of a few dialogues is too
    # small for two cohorts' parts (16 each) and runs one; models that share GPU 0 are modelled
    # taking turns, as the model cannot say how their overlapping steps contend
    assert (every["cohorts"], held["cohorts"], own["cohorts"], one["cohorts"]) == (2, 1, 2, 1)
    assert one["name"] == every["name"] + ", one cohort (lockstep.cohorts=1)" and not one["chosen"]
    assert every["tokens_per_s"] >= one["tokens_per_s"]
    assert (shared["cohorts"], shared["run_cohorts"], shared["shared_gpus"]) == (1, 2, [0])
    assert every["cohorts_at_once"] == 2 and held["cohorts_at_once"] == 1 and "; 2 cohorts at once" in proc.stdout
    assert "the run's 2 cohorts at once modelled taking turns (the dialogue models share GPU 0)" in proc.stdout
    assert (
        f"own GPUs + 3 copies of Llama-3.1-8B-Instruct on GPU 5,6,7, {held['in_flight']} dialogues in flight:"
        in proc.stdout
        and "(chosen: replicas auto shares the free GPUs out by work (3 copies of Llama-3.1-8B-Instruct: "
        in proc.stdout
    ), proc.stdout
    assert "+ 3 copies in managed vLLM servers on GPU 5,6,7" in proc.stdout and "not available" not in proc.stdout
    # no rate given nor measured: the time is the fastest layout's modelled rate, said as modelled, and
    # the time limit's shard count follows from it (the judge job, not planned here, has none); the
    # layouts compared begin with the configured one, modelled as the chosen row above
    time_ = plan["time"]
    compared = modelled["alternatives"]
    assert compared[0]["name"] == "as configured" and compared[0]["seconds"] == pytest.approx(every["seconds"])
    [fastest] = [row for row in compared if row["chosen"]]
    assert fastest["seconds"] == min(row["seconds"] for row in compared if row["fits"])
    assert (
        time_["rates_tokens_per_s"]["generate"] == fastest["tokens_per_s"]
        and time_["rates_tokens_per_s"]["judge"] is None
    )
    assert time_["rates_tokens_per_s"]["source"].startswith("modelled")
    largest = time_["generate_s"]["largest_shard"]
    assert largest == pytest.approx(plan["tokens"]["at_cap"]["all"]["generated"] / fastest["tokens_per_s"])
    shards = time_["time_limit"]["shards"]
    assert shards >= math.ceil(largest / 1200)  # no fewer shards can hold the modelled time
    assert "rates modelled for each job's fastest layout (h100 figures)" in proc.stdout
    assert f"under 00:20:00 per job: {shards} shards, `slurm/submit.sh {shards} ...`" in proc.stdout


def test_each_job_runs_the_layout_plan_chose_for_it_alone_and_through_submit(tmp_path, paper_models):
    """On 8 x 80 GB the judge's 70B is modelled fastest as one engine over the eight GPUs, not the
    configured two of four (docs/cluster.md). `judge layout=plan.json` composes that layout's overrides
    (generate was not planned: its configured layout), refuses a key the command line sets too and a
    judge model other than the planned one before anything loads; slurm/submit.sh with PLAN= gives the
    generate and judge tasks `layout=<plan>` and refuses a PLAN that is no plan.json before it submits
    anything. sbatch is a stand-in that records its arguments; the chain on a real SLURM is
    tests/test_slurm.py's."""
    plan = tmp_path / "plan.json"
    args = ["plan.gpus=8", "plan.gpu_memory_gib=80", "plan.jobs=[judge]", "plan.model_dialogues=16"]
    run_cli("plan", *paper_models, *args, f"plan.out={plan}", timeout=120)
    rows = json.loads(plan.read_text())["placement"]["jobs"]["judge"]["throughput"]["alternatives"]
    [chosen] = [r for r in rows if r["chosen"]]
    assert chosen["overrides"] == ["judge.tensor_parallel_size=8", "judge.replicas=1"]

    composed = run_cli("judge", *paper_models, f"layout={plan}", "--cfg", "job").stdout
    judge = yaml.safe_load(composed)["judge"]
    assert (judge["tensor_parallel_size"], judge["replicas"]) == (8, 1)
    clash = run_cli("judge", *paper_models, f"layout={plan}", "judge.replicas=2", "--cfg", "job", check=False)
    assert clash.returncode == 2 and "judge.replicas is set both on the command line (judge.replicas=2)" in clash.stderr
    same = run_cli("judge", *paper_models, f"layout={plan}", "judge.replicas=1", "--cfg", "job")
    assert yaml.safe_load(same.stdout)["judge"]["replicas"] == 1
    other = run_cli(
        "judge", *paper_models, "model@judge=smollm2", f"layout={plan}", f"run.out_dir={tmp_path / 'run'}", check=False
    )
    assert (
        other.returncode == 2
        and "planned judge Llama-3.1-70B-Instruct, this judge has SmolLM2-135M-Instruct" in other.stderr
    )

    bin_dir, log = tmp_path / "bin", tmp_path / "sbatch.log"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text('#!/bin/bash\necho "$*" >> "$SBATCH_LOG"\necho 4711\n')
    (bin_dir / "sbatch").chmod(0o755)
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "SBATCH_LOG": str(log),
        "PERSONALENS": str(Path(sys.executable).parent / "personalens"),
        "LOG_DIR": str(tmp_path / "logs"),
        "GPUS": "8",
    }

    def submit(plan_file: Path) -> subprocess.CompletedProcess:
        command = ["bash", str(REPO / "slurm" / "submit.sh"), "2", *paper_models]
        return subprocess.run(command, env={**env, "PLAN": str(plan_file)}, capture_output=True, text=True)

    done = submit(plan)
    assert done.returncode == 0, done.stderr
    generate, judge, report = log.read_text().splitlines()
    given = " ".join(paper_models)
    assert generate.endswith(f"generate.sbatch {given} layout={plan}") and report.endswith(f"report.sbatch {given}")
    assert judge.endswith(f"judge.sbatch {given} layout={plan}")
    refused = submit(tmp_path / "missing.json")
    assert refused.returncode == 2 and f"layout={tmp_path / 'missing.json'}: not a plan.json" in refused.stderr
    assert f"PLAN={tmp_path / 'missing.json'}: generate refused it" in refused.stderr
    assert len(log.read_text().splitlines()) == 3  # nothing more submitted


def test_plan_refuses_the_same_models_on_one_gpu_and_says_why(tmp_path, paper_models):
    out = tmp_path / "plan.json"
    proc = run_cli("plan", *paper_models, "plan.gpus=1", "plan.gpu_memory_gib=80", f"plan.out={out}", check=False)
    assert proc.returncode == 2
    refused = json.loads(out.read_text())["placement"]["jobs"]["generate"]["refused"]
    assert "do not fit on 1 GPU" in refused and "Llama-3.1-70B-Instruct" in refused and "Ways out" in refused
    assert "generate: REFUSED" in proc.stdout
    assert "time: unknown: no throughput: a modelled rate needs each job's layout to fit" in proc.stdout


def test_plan_on_the_quickstart_config_takes_seconds_and_imports_neither_vllm_nor_torch(tmp_path):
    # a run a stopped generate left partly simulated: one dialogue's first three turns stored
    out = tmp_path / "run"
    PartWriter(out / "turns" / "shard-000-of-001", TURNS_SCHEMA).write(
        turn_rows(("user0", "SD-Alarm-task-1", "base", 0), 3, 1.0)
    )
    code = (
        "import atexit, sys; "
        "atexit.register(lambda: print('LOADED', 'vllm' in sys.modules, 'torch' in sys.modules)); "
        f"from personalens import cli; cli.main(['plan', 'protocol=quick', 'plan.out={tmp_path / 'plan.json'}', "
        f"'run.out_dir={out}'])"
    )
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    seconds = time.monotonic() - started
    assert "LOADED False False" in proc.stdout, proc.stdout + proc.stderr
    assert seconds < 60  # seconds on an idle 2-core machine; the bound leaves room for a loaded one
    assert "placement: not planned: no GPU here and none given" in proc.stdout
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["tokens"]["first_prompts"]["user_agent_total"] > 0 and "unknown" in plan["time"]
    assert plan["selection"]["written"] == {"dialogues": 0, "partial_shards": {"0": {"dialogues": 1, "turns": 3}}}
    assert "partly simulated by a stopped generate, which resumes them: shard 0: 1 (3 turns stored)" in proc.stdout


def test_the_share_of_dialogues_ending_on_context_at_a_shorter_max_model_len():
    """From a calibration run's prompts: a dialogue ends on context where a turn's prompt leaves less
    than its role's room for the reply."""
    from personalens.plan.calibration import Calibration

    def dialogue(*prompts: int) -> dict:
        roles = ["user", "assistant"] * len(prompts)
        return {"kind": "SD", "turns": [{"role": r, "prompt_tokens": p} for r, p in zip(roles, prompts)]}

    measured = Calibration("run", [dialogue(500, 900), dialogue(500, 3_000), dialogue(3_700, 100)], 0, None, None)
    room = {"user_agent": 200, "assistant": 800}
    assert measured.ended_at(4_096, room) == 0.0  # 3,000 + 800 and 3,700 + 200 fit
    assert measured.ended_at(3_700, room) == pytest.approx(2 / 3)  # both long ones end
    assert measured.ended_at(3_850, room) == pytest.approx(1 / 3)  # the assistant's 3,000 + 800 still fits
    assert Calibration("run", [], 0, None, None).ended_at(4_096, room) is None


def test_plan_names_the_largest_max_model_len_that_fits_and_the_dialogues_it_would_end(
    tmp_path, paper_models, sample_root
):
    """A Qwen2.5-72B user agent (its published config.json) with the 8B assistant on 4 x 80 GB at
    max_model_len 65,536 is refused; plan names the largest length that fits and, from a calibration
    run, the share of its dialogues that would end on context there (one of its two prompts is too
    long at that length, with the 800 tokens the paper protocol keeps for a reply)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    qwen = tmp_path / "qwen25_72b"
    qwen.mkdir()
    shutil.copy(ARCHITECTURES / "qwen25_72b.json", qwen / "config.json")
    models = [o.replace(o.split("=", 1)[1], str(qwen)) if o.startswith("user_agent.path=") else o for o in paper_models]
    run = tmp_path / "calib"
    (run / "dialogues").mkdir(parents=True)
    scenarios = load_scenarios(sample_root, "0", "SD")[:2]

    def turns(*prompts: int) -> list[dict]:
        roles = ["user", "assistant"] * len(prompts)
        return [{"role": r, "prompt_tokens": p, "completion_tokens": 100} for r, p in zip(roles, prompts)]

    rows = [
        {"user_id": s.key[0], "user_index": s.user.index, "task_id": s.key[1], "kind": "SD", "turns": t, "ended": e}
        for s, t, e in zip(scenarios, [turns(900, 1_500), turns(900, 62_000)], ["terminate", "max_rounds"])
    ]
    pq.write_table(pa.Table.from_pylist(rows), run / "dialogues" / "part-0.parquet")
    out = tmp_path / "plan.json"
    args = ["plan.gpus=4", "plan.gpu_memory_gib=80", "plan.jobs=[generate]", f"plan.calibrate={run}"]
    proc = run_cli("plan", *models, *args, f"plan.out={out}", check=False, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    refused = json.loads(out.read_text())["placement"]["jobs"]["generate"]
    fitting = refused["max_model_len_fits"]
    assert 16_384 <= fitting < 65_536 and f"max_model_len {fitting:,} (the largest that fits)" in refused["refused"]
    assert 62_000 > fitting - 800 and refused["context_ended_at_fit"] == 0.5
    assert f"the largest max_model_len that fits: {fitting:,}; at it 50% of the calibration run's" in proc.stdout


def test_a_calibration_runs_thinking_is_in_its_reply_tokens_and_not_in_what_a_turn_adds(tmp_path):
    """A reasoning model's thinking, stored per turn and judgment, counts in the tokens a run generates
    (the time) and is left out of what a reply adds to later prompts where the prompts are not fitted."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from personalens.plan.calibration import read_calibration
    from personalens.plan.text import _thinking

    run = tmp_path / "calib"
    (run / "dialogues").mkdir(parents=True)
    (run / "judgments").mkdir()

    def turn(role: str, completion: int, thinking: int | None) -> dict:
        return {"role": role, "prompt_tokens": 10, "completion_tokens": completion, "reasoning_tokens": thinking}

    ids = {"user_id": "u", "user_index": 0, "task_id": "t", "kind": "SD"}
    # the user agent's thinking seen as text only (not counted), the assistant's counted on its ids
    turns = [turn("user", 100, None), turn("assistant", 400, 300), turn("user", 100, None), turn("assistant", 200, 100)]
    pq.write_table(pa.Table.from_pylist([{**ids, "turns": turns}]), run / "dialogues" / "part-0.parquet")
    # a part written before thinking was stored has no such field
    older = [{k: v for k, v in t.items() if k != "reasoning_tokens"} for t in turns[:2]]
    pq.write_table(pa.Table.from_pylist([{**ids, "turns": older}]), run / "dialogues" / "part-1.parquet")
    judged = [{"user_id": "u", "reasoning_tokens": n} for n in (50, 70, None)]
    pq.write_table(pa.Table.from_pylist(judged), run / "judgments" / "part-0.parquet")

    measured = read_calibration(run)
    assert measured.reply() == {"user": 100, "assistant": 1000 / 3}  # every reply, its thinking included
    assert measured.thinking() == {"user": None, "assistant": 200}  # of the replies that counted it
    assert measured.answer() == {"user": 100, "assistant": pytest.approx(1000 / 3 - 200)}
    # the replies' lengths as measured, over their mean, for the engine model's dialogues
    spread = measured.turns("SD", 10.0).spread
    # (assistant: 200 of 400, 200 and 400, its third of the 16 quantiles' midpoints, at 0.6 of the mean)
    assert spread["user"] == (1.0,) * 16 and spread["assistant"] == pytest.approx((0.6,) * 5 + (1.2,) * 11)
    assert (measured.judgments, measured.judge_thinking) == (3, 60)
    assert _thinking({"thinking_tokens": measured.thinking()}, "assistant") == " (thinking 200.0)"
    assert _thinking({"thinking_tokens": measured.thinking()}, "user") == ""


def test_the_judges_replies_are_a_cap_bound_until_a_calibration_runs_judge_measured_them():
    from personalens.plan.pilot import judge_replies, pilot_commands
    from personalens.plan.text import _tokens

    overrides = [
        "model@judge=llama31_70b",
        "data.users=all",
        "run.name=big",
        "plan.gpus=8",
        "plan.calibrate=old",
        "x='a b'",
    ]
    run, plan = pilot_commands(overrides)
    assert run == "personalens run model@judge=llama31_70b 'x='\"'\"'a b'\"'\"'' data.users=0-4 run.name=pilot"
    assert (
        plan.startswith("personalens plan model@judge=llama31_70b") and "plan.gpus=8 plan.calibrate=runs/pilot" in plan
    )
    assert "old" not in plan and "big" not in run
    calibration = {
        "run_dir": "runs/pilot",
        "judge": {"items": 30},
        "judge_reply_tokens": 412.5,
        "judge_thinking_tokens": 120.0,
    }
    measured = judge_replies(4000, calibration, overrides)
    assert (measured["basis"], measured["tokens"], measured["thinking"]) == ("calibrated", 412.5, 120.0)
    # a calibration run without a judge summary leaves the cap
    assert judge_replies(4000, calibration | {"judge": None}, overrides)["basis"] == "cap"
    tokens = {
        "counted_with": {},
        "first_prompts": {"max_model_len": None, "max": 1, "user_agent_total": 1, "mean": 1},
        "fixed_parts": {},
        "at_cap": {
            "all": {k: 0 for k in ("turns", "prompt", "generated", "judgments", "judge_prompt", "judge_generated")},
            "per_dialogue": {},
        },
        "longest_prompts_at_cap": {},
    }
    said = _tokens(tokens | {"judge_replies": measured})
    assert (
        said[-1]
        == "  the judge's replies: 412.5 tokens per judgment, thinking 120.0 of them, as runs/pilot's judge wrote them (its max_tokens 4,000)"
    )
    capped = _tokens(tokens | {"judge_replies": judge_replies(4000, None, overrides)})
    assert "CAP BOUND: each counted at its max_tokens, 4,000 tokens" in capped[-3] and capped[-2:] == [
        f"    {run}",
        f"    {plan}",
    ]


@pytest.mark.parametrize("gpu_type", ["h100", "a100"])
def test_the_4x80gb_recipe_its_placement_time_and_the_fp8_refusal(tmp_path, paper_models, gpu_type):
    """docs/cluster.md's recipe for 4 x 80 GB nodes under the paper protocol: the 70B over the four
    GPUs with the 8B beside it on GPU 0, the judge job the 70B alone; the time modelled on the GPU
    type's figures with the shards a time limit takes; an fp8 KV cache refused on A100 (8.0)."""
    out = tmp_path / "plan.json"
    node = ["plan.gpus=4", "plan.gpu_memory_gib=80", f"plan.gpu_type={gpu_type}", "plan.model_dialogues=16"]
    fp8 = ["user_agent.kv_cache_dtype=fp8"] if gpu_type == "a100" else []
    proc = run_cli(
        "plan", *paper_models, *node, *fp8, "plan.time_limit=04:00:00", f"plan.out={out}", check=False, timeout=120
    )
    plan = json.loads(out.read_text())
    jobs = plan["placement"]["jobs"]
    judge = jobs["judge"]
    assert [(m["model"], m["mode"], m["gpus"]) for m in judge["models"]] == [
        ("Llama-3.1-70B-Instruct", "in_process", [0, 1, 2, 3])
    ]
    judge_rate = plan["time"]["rates_tokens_per_s"]["judge"]
    assert judge_rate == next(r["tokens_per_s"] for r in judge["throughput"]["alternatives"] if r["chosen"])
    if gpu_type == "a100":
        assert proc.returncode == 2
        assert "kv_cache_dtype fp8 refused" in jobs["generate"]["refused"] and "8.0" in jobs["generate"]["refused"]
        assert "A100 SXM 80GB figures" in proc.stdout and plan["time"]["rates_tokens_per_s"]["generate"] is None
        return
    assert proc.returncode == 0, proc.stderr
    generate = jobs["generate"]
    assert [(m["model"], m["mode"], m["gpus"]) for m in generate["models"]] == [
        ("Llama-3.1-70B-Instruct", "in_process", [0, 1, 2, 3]),
        ("Llama-3.1-8B-Instruct", "in_process", [0]),
    ]
    time_ = plan["time"]
    assert time_["rates_tokens_per_s"]["source"].startswith("modelled")
    whole = max(time_["generate_s"]["all"], time_["judge_s"]["all"])
    assert time_["time_limit"]["shards"] >= math.ceil(whole / (4 * 3600))
    assert "H100 SXM figures" in proc.stdout and "under 04:00:00 per job:" in proc.stdout


def test_the_70b_served_by_the_lab_and_what_its_server_needs(tmp_path, paper_models):
    """The 70B user agent and judge on a server the lab runs (docs/cluster.md), the job's one GPU for
    the 8B: it fits, and `plan` prints each served role's `vllm serve` line with the smallest context
    that holds its longest prompt at the cap and its reply (the judge's: a 4,000-token reply)."""
    out = tmp_path / "plan.json"
    served = [
        override
        for role in ("user_agent", "judge")
        for override in (f"engine@{role}=server", f"{role}.server.base_url=http://gpu-node-7:8000/v1")
    ]
    proc = run_cli(
        "plan", *paper_models, *served, "judge.server.api_key_env=LAB_KEY", "plan.gpus=1", "plan.gpu_memory_gib=80",
        f"plan.out={out}", timeout=120,
    )  # fmt: skip
    plan = json.loads(out.read_text())
    jobs = plan["placement"]["jobs"]
    assert [(m["model"], m["mode"], m.get("gpus")) for m in jobs["generate"]["models"]] == [
        ("Llama-3.1-70B-Instruct", "server", None),
        ("Llama-3.1-8B-Instruct", "in_process", [0]),
    ]
    assert [(m["model"], m["mode"]) for m in jobs["judge"]["models"]] == [("Llama-3.1-70B-Instruct", "server")]
    longest = plan["tokens"]["longest_prompts_at_cap"]
    servers = plan["servers"]
    assert set(servers) == {"user_agent", "judge"}
    assert servers["judge"]["max_model_len"] == int(max(k["judge"] for k in longest.values()) + 4000)
    assert servers["user_agent"]["max_model_len"] == int(max(k["dialogue"] for k in longest.values()) + 800)
    judge = servers["judge"]["command"]
    assert judge.startswith(f"vllm serve {paper_models[paper_models.index('model@judge=llama31_70b') + 1][11:]} ")
    for flag in (
        f"--max-model-len {servers['judge']['max_model_len']}",
        "--structured-outputs-config.backend xgrammar",
        "--enable-prompt-tokens-details",
        "--served-model-name Llama-3.1-70B-Instruct",
        "--api-key $LAB_KEY",
    ):
        assert flag in judge and flag in proc.stdout, flag
    assert "--api-key" not in servers["user_agent"]["command"]
    assert "only under compare.allow=[judge]" in proc.stdout and "family llama for the self-preference" in proc.stdout
