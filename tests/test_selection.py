"""The `data.users` / `data.kinds` specs."""

import pytest
from omegaconf import OmegaConf

from personalens.data import SUBSETS, DataError, task_kinds, user_indices


def test_all_means_every_user():
    assert user_indices("all") is None


@pytest.mark.parametrize("name, size", [("sample30", 30), ("sample50", 50), ("sample100", 100)])
def test_named_subsets(name, size):
    indices = user_indices(name)
    assert indices == SUBSETS[name]
    assert len(set(indices)) == size and list(indices) == sorted(indices)
    assert all(0 <= i < 1500 for i in indices)


def test_subsets_nest():
    # The paper's subsets grow by adding users; a typo in one list breaks this.
    assert set(SUBSETS["sample30"]) < set(SUBSETS["sample50"]) < set(SUBSETS["sample100"])


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("0-9", tuple(range(10))),
        ("3-3", (3,)),
        (" 2 - 4 ", (2, 3, 4)),
        ("0-2,7", (0, 1, 2, 7)),
        ("5", (5,)),
        (7, (7,)),
        ([53, 7, 7], (7, 53)),
        ((1, 0), (0, 1)),
    ],
)
def test_ranges_and_lists(spec, expected):
    assert user_indices(spec) == expected


def test_hydra_list_config_is_a_list():
    assert user_indices(OmegaConf.create([12, 3])) == (3, 12)


@pytest.mark.parametrize(
    "spec, message",
    [
        ("sample51", "sample51"),
        ("9-0", "ends before it starts"),
        ("a-b", "'a-b'"),
        ("1-", "'1-'"),
        ("", "index range"),
        ([1, "x"], "not a list of user indices"),
        ([-1], "not a list of user indices"),
        ([True], "not a list of user indices"),
        ([], "not a list of user indices"),
        ({"a": 1}, "cannot read"),
        (3.5, "cannot read"),
        (-2, "cannot read"),
    ],
)
def test_bad_user_specs_are_data_errors(spec, message):
    with pytest.raises(DataError, match="data.users") as caught:
        user_indices(spec)
    assert message in str(caught.value)


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("both", ("SD", "MD")),
        ("SD", ("SD",)),
        ("md", ("MD",)),
    ],
)
def test_kinds(spec, expected):
    assert task_kinds(spec) == expected


@pytest.mark.parametrize("spec", ["all", "", None, ["SD"]])
def test_bad_kinds_are_data_errors(spec):
    with pytest.raises(DataError, match="data.kinds"):
        task_kinds(spec)
