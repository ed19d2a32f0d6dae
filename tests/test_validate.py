"""`validate` lists every problem in a data root, one clear line each, and counts what is there."""

import json
import shutil
from pathlib import Path

import pytest
from cli_helpers import run_cli

from personalens.data import DataError, load_scenarios, validate
from personalens.data.loading import DOMAIN_KEY_NORMALISED, TASK_COPY_DIFFERS


def _expected_counts(root: Path) -> tuple[int, int, int]:
    users = [p for p in (root / "profile").iterdir() if p.is_dir()]
    sd = sum(len(json.loads((p / "tasks.json").read_text())) for p in users)
    md = sum(len(json.loads((p / "tasks_md.json").read_text())) for p in users)
    return len(users), sd, md


@pytest.mark.parametrize("which", ["sample", "excerpt"])
def test_clean_data_has_no_problems_and_right_counts(which, request):
    root = request.getfixturevalue("sample_root" if which == "sample" else "shared_data_root")
    report = validate(root)
    assert report.problems == () and report.ok
    users, sd, md = _expected_counts(root)
    assert (report.users, report.sd_scenarios, report.md_scenarios) == (users, sd, md)
    assert report.format().splitlines() == [
        f"{root}: OK; {users} users, {sd} single-domain and {md} multi-domain scenarios"
    ]


def test_missing_root_is_one_problem(tmp_path):
    report = validate(tmp_path / "nowhere")
    assert not report.ok and len(report.problems) == 1
    assert "does not exist" in str(report.problems[0])
    assert (
        report.format().splitlines()[-1].endswith(": 1 problem; 0 users, 0 single-domain and 0 multi-domain scenarios")
    )


# ------------------------------------------------------------ planted faults


def _load(path: Path) -> dict:
    return json.loads(path.read_text())


def _save(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=4))


def _user(root: Path, index: int) -> Path:
    return root / "profile" / f"user{index}"


def _plant_faults(root: Path) -> list[tuple[str, str, str]]:
    """Plant one fault of each kind; return (file, location, message part) expected for each."""
    # a user directory without profile.json (copied before user5 gets a fault below)
    shutil.copytree(_user(root, 5), _user(root, 6))
    (_user(root, 6) / "profile.json").unlink()
    expected = [("profile/user6/profile.json", "", "missing")]

    # malformed JSON: a doubled comma at the end of line 4
    path = _user(root, 1) / "tasks_md.json"
    lines = path.read_text().splitlines()
    lines[3] += ","
    path.write_text("\n".join(lines))
    expected.append(("profile/user1/tasks_md.json", "line 4 column", "malformed JSON"))

    # a missing field
    path = _user(root, 3) / "tasks.json"
    tasks = _load(path)
    del tasks["Task 2"]["situations"]["Device"]
    _save(path, tasks)
    expected.append(("profile/user3/tasks.json", '"Task 2"."situations"."Device"', "missing"))

    # a mistyped field
    path = _user(root, 0) / "profile.json"
    profile = _load(path)
    profile["interests"]["Games"] = "no"
    _save(path, profile)
    expected.append(("profile/user0/profile.json", '"interests"."Games"', "expected an integer, got a string"))

    # a per-domain key with stray punctuation when the domain itself is there too
    path = _user(root, 1) / "profile.json"
    profile = _load(path)
    profile["interests"]["Games**"] = 1
    _save(path, profile)
    expected.append(("profile/user1/profile.json", '"interests"."Games**"', "unknown domain 'Games**'"))

    # single- and multi-domain tasks assigned in a domain the interests exclude
    for index, name, only_in in ((2, "tasks.json", "SD"), (4, "tasks_md.json", "MD")):
        sd, md = _load(_user(root, index) / "tasks.json"), _load(_user(root, index) / "tasks_md.json")
        domains = {
            kind: [d for e in tasks.values() for d in e["Relevant Domains"]] for kind, tasks in (("SD", sd), ("MD", md))
        }
        other = "MD" if only_in == "SD" else "SD"
        domain = next(d for d in domains[only_in] if d not in domains[other])
        assert domains[only_in].count(domain) == 1
        path = _user(root, index) / "profile.json"
        profile = _load(path)
        profile["interests"][domain] = 0
        _save(path, profile)
        key = next(k for k, e in (sd if only_in == "SD" else md).items() if domain in e["Relevant Domains"])
        expected.append(
            (f"profile/user{index}/{name}", f'"{key}"."task_id"', f"'{domain}', which the user's interests exclude")
        )

    # an unknown domain
    path = _user(root, 5) / "tasks.json"
    tasks = _load(path)
    tasks["Task 1"]["task_id"] = "SD-Cooking-task-1"
    _save(path, tasks)
    expected.append(("profile/user5/tasks.json", '"Task 1"."task_id"', "unknown domain 'Cooking'"))

    # a duplicate task id within a user
    path = _user(root, 1) / "tasks.json"
    tasks = _load(path)
    tasks[f"Task {len(tasks) + 1}"] = tasks["Task 1"]
    _save(path, tasks)
    expected.append(("profile/user1/tasks.json", f'"Task {len(tasks)}"."task_id"', "duplicate task id"))

    # a task id with no definition
    path = _user(root, 3) / "tasks_md.json"
    tasks = _load(path)
    tasks["Task 1"]["task_id"] = "MD-task-99"
    _save(path, tasks)
    expected.append(
        (
            "profile/user3/tasks_md.json",
            '"Task 1"."task_id"',
            "no definition of 'MD-task-99' in task/Multi-Domain/task.jsonl",
        )
    )

    return expected


