"""Loading the release layout into records, exactly as released, reading only the selected users."""

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from personalens.data import (
    DOMAINS,
    SUBSETS,
    DataError,
    list_user_indices,
    load_scenarios,
    load_task_definitions,
    load_user,
)


def _raw(root: Path, index: int, name: str) -> dict:
    return json.loads((root / "profile" / f"user{index}" / name).read_text())


def _user_dirs(root: Path) -> list[int]:
    return sorted(int(p.name[4:]) for p in (root / "profile").iterdir())


@pytest.fixture(params=["sample", "excerpt"])
def data_root(request, sample_root) -> Path:
    return sample_root if request.param == "sample" else request.getfixturevalue("shared_data_root")


def test_scenarios_match_the_files_in_order(data_root):
    scenarios = load_scenarios(data_root)
    expected = []
    for index in _user_dirs(data_root):
        for name in ("tasks.json", "tasks_md.json"):
            expected += [(index, entry) for entry in _raw(data_root, index, name).values()]
    assert len(scenarios) == len(expected)
    for scenario, (index, entry) in zip(scenarios, expected):
        task = scenario.task
        assert (scenario.user.index, scenario.user.user_id) == (index, f"user{index}")
        assert task.task_id == entry["task_id"]
        assert task.kind == entry["task_id"][:2]
        assert (task.description, task.user_intent, task.goal) == (
            entry["Task Description"],
            entry["User Intent"],
            entry["Task Goal"],
        )
        assert task.domains == tuple(entry["Relevant Domains"])
        assert task.affinity_types == tuple(entry["Relevant Affinity Types"])
        assert dict(scenario.situation.items()) == entry["situations"]


def test_profile_keeps_release_values_and_order(data_root):
    for index in _user_dirs(data_root):
        raw = _raw(data_root, index, "profile.json")
        user = load_user(data_root, index)
        assert user.user_id == raw["demographics"]["user_id"] == f"user{index}"
        assert list(user.demographics.items()) == [(k, v) for k, v in raw["demographics"].items() if k != "user_id"]
        assert dict(user.interests) == raw["interests"]
        assert dict(user.interactions) == raw["interactions"]
        for domain, prefs in raw["affinities"].items():
            assert list(user.affinities[domain]) == list(prefs)
            for name, value in prefs.items():
                loaded = user.affinities[domain][name]
                assert loaded == (tuple(value) if isinstance(value, list) else value)


def test_task_definitions_cover_every_line(data_root):
    definitions = load_task_definitions(data_root)
    lines = {}
    for path in (data_root / "task").glob("*/task.jsonl"):
        for line in path.read_text().splitlines():
            if line.strip():
                number = json.loads(line)["Task Number"]
                domain = path.parent.name
                task_id = f"MD-task-{number}" if domain == "Multi-Domain" else f"SD-{domain}-task-{number}"
                lines[task_id] = domain
    assert set(definitions) == set(lines)
    for task_id, domain in lines.items():
        task = definitions[task_id]
        assert task.kind == ("MD" if domain == "Multi-Domain" else "SD")
        if task.kind == "SD":
            assert task.domains == (domain,)
        else:
            assert len(task.domains) >= 2 and set(task.domains) <= set(DOMAINS)


def test_domain_with_a_space_is_read(shared_data_root):
    task = load_task_definitions(shared_data_root)["SD-Rental Cars-task-1"]
    assert task.domains == ("Rental Cars",)


def test_scenarios_share_one_task_object_per_id(sample_root):
    by_id = {}
    for scenario in load_scenarios(sample_root):
        assert by_id.setdefault(scenario.task.task_id, scenario.task) is scenario.task


@pytest.mark.parametrize("kinds, expected", [("SD", {"SD"}), ("MD", {"MD"}), ("both", {"SD", "MD"})])
def test_kinds_select_task_kinds(sample_root, kinds, expected):
    both = load_scenarios(sample_root, kinds="both")
    chosen = load_scenarios(sample_root, kinds=kinds)
    assert {s.task.kind for s in chosen} == expected
    assert [s.key for s in chosen] == [s.key for s in both if s.task.kind in expected]


def test_range_selection_loads_only_those_users(sample_root):
    scenarios = load_scenarios(sample_root, users="2-3")
    assert {s.user.index for s in scenarios} == {2, 3}
    assert [s.key for s in scenarios] == [s.key for s in load_scenarios(sample_root) if s.user.index in (2, 3)]


def test_list_user_indices_sorts_numerically(tmp_path):
    for index in (10, 2, 1):
        (tmp_path / "profile" / f"user{index}").mkdir(parents=True)
    (tmp_path / "profile" / "notes").mkdir()
    assert list_user_indices(tmp_path) == [1, 2, 10]


