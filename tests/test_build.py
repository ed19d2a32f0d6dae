"""`personalens build`: config refusal and inputs (pure), and one end-to-end build on the embedded
model that resumes after a kill, assembles the official layout, validates, and feeds `generate` unchanged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import ENGINE_CORE_HERE, kill_once, start_cli
from hydra import compose, initialize_config_dir

from personalens import cli
from personalens.config import register_resolvers
from personalens.data import DOMAINS, domains_of, load_scenarios, validate
from personalens.datagen import command as datagen_command
from personalens.datagen.batch import Job, Runner, retry_sampling
from personalens.datagen.demographics import FIELDS, DemographicsError, load_demographics
from personalens.engines.base import Generation, Sampling
from personalens.errors import PersonalensError
from personalens.simulate import command as simulate_command
from personalens.store import read_table

REPO = Path(__file__).resolve().parents[1]
SMALL = [
    "datagen=quick",
    "datagen.users=2",
    "datagen.tasks.sd_per_domain=1",
    "datagen.tasks.md_count=1",
    "datagen.consistency.max_regenerations=1",
    "progress=false",
]


def config(*overrides: str):
    register_resolvers()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return compose("config", overrides=list(overrides))


def no_engine():
    raise AssertionError("the engine must not be loaded")


def test_a_changed_configuration_is_refused_before_any_work(tmp_path):
    out = f"datagen.out_dir={tmp_path}"
    assert cli.build(config(out, "datagen.stages=[]", *SMALL), engine=no_engine) == 0
    assert (tmp_path / "build.yaml").read_text().startswith("fingerprint:")
    # stages and chunking only say what to run now: not a different configuration
    assert cli.build(config(out, "datagen.stages=[]", "datagen.chunk=7", *SMALL), engine=no_engine) == 0
    for change in ("datagen.seed=1", "datagen.limits.text_words=7", "datagen.users=3", "builder.max_model_len=4096"):
        with pytest.raises(PersonalensError, match="different configuration"):
            cli.build(config(out, "datagen.stages=[]", *SMALL, change), engine=no_engine)
    with pytest.raises(PersonalensError, match="missing in"):  # a stage not run only reads, and says what is missing
        cli.build(config(out, "datagen.stages=[assemble]", *SMALL), engine=no_engine)
    with pytest.raises(PersonalensError, match="without sharding"):
        cli.build(config(out, "datagen.stages=[assemble]", "shard.count=2", *SMALL), engine=no_engine)
    with pytest.raises(PersonalensError, match="'sd_tasks'.*missing"):  # shards never make the shared tasks
        cli.build(config(out, "datagen.stages=[tasks]", "shard.count=2", *SMALL), engine=no_engine)


def test_demographics_plain_and_prism_style(tmp_path):
    people = load_demographics(
        REPO / "data" / "datagen" / "demographics.csv",
        {f: f for f in FIELDS},
        users=2,
    )
    assert len(people) == 2 and people[0]["birth_country"] == "South Korea" and "user_id" not in people[0]
    survey = tmp_path / "survey.jsonl"
    rows = [
        {
            "user_id": "p1",
            "survey_only": False,
            "age": "25-34 years old",
            "gender": "Female",
            "employment_status": "Unemployed",
            "education": None,
            "marital_status": "Married",
            "english_proficiency": "Fluent",
            "ethnicity": {"simplified": "White"},
            "religion": {"simplified": "No Affiliation"},
            "location": {"birth_country": "Chile", "reside_country": "Chile"},
        },
        {"user_id": "p2", "survey_only": True},
    ]
    survey.write_text("".join(json.dumps(r) + "\n" for r in rows))
    columns = dict(config("datagen=prism", "datagen.demographics.path=x").datagen.demographics.columns)
    people = load_demographics(survey, columns, skip_rows={"survey_only": True})
    assert people == [
        {
            "age": "25-34 years old",
            "gender": "Female",
            "employment_status": "Unemployed",
            "education": "N/A",
            "marital_status": "Married",
            "english_proficiency": "Fluent",
            "ethnicity": "White",
            "religion": "No Affiliation",
            "birth_country": "Chile",
            "reside_country": "Chile",
        }
    ]
    with pytest.raises(DemographicsError, match="row 2: no column 'age'"):
        load_demographics(survey, columns)  # p2 lacks it; with skip_rows left out it is read
    with pytest.raises(DemographicsError, match="has only 1 usable rows"):
        load_demographics(survey, columns, users=2, skip_rows={"survey_only": True})


def part_files(folder: Path) -> set[str]:
    return {p.name for p in folder.rglob("part-*.parquet")}


def test_a_cut_off_output_is_retried_with_a_new_seed_and_counted_once_by_the_progress_bar(tmp_path, capsys):
    class CutsOffTheFirstTry:
        name = "scripted"

        def __init__(self):
            self.seeds: list[list[int]] = []
            self.budgets: list[list[int]] = []

        def generate(self, requests):
            self.seeds.append([r.sampling.seed for r in requests])
            self.budgets.append([r.sampling.max_tokens for r in requests])
            first_call = len(self.seeds) == 1
            return [
                Generation("cut" if first_call and r.messages[0]["content"] == "a" else "{}", 5, 3) for r in requests
            ]

    engine = CutsOffTheFirstTry()
    runner = Runner(
        root=tmp_path,
        shard=(0, 1),
        engine=lambda: engine,
        sampling=lambda stage: Sampling(temperature=0.0, max_tokens=100),
        seed=7,
        retries=2,
        chunk=8,
        config_hash="h",
        progress=True,
        max_tokens_cap=1000,
    )
    jobs = [
        Job(
            (name,), 0, [{"role": "user", "content": name}], 'root ::= "{}"', lambda text: None if text == "cut" else {}
        )
        for name in "ab"
    ]
    assert runner.run("stage", jobs, active=True) == {("a",): {}, ("b",): {}}
    assert [len(call) for call in engine.seeds] == [2, 1]  # only the cut-off job went again
    assert engine.seeds[1][0] != engine.seeds[0][0]  # with another seed
    assert engine.budgets == [[100, 100], [200]]  # and a doubled budget: at temperature 0 only that can help
    count = runner.counts["stage"]
    assert (count.requests, count.retries, count.completion_tokens) == (3, 1, 9)
    bar = capsys.readouterr().err
    assert "2/2" in bar and "3/2" not in bar
    # a second run finds every job done and calls no engine
    again = Runner(
        root=tmp_path,
        shard=(0, 1),
        engine=no_engine,
        sampling=lambda stage: Sampling(),
        seed=7,
        retries=2,
        chunk=8,
        config_hash="h",
        progress=False,
    )
    assert again.run("stage", jobs, active=True) == {("a",): {}, ("b",): {}}
    assert again.counts["stage"].skipped == 2


def test_a_retry_doubles_the_budget_up_to_the_cap_and_never_below_the_stage_budget():
    base = Sampling(temperature=0.0, max_tokens=512)
    assert [retry_sampling(base, attempt, 1536, seed=attempt).max_tokens for attempt in range(4)] == [
        512,
        1024,
        1536,
        1536,
    ]
    assert retry_sampling(base, 2, 0, seed=1).max_tokens == 512  # a cap below the stage budget keeps it
    again = retry_sampling(base, 1, 4096, seed=9)
    assert (again.seed, again.temperature, again.top_p) == (9, 0.0, base.top_p)


def test_the_default_build_grows_a_cut_off_consistency_check_past_its_budget():
    cfg = config()
    budgets = [int(cfg.datagen.max_tokens.consistency) * 2**t for t in range(int(cfg.datagen.retries) + 1)]
    assert int(cfg.datagen.max_tokens_cap) >= budgets[-1] > budgets[0]


@pytest.mark.vllm
def test_a_cut_off_temperature_0_output_is_retried_with_a_larger_budget_on_the_real_engine(tmp_path, engine):
    # a grammar with one fixed output of several tokens (the constrained model may spell it in short
    # tokens): a budget of 2 cuts it off; the doubled budgets of the retries reach it
    text = "qzxjvkwpfy"
    job = Job(
        ("k",), 0, [{"role": "user", "content": "Say it."}], f'root ::= "{text}"', lambda t: t if t == text else None
    )
    runner = Runner(
        root=tmp_path,
        shard=(0, 1),
        engine=lambda: engine,
        sampling=lambda stage: Sampling(temperature=0.0, max_tokens=2),
        seed=0,
        retries=5,
        chunk=8,
        config_hash="h",
        progress=False,
        max_tokens_cap=64,
    )
    assert runner.run("consistency", [job], active=True) == {("k",): text}
    rows = sorted(read_table(tmp_path / "consistency").to_pylist(), key=lambda r: r["try"])
    assert rows[0]["completion_tokens"] == 2 and rows[0]["value"] is None  # cut off at the stage budget
    assert rows[1]["completion_tokens"] > 2  # the retry was a different request: a larger budget
    assert rows[-1]["value"] is not None and all(r["value"] is None for r in rows[:-1])


@pytest.mark.vllm
def test_build_resumes_assembles_the_official_layout_and_runs_through_generate(tmp_path, engine, capsys):
    out = tmp_path / "data"
    args = [f"datagen.out_dir={out}", *SMALL]
    load = lambda: engine  # noqa: E731

    # the real command in its own process, killed (with its vLLM workers) once the first stage is
    # on disk; the full build then resumes from there
    stages = out / "build"
    proc = start_cli("build", *args, log=tmp_path / "killed.log", env=ENGINE_CORE_HERE)
    kill_once(proc, lambda: bool(part_files(stages / "interests")), tmp_path / "killed.log")
    interests_before = part_files(stages / "interests")
    assert len(read_table(stages / "interests")) == 2
    assert not (out / "profile").exists()  # killed long before assembly
    assert cli.build(config(*args), engine=load) == 0
    assert part_files(stages / "interests") == interests_before  # nothing redone
    prefs = read_table(stages / "preferences").to_pylist()
    keys = [r["key"] for r in prefs if r["value"] is not None]
    assert len(keys) == len(set(keys))

    # the official layout, complete and valid
    report = validate(out)
    assert report.ok, report.format()
    assert sorted(p.name for p in (out / "profile").iterdir()) == ["user0", "user1"]
    built = ["Alarm", "Movies", "Restaurants"]
    assert sorted(p.name for p in (out / "task").iterdir()) == sorted([*built, "Multi-Domain"])
    profile = json.loads((out / "profile" / "user0" / "profile.json").read_text())
    assert list(profile["interests"]) == list(DOMAINS)
    assert sum(profile["interests"][d] for d in built) >= 2  # datagen=quick keeps at least 2 domains
    assert all(profile["interests"][d] == 0 and profile["affinities"][d] == {} for d in DOMAINS if d not in built)
    alarm = profile["affinities"]["Alarm"]
    assert alarm["Wake-up Time"] in [
        "5:00 AM",
        "5:30 AM",
        "6:00 AM",
        "6:30 AM",
        "7:00 AM",
        "7:30 AM",
        "8:00 AM",
        "9:00 AM",
    ]
    assert isinstance(alarm["Alarm Sound"], list) and isinstance(alarm["Snooze Habit"], str)
    lines = [json.loads(x) for x in (out / "task" / "Movies" / "task.jsonl").read_text().splitlines()]
    assert [x["Task Number"] for x in lines] == [1]
    scenarios = load_scenarios(out)
    assert {s.task.task_id for s in scenarios} <= {
        "SD-Alarm-task-1",
        "SD-Movies-task-1",
        "SD-Restaurants-task-1",
        "MD-task-1",
    }
    assert report.sd_scenarios == sum(s.task.kind == "SD" for s in scenarios) >= 4
    assert (stages / "consistency" / "flags.md").read_text().startswith("### Profiles flagged")
    # the summary ends with the new data's Table 1 and Tables 8-9 (the build schema's domains), also written
    printed = capsys.readouterr().out
    for name in ("table1", "table8", "table9"):
        written = (stages / "stats" / f"{name}.md").read_text()
        assert written in printed and (stages / "stats" / f"{name}.csv").is_file()
    assert "| Total SD | 3 |" in printed  # 1 task in each of the 3 built domains
    assert "| Alarm | Wake-up Time | ✓ | 8 |" in (stages / "stats" / "table8.md").read_text()

    # a part file lost in the middle of a stage (a kill during its write): only it is made again
    situations = stages / "situations"
    rows_before = read_table(situations).num_rows
    victim = sorted(situations.rglob("part-*.parquet"))[0]
    victim.unlink()
    kept = part_files(situations)
    assert cli.build(config(*args), engine=load) == 0
    assert kept < part_files(situations) and read_table(situations).num_rows == rows_before
    assert validate(out).ok

    # the new data runs through generate unchanged
    run = tmp_path / "run"
    cfg = config(
        f"data.root={out}",
        "data.users=[0]",
        "data.kinds=SD",
        "protocol=quick",
        "protocol.max_rounds_sd=1",
        f"run.out_dir={run}",
        "progress=false",
    )
    assert simulate_command.generate(cfg, engines=lambda: {"user_agent": engine, "assistant": engine}) == 0
    dialogues = read_table(run / "dialogues").to_pylist()
    assert sorted(d["task_id"] for d in dialogues) == sorted(
        s.task.task_id for s in scenarios if s.user.index == 0 and s.task.kind == "SD"
    )

    # the consistency command on the new data root: one check per selected user, resumable
    check = tmp_path / "check"
    cfg = config(f"data.root={out}", "datagen=quick", f"run.out_dir={check}", "progress=false")
    assert datagen_command.consistency(cfg, engine=load) == 0
    rows = read_table(check / "consistency").to_pylist()
    assert sorted(json.loads(r["key"])[0] for r in rows if r["value"] is not None) == ["user0", "user1"]
    files = part_files(check / "consistency")
    assert datagen_command.consistency(cfg, engine=no_engine) == 0 and part_files(check / "consistency") == files
    table = (check / "consistency" / "flags.md").read_text()
    assert "| Any | 2 |" in table


@pytest.mark.vllm
def test_a_schema_with_an_added_domain_builds_validates_loads_and_generates(tmp_path, engine):
    schema = json.loads((REPO / "data" / "datagen" / "schema.json").read_text())
    games = ["chess", "go", "catan", "scrabble"]
    added = {
        "domain": "Board Games",
        "description": "Find, buy and learn board games to play with others.",
        "tasks": [{"name": "FindGame", "description": "Suggest a board game for a group."}],
        "affinities": [
            {
                "name": "Favourite Game",
                "description": "The board game the user likes best.",
                "is_categorical": True,
                "has_multiple_values": False,
                "possible_values": games,
            },
            {
                "name": "Group Size",
                "description": "How many people the user usually plays with, in words.",
                "is_categorical": False,
                "has_multiple_values": False,
                "possible_values": [],
            },
        ],
    }
    path = tmp_path / "schema.json"
    path.write_text(json.dumps([*schema, added]))
    out = tmp_path / "data"
    args = [
        f"datagen.out_dir={out}",
        *SMALL,
        "datagen.users=1",
        f"datagen.schema={path}",
        "datagen.domains=[Alarm,Board Games]",
    ]
    assert cli.build(config(*args), engine=lambda: engine) == 0

    report = validate(out, strict=True)
    assert report.ok, report.format()
    assert domains_of(out) == (*DOMAINS, "Board Games")
    profile = json.loads((out / "profile" / "user0" / "profile.json").read_text())
    assert list(profile["interests"]) == list(domains_of(out))
    assert profile["interests"]["Board Games"] == 1  # datagen=quick keeps at least 2 of the 2 domains
    assert profile["affinities"]["Board Games"]["Favourite Game"] in games
    scenarios = load_scenarios(out)
    assert "SD-Board Games-task-1" in {s.task.task_id for s in scenarios}
    assert "Board Games" in (out / "build" / "stats" / "table9.md").read_text()

    run = tmp_path / "run"
    cfg = config(
        f"data.root={out}",
        "data.users=[0]",
        "data.kinds=SD",
        "protocol=quick",
        "protocol.max_rounds_sd=1",
        f"run.out_dir={run}",
        "progress=false",
    )
    assert simulate_command.generate(cfg, engines=lambda: {"user_agent": engine, "assistant": engine}) == 0
    dialogues = read_table(run / "dialogues").to_pylist()
    assert sorted(d["task_id"] for d in dialogues) == ["SD-Alarm-task-1", "SD-Board Games-task-1"]
    assert [d["domains"] for d in dialogues if d["task_id"] == "SD-Board Games-task-1"] == [["Board Games"]]