def test_every_planted_fault_gives_one_clear_problem(sample_root, tmp_path):
    root = tmp_path / "data"
    shutil.copytree(sample_root, root)
    expected = _plant_faults(root)

    report = validate(root)

    assert not report.ok
    unmatched = list(report.problems)
    for file, location, message in expected:
        hits = [p for p in unmatched if p.file == file and p.location.startswith(location) and message in p.message]
        assert len(hits) == 1, (file, location, message, [str(p) for p in report.problems])
        unmatched.remove(hits[0])
        line = str(hits[0])
        assert "\n" not in line and line.startswith(f"{file}: ")
    assert unmatched == [], [str(p) for p in unmatched]
    lines = report.format().splitlines()
    assert lines[:-1] == [str(p) for p in report.problems]
    assert lines[-1].startswith(f"{root}: {len(expected)} problems; 7 users,")


def test_loader_raises_the_same_problems(sample_root, tmp_path):
    root = tmp_path / "data"
    shutil.copytree(sample_root, root)
    _plant_faults(root)
    with pytest.raises(DataError) as caught:
        load_scenarios(root)
    assert set(caught.value.problems) == set(validate(root).problems)
    assert str(caught.value.problems[0]) in str(caught.value)


def test_bad_task_definitions_are_reported(sample_root, tmp_path):
    root = tmp_path / "data"
    shutil.copytree(sample_root, root)
    (root / "task" / "Cooking").mkdir()
    path = root / "task" / "Multi-Domain" / "task.jsonl"
    lines = path.read_text().splitlines()
    unused = json.loads(lines[-1])
    unused.update({"Task Number": 50, "Relevant Domains": ["Movies", "Knitting"]})
    lines.append(json.dumps(unused))
    lines.append("{broken")
    path.write_text("\n".join(lines) + "\n")

    problems = [str(p) for p in validate(root).problems]

    assert problems == [  # known domains in the release's order, then unknown folders
        f"task/Multi-Domain/task.jsonl: line {len(lines) - 1}, \"Relevant Domains\"[1]: unknown domain 'Knitting'",
        f"task/Multi-Domain/task.jsonl: line {len(lines)} column 2: malformed JSON: "
        "Expecting property name enclosed in double quotes",
        "task/Cooking/: unknown domain 'Cooking'",
    ]


# ------------------------------------------------ quirks of the public release: warnings