def test_missing_selected_user_names_the_directory(sample_root):
    with pytest.raises(DataError, match=r"profile/user99\b"):
        load_scenarios(sample_root, users=[0, 99])
    with pytest.raises(DataError, match=r"profile/user7\b"):
        load_scenarios(sample_root, users="sample30")
    with pytest.raises(DataError, match=r"profile/user42\b"):
        load_user(sample_root, 42)


def test_missing_root_and_layout_are_data_errors(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        load_scenarios(tmp_path / "nowhere")
    with pytest.raises(DataError, match="profile/"):
        load_scenarios(tmp_path)


def test_malformed_file_raises_data_error_with_file_and_line(sample_root, tmp_path):
    root = tmp_path / "data"
    shutil.copytree(sample_root, root)
    tasks = root / "profile" / "user1" / "tasks.json"
    lines = tasks.read_text().splitlines()
    lines[2] += ","  # a doubled comma on line 3
    tasks.write_text("\n".join(lines))
    with pytest.raises(DataError, match=r"profile/user1/tasks\.json: line 3 column \d+: malformed JSON"):
        load_scenarios(root, users=[1])
    load_scenarios(root, users=[0, 2])  # the broken user is not read


def test_missing_field_raises_data_error_with_field_path(sample_root, tmp_path):
    root = tmp_path / "data"
    shutil.copytree(sample_root, root)
    path = root / "profile" / "user0" / "tasks_md.json"
    tasks = json.loads(path.read_text())
    del tasks["Task 2"]["situations"]["Environment"]
    path.write_text(json.dumps(tasks))
    with pytest.raises(DataError) as caught:
        load_scenarios(root, users=[0])
    assert 'profile/user0/tasks_md.json: "Task 2"."situations"."Environment": missing' in str(caught.value)


class _Opens:
    """Records the paths the process opens or lists (audit hooks cannot be removed, so it is switched)."""

    def __init__(self):
        self.active = False
        self.paths: list[tuple[str, str]] = []
        sys.addaudithook(self)

    def __call__(self, event, args):
        if self.active and event in ("open", "os.scandir", "os.listdir") and args and args[0] is not None:
            self.paths.append((event, os.fsdecode(args[0]) if not isinstance(args[0], int) else ""))


@pytest.fixture(scope="session")
def opens():
    return _Opens()


def test_selecting_50_of_1500_users_reads_only_those(sample_root, tmp_path, opens):
    root = tmp_path / "data"
    shutil.copytree(sample_root / "task", root / "task")
    selected = set(SUBSETS["sample50"])
    for index in range(1500):
        folder = root / "profile" / f"user{index}"
        folder.mkdir(parents=True)
        if index not in selected:  # unreadable if ever opened
            for name in ("profile.json", "tasks.json", "tasks_md.json"):
                (folder / name).write_text("{ not json")
            continue
        model = sample_root / "profile" / f"user{index % 6}"
        profile = json.loads((model / "profile.json").read_text())
        profile["demographics"]["user_id"] = f"user{index}"
        (folder / "profile.json").write_text(json.dumps(profile))
        for name in ("tasks.json", "tasks_md.json"):
            shutil.copy(model / name, folder / name)

    opens.paths.clear()
    opens.active = True
    try:
        scenarios = load_scenarios(root, users="sample50")
    finally:
        opens.active = False

    assert sorted({s.user.index for s in scenarios}) == sorted(selected)
    profile_dir = str(root / "profile")
    touched = {Path(p).relative_to(profile_dir).parts[0] for _, p in opens.paths if p.startswith(profile_dir + os.sep)}
    assert touched == {f"user{i}" for i in selected}
    assert not [p for event, p in opens.paths if event != "open" and p.rstrip(os.sep) == profile_dir]


def test_sample_dataset_has_the_promised_shape(sample_root):
    users = _user_dirs(sample_root)
    assert users == list(range(6))
    used_domains = set()
    for index in users:
        profile = _raw(sample_root, index, "profile.json")
        assert set(profile["affinities"]) == set(profile["interactions"]) == set(DOMAINS)
        assert all(300 <= len(text) <= 600 for text in profile["interactions"].values())
        values = [v for prefs in profile["affinities"].values() for v in prefs.values()]
        assert any(isinstance(v, list) for v in values) and any(isinstance(v, str) for v in values)
        sd, md = _raw(sample_root, index, "tasks.json"), _raw(sample_root, index, "tasks_md.json")
        assert 3 <= len(sd) <= 4 and len(md) == 2
        used_domains |= {d for entry in [*sd.values(), *md.values()] for d in entry["Relevant Domains"]}
    assert len(used_domains) >= 8
    assert len({tuple(_raw(sample_root, i, "profile.json")["demographics"].values()) for i in users}) == 6
