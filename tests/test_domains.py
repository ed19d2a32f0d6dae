"""Domains a lab adds to the benchmark: a data root's domains are the release's 20, then each other
`task/<Domain>/` folder with a task file; every reader (loader, validate, schema, stats, report) takes
them from there."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from test_report import judge_all, make_dialogue, write_run

from personalens.data import DOMAINS, domains_of, load_scenarios, load_task_definitions, load_user, validate
from personalens.data.records import with_domains
from personalens.data.schema import SchemaError, load_schema
from personalens.report import ReportError, build_report
from personalens.validation.pipeline import build_stats, built_data_stats

REPO = Path(__file__).resolve().parents[1]
ADDED = "Knitting"
KNITTING_TASK = {
    "Task Number": 1,
    "Task Description": "The user wants a pattern for a scarf.",
    "User Intent": "Find a scarf pattern in your favourite yarn.",
    "Task Goal": "A scarf pattern in the user's yarn is chosen.",
    "Relevant Affinity Types": ["Yarn"],
}
SITUATION = {
    "Location": "Oslo, Norway",
    "Device": "Tablet",
    "Time of Day": "Evening",
    "Day of the Week": "Sunday",
    "Environment": "Quiet",
}


def _json(path: Path) -> dict:
    return json.loads(path.read_text())


def _save(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=1))


def _add_domain(root: Path) -> None:
    """The sample with a Knitting domain: its task file, a key in every profile, and user0 (interested)
    assigned its task."""
    (root / "task" / ADDED).mkdir()
    (root / "task" / ADDED / "task.jsonl").write_text(json.dumps(KNITTING_TASK) + "\n")
    for user in sorted((root / "profile").iterdir()):
        profile = _json(user / "profile.json")
        interested = user.name == "user0"
        profile["interests"][ADDED] = int(interested)
        profile["affinities"][ADDED] = {"Yarn": ["merino"]} if interested else {}
        profile["interactions"][ADDED] = "Knits a scarf every winter." if interested else ""
        _save(user / "profile.json", profile)
    tasks = _json(root / "profile" / "user0" / "tasks.json")
    tasks[f"Task {len(tasks) + 1}"] = {
        **{k: KNITTING_TASK[k] for k in ("Task Description", "User Intent", "Task Goal", "Relevant Affinity Types")},
        "task_id": f"SD-{ADDED}-task-1",
        "situations": SITUATION,
        "Relevant Domains": [ADDED],
    }
    _save(root / "profile" / "user0" / "tasks.json", tasks)


@pytest.fixture()
def extended_root(sample_root, tmp_path) -> Path:
    root = tmp_path / "data"
    shutil.copytree(sample_root, root)
    _add_domain(root)
    return root


def test_domains_are_the_release_ones_then_added_task_folders_by_name(sample_root, tmp_path):
    assert domains_of(sample_root) == DOMAINS  # the sample has folders for only some of them
    root = tmp_path / "data"
    shutil.copytree(sample_root, root)
    for folder, with_file in (("Zoos", True), (ADDED, True), ("Cooking", False), (".cache", True)):
        (root / "task" / folder).mkdir()
        if with_file:
            (root / "task" / folder / "task.jsonl").write_text("")
    # a folder without a task file (or a hidden one) declares no domain
    assert domains_of(root) == (*DOMAINS, ADDED, "Zoos")
    assert with_domains(["Zoos", "Alarm", ADDED, "Zoos"]) == (*DOMAINS, ADDED, "Zoos")
    assert domains_of(tmp_path / "nothing") == DOMAINS


def test_a_root_with_an_added_domain_validates_and_loads(extended_root):
    report = validate(extended_root, strict=True)
    assert report.ok, report.format()
    assert load_task_definitions(extended_root)[f"SD-{ADDED}-task-1"].domains == (ADDED,)
    scenarios = load_scenarios(extended_root, [0])
    assert f"SD-{ADDED}-task-1" in [s.task.task_id for s in scenarios]
    user = load_user(extended_root, 1)
    assert list(user.interests) == [*_json(extended_root / "profile" / "user1" / "profile.json")["interests"]]
    assert user.interests[ADDED] == 0 and user.affinities[ADDED] == {}
    # a multi-domain task may span it
    path = extended_root / "task" / "Multi-Domain" / "task.jsonl"
    lines = path.read_text().splitlines()
    last = json.loads(lines[-1])
    last.update({"Task Number": 50, "Relevant Domains": ["Movies", ADDED]})
    path.write_text("\n".join([*lines, json.dumps(last)]) + "\n")
    assert validate(extended_root).ok


def test_every_profile_must_hold_an_added_domain_and_stray_punctuation_still_reads_as_it(extended_root):
    path = extended_root / "profile" / "user2" / "profile.json"
    profile = _json(path)
    del profile["affinities"][ADDED]
    profile["interests"][f"{ADDED}**"] = profile["interests"].pop(ADDED)
    _save(path, profile)

    report = validate(extended_root)

    assert [(p.file, p.location, p.message) for p in report.errors] == [
        ("profile/user2/profile.json", f'"affinities"."{ADDED}"', "missing")
    ]
    assert [(p.location, p.message) for p in report.warnings] == [(f'"interests"."{ADDED}**"', f"read as {ADDED!r}")]


def test_schema_accepts_an_added_domain_and_refuses_names_that_cannot_be_a_folder(tmp_path):
    schema = json.loads((REPO / "data" / "datagen" / "schema.json").read_text())
    added = {**schema[0], "domain": ADDED}
    path = tmp_path / "schema.json"
    path.write_text(json.dumps([*schema, added]))
    assert [d.name for d in load_schema(path)] == [*(d["domain"] for d in schema), ADDED]
    for bad in ("Multi-Domain", "Arts/Crafts", " Knitting", "", ".hidden"):
        path.write_text(json.dumps([*schema, {**added, "domain": bad}]))
        with pytest.raises(SchemaError, match=rf"\[{len(schema)}\].domain: .* cannot name a domain folder"):
            load_schema(path)


def test_stats_count_and_describe_an_added_domain(extended_root, tmp_path):
    schema = json.loads((REPO / "data" / "datagen" / "schema.json").read_text())
    path = tmp_path / "schema.json"
    path.write_text(
        json.dumps(
            [
                *schema,
                {
                    "domain": ADDED,
                    "description": "Knitting patterns and yarn.",
                    "affinities": [
                        {
                            "name": "Yarn",
                            "description": "",
                            "is_categorical": True,
                            "has_multiple_values": True,
                            "possible_values": ["merino", "cotton"],
                        }
                    ],
                },
            ]
        )
    )

    result = build_stats(extended_root, "all", path, tmp_path / "stats")

    table1 = result.tables[0]
    assert [labels[0] for labels, _ in table1.rows] == [*DOMAINS, ADDED, "Total SD", "Total MD"]
    assert table1.cell((ADDED,), "tasks") == 1 and table1.cell((ADDED,), "dialogues") == 1
    table9 = next(t for t in result.tables if t.name == "table9")
    assert table9.title == f"Table 9: user preferences, Messaging to {ADDED}"
    labels, cells = table9.rows[-1]
    assert labels == (ADDED, "Yarn", "✓") and cells[:4] == (2, 1, 1, 0)  # user0's "merino", inside the schema


def test_built_data_stats_are_table1_and_tables_8_9_with_the_build_schema(sample_root, tmp_path):
    schema = load_schema(REPO / "data" / "datagen" / "schema.json")
    result = built_data_stats(sample_root, schema, tmp_path / "stats")
    assert [t.name for t in result.tables] == ["table1", "table8", "table9"]
    assert {p.name for p in result.files} == {
        f"{t}.{ext}" for t in ("table1", "table8", "table9") for ext in ("md", "csv", "tex")
    }
    # Tables 8-9 hold the schema's domains, each where the paper splits the release's
    shown = [labels[0] for t in result.tables[1:] for labels, _ in t.rows]
    assert sorted(set(shown)) == sorted(d.name for d in schema)
    assert result.tables[0].rows == build_stats(sample_root, "all", None, tmp_path / "all").tables[0].rows


def test_report_accepts_an_added_domain_its_runs_hold_for_figure5(tmp_path):
    dialogues = [make_dialogue(i, "SD", [ADDED if i % 2 else "Books"]) for i in range(4)]
    run = write_run(tmp_path / "run", dialogues, [j for d in dialogues for j in judge_all(d, 1.0, 2.0, turn_p=[2.0])])
    report = build_report([run], tmp_path / "out", bootstrap=10, figure5_domains=[ADDED])
    assert report.figure5_domains == (ADDED,)
    with pytest.raises(ReportError, match=f"unknown domain.*the domains are .*Travel, {ADDED}"):
        build_report([run], tmp_path / "out", bootstrap=10, figure5_domains=["Weaving"])