def _plant_quirks(root: Path) -> dict:
    """The release's two tolerated quirks, as they occur there: per-user task copies whose fields
    differ from the definition (5 here, so the grouped summary must shorten), and an interests key
    with stray punctuation. Returns what the loader must make of them."""
    changed = {}
    for index, name, key, field, edit in (
        (0, "tasks_md.json", "Task 1", "Relevant Affinity Types", lambda v: v[:-1]),
        (1, "tasks_md.json", "Task 2", "Relevant Affinity Types", lambda v: v + ["Seat Preference"]),
        (2, "tasks_md.json", "Task 1", "Relevant Affinity Types", lambda v: list(reversed(v))),
        (2, "tasks.json", "Task 2", "User Intent", lambda v: v + " Quickly."),
        (1, "tasks.json", "Task 1", "Task Goal", lambda v: v.upper()),
    ):
        path = _user(root, index) / name
        tasks = _load(path)
        tasks[key][field] = edit(tasks[key][field])
        _save(path, tasks)
        changed[(f"user{index}", tasks[key]["task_id"])] = (field, tasks[key][field])
    path = _user(root, 2) / "profile.json"
    profile = _load(path)
    interests = profile["interests"]
    profile["interests"] = {("Buses**" if k == "Buses" else k): v for k, v in interests.items()}
    _save(path, profile)
    return {"copies": changed, "buses": interests["Buses"], "order": list(interests)}


@pytest.fixture
def quirky_root(shared_data_root, tmp_path):
    root = tmp_path / "data"
    shutil.copytree(shared_data_root, root)
    return root, _plant_quirks(root)


def test_release_quirks_are_warnings_grouped_by_kind(quirky_root):
    root, planted = quirky_root
    report = validate(root)

    assert report.ok and report.errors == ()
    kinds = [w.kind for w in report.warnings]
    assert kinds.count(TASK_COPY_DIFFERS) == 5 and kinds.count(DOMAIN_KEY_NORMALISED) == 1
    buses = next(w for w in report.warnings if w.kind == DOMAIN_KEY_NORMALISED)
    assert (buses.file, buses.location) == ("profile/user2/profile.json", '"interests"."Buses**"')
    copy = next(w for w in report.warnings if w.file == "profile/user2/tasks.json")
    assert copy.location == '"Task 2"."User Intent"' and "SD-" in copy.message

    users, sd, md = _expected_counts(root)  # every scenario still counts
    assert (report.users, report.sd_scenarios, report.md_scenarios) == (users, sd, md)
    lines = report.format().splitlines()
    assert lines[-1] == f"{root}: OK with 6 warnings; {users} users, {sd} single-domain and {md} multi-domain scenarios"
    assert len(lines) == 3  # one line per kind of warning, then the totals
    assert lines[0].startswith(f"warning: {TASK_COPY_DIFFERS} (5): profile/user0/tasks_md.json")
    assert lines[0].endswith("; and 2 more")
    assert lines[1].startswith(f"warning: {DOMAIN_KEY_NORMALISED} (1): profile/user2/profile.json")


def test_loader_uses_the_users_copy_and_the_normalised_domain(quirky_root, caplog):
    root, planted = quirky_root
    with caplog.at_level("WARNING", logger="personalens.data.loading"):
        scenarios = load_scenarios(root)
    attrs = {"Relevant Affinity Types": "affinity_types", "User Intent": "user_intent", "Task Goal": "goal"}
    by_key = {(s.user.user_id, s.task.task_id): s for s in scenarios}
    for key, (field, value) in planted["copies"].items():
        got = getattr(by_key[key].task, attrs[field])
        assert (list(got) if isinstance(got, tuple) else got) == value
    user2 = next(s.user for s in scenarios if s.user.user_id == "user2")
    assert user2.interests["Buses"] == planted["buses"] and "Buses**" not in user2.interests
    assert list(user2.interests) == planted["order"]  # the file's domain order is kept
    assert len(scenarios) == sum(_expected_counts(root)[1:])
    logged = [r.getMessage() for r in caplog.records]
    assert len(logged) == 2 and all(m.startswith(f"{root}: warning: ") for m in logged)


def test_strict_mode_makes_the_quirks_errors(quirky_root):
    root, _ = quirky_root
    report = validate(root, strict=True)
    assert not report.ok and len(report.errors) == 6 and report.warnings == ()
    assert report.format().splitlines()[-1].startswith(f"{root}: 6 problems;")
    with pytest.raises(DataError, match="Buses"):
        load_scenarios(root, strict=True)


def test_validate_command_exits_zero_on_quirks_and_nonzero_when_strict(quirky_root):
    root, _ = quirky_root
    lenient = run_cli("validate", str(root), timeout=120)
    assert "OK with 6 warnings" in lenient.stdout and "warning: " in lenient.stdout
    strict = run_cli("validate", "--strict", str(root), timeout=120, check=False)
    assert strict.returncode == 1 and "6 problems" in strict.stdout
