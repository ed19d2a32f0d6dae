"""`personalens stats`: Table 1, Tables 6-9 and Figure 3, against counts taken straight from the JSON files."""

from __future__ import annotations

import csv
import io
import json
import math
import shutil
from collections import Counter
from pathlib import Path

import pytest
from cli_helpers import run_cli

from personalens.data.records import DOMAINS
from personalens.data.schema import SchemaError
from personalens.tables import render
from personalens.validation.pipeline import build_stats
from personalens.validation.regions import region_of

SCHEMA = Path(__file__).resolve().parents[2] / "shared" / "official-code" / "res" / "schema.json"
PAPER_ORDER = [
    "age",
    "gender",
    "ethnicity",
    "religion",
    "employment_status",
    "education",
    "marital_status",
    "english_proficiency",
]


@pytest.fixture(scope="module")
def schema_path() -> Path:
    if not SCHEMA.is_file():
        pytest.skip(f"the release's affinity schema is not at {SCHEMA} (it is not part of the repository)")
    return SCHEMA


def _profiles(root: Path) -> dict[str, dict]:
    return {d.name: json.loads((d / "profile.json").read_text()) for d in sorted((root / "profile").iterdir())}


def _rows(table) -> dict[tuple[str, ...], tuple]:
    return {labels: cells for labels, cells in table.rows}


def _evenness(counts: Counter) -> float:
    total = sum(counts.values())
    h = -sum(c / total * math.log(c / total) for c in counts.values())
    return h / math.log(len(counts))


@pytest.fixture(scope="module")
def excerpt_stats(shared_data_root, schema_path, tmp_path_factory):
    return build_stats(shared_data_root, "all", schema_path, tmp_path_factory.mktemp("stats"))


def test_table1_counts_tasks_and_dialogues_per_domain(shared_data_root, excerpt_stats):
    tasks, dialogues, totals = Counter(), Counter(), Counter()
    for path in (shared_data_root / "task").glob("*/task.jsonl"):
        for line in path.read_text().splitlines():
            if line.strip():
                obj = json.loads(line)
                domains = obj.get("Relevant Domains", [path.parent.name])
                tasks.update(domains)
                totals["MD" if path.parent.name == "Multi-Domain" else "SD", "tasks"] += 1
    for user in (shared_data_root / "profile").iterdir():
        for kind, name in (("SD", "tasks.json"), ("MD", "tasks_md.json")):
            for task in json.loads((user / name).read_text()).values():
                dialogues.update(task["Relevant Domains"])
                totals[kind, "dialogues"] += 1
    rows = _rows(excerpt_stats.tables[0])
    assert excerpt_stats.tables[0].name == "table1"
    assert [labels[0] for labels in rows] == [*DOMAINS, "Total SD", "Total MD"]
    for domain in DOMAINS:
        assert rows[(domain,)] == (tasks[domain], dialogues[domain]), domain
    assert rows[("Total SD",)] == (totals["SD", "tasks"], totals["SD", "dialogues"]) == (86, 206)
    assert rows[("Total MD",)] == (totals["MD", "tasks"], totals["MD", "dialogues"])


def test_tables6_7_count_demographics_in_order_of_frequency(shared_data_root, excerpt_stats):
    demographics = [p["demographics"] for p in _profiles(shared_data_root).values()]
    table6, table7 = excerpt_stats.tables[1:3]
    rows = {**_rows(table6), **_rows(table7)}
    assert rows[("Total Participants", "")] == (len(demographics), 100.0)
    labels = {
        key: label
        for key, label in zip(
            PAPER_ORDER,
            [
                "Age",
                "Gender",
                "Self-Reported Ethnicity",
                "Self-Reported Religion",
                "Employment Status",
                "Education",
                "Marital Status",
                "English Proficiency",
            ],
        )
    }
    shown = [labels for labels, _ in table6.rows[1:] + table7.rows[1:]]
    for key, label in labels.items():
        counts = Counter("Prefer not to say" if d[key] == "N/A" else d[key] for d in demographics)
        values = [value for variable, value in shown if variable == label]
        assert sorted(values) == sorted(counts)
        frequencies = [counts[v] for v in values if v != "Prefer not to say"]
        assert frequencies == sorted(frequencies, reverse=True)
        if "Prefer not to say" in counts:
            assert values[-1] == "Prefer not to say"  # listed last, as the paper does
        for value, count in counts.items():
            assert rows[(label, value)] == (count, pytest.approx(100 * count / len(demographics)))
    # user0 withholds ethnicity and religion: the release's N/A
    assert rows[("Self-Reported Ethnicity", "Prefer not to say")][0] >= 1
    regions = Counter(region_of(d["birth_country"]) for d in demographics)
    assert {v: rows[("Regions", v)][0] for v in regions} == dict(regions)
    assert rows[("Regions", "Northern America")][0] == sum(d["birth_country"] == "Canada" for d in demographics)
    assert [v for var, v in shown if var == "Regions"][: len(regions)] == sorted(regions, key=lambda r: -regions[r])


def test_tables8_9_count_preferences_of_all_users(shared_data_root, schema_path, excerpt_stats):
    schema = json.loads(schema_path.read_text())
    profiles = list(_profiles(shared_data_root).values())
    rows = {**_rows(excerpt_stats.tables[3]), **_rows(excerpt_stats.tables[4])}
    assert len(rows) == sum(len(d["affinities"]) for d in schema)
    for domain in schema:
        for a in domain["affinities"]:
            counts = Counter()
            for p in profiles:  # every user, also those whose interest in the domain is 0
                value = p["affinities"][domain["domain"]][a["name"]]
                counts.update([value] if isinstance(value, str) else value)
            mark = "✓" if a["is_categorical"] else "✗"
            possible, generated, distinct, outside, even = rows[(domain["domain"], a["name"], mark)]
            assert distinct == len(counts)
            if a["is_categorical"]:
                assert possible == len(a["possible_values"])
                assert generated == min(len(counts), len(a["possible_values"]))
                assert outside == len(set(counts) - set(a["possible_values"]))
            else:
                assert (possible, generated, outside) == (None, len(counts), None)
            if len(counts) > 1:
                assert even == pytest.approx(_evenness(counts))
            else:
                assert math.isnan(even)
    # user1 is not interested in Books, and still counts there
    assert json.loads((shared_data_root / "profile" / "user1" / "profile.json").read_text())["interests"]["Books"] == 0


def test_outputs_are_written_with_the_report_renderers(excerpt_stats):
    names = {p.name for p in excerpt_stats.files}
    for table in ("table1", "table6", "table7", "table8", "table9"):
        assert {f"{table}.md", f"{table}.csv", f"{table}.tex"} <= names
    assert {"figure3.png", "stats.md"} <= names
    folder = excerpt_stats.files[0].parent
    assert (folder / "figure3.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table6 = excerpt_stats.tables[1]
    assert (folder / "table6.md").read_text() == render.markdown([table6])
    rows = list(csv.DictReader(io.StringIO((folder / "table6.csv").read_text())))
    assert rows[0] == {"variable": "Total Participants", "value": "", "count": "3", "percent": "100.0"}
    assert r"\begin{tabular}" in (folder / "table8.tex").read_text()


def test_evenness_and_generated_values_on_a_hand_made_dataset(shared_data_root, schema_path, tmp_path):
    root = tmp_path / "data"
    shutil.copytree(shared_data_root, root)
    # Alarm Sound Preference (4 possible): 3x gentle nature, 1x loud beeping, 1x a value outside the schema.
    # Alarm Recurring Preference (3 possible): 4 distinct values, one outside the schema.
    sound = {"user0": "gentle nature", "user1": ["gentle nature", "loud beeping"], "user2": ["gentle nature", "buzz"]}
    recurring = {"user0": ["weekdays", "monthly"], "user1": ["weekends"], "user2": "everyday"}
    for user in sound:
        path = root / "profile" / user / "profile.json"
        profile = json.loads(path.read_text())
        profile["affinities"]["Alarm"]["Alarm Sound Preference"] = sound[user]
        profile["affinities"]["Alarm"]["Alarm Recurring Preference"] = recurring[user]
        path.write_text(json.dumps(profile))
    result = build_stats(root, "all", schema_path, tmp_path / "out")
    rows = _rows(result.tables[3])
    h = -(0.6 * math.log(0.6) + 2 * 0.2 * math.log(0.2))
    assert rows[("Alarm", "Alarm Sound Preference", "✓")] == (4, 3, 3, 1, pytest.approx(h / math.log(3)))
    assert rows[("Alarm", "Alarm Recurring Preference", "✓")] == (3, 3, 4, 1, pytest.approx(1.0))


def test_selection_and_missing_schema(shared_data_root, schema_path, tmp_path):
    # the excerpt has no res/ beside it: Tables 8-9 are skipped with a message, the others still computed
    result = build_stats(shared_data_root, "0-1", None, tmp_path / "a")
    assert [t.name for t in result.tables] == ["table1", "table6", "table7"]
    assert len(result.messages) == 1 and "res/schema.json" in result.messages[0]
    assert "stats.schema" in result.messages[0] and "Tables 8-9 skipped" in result.markdown()
    assert _rows(result.tables[1])[("Total Participants", "")][0] == 2
    # beside data/, as in a clone of the official repository, it is found without being named
    clone = tmp_path / "clone"
    shutil.copytree(shared_data_root, clone / "data")
    (clone / "res").mkdir()
    shutil.copy(schema_path, clone / "res" / "schema.json")
    assert [t.name for t in build_stats(clone / "data", [2], None, tmp_path / "b").tables][-2:] == ["table8", "table9"]
    with pytest.raises(SchemaError, match="cannot read the schema"):
        build_stats(shared_data_root, "all", tmp_path / "nowhere.json", tmp_path / "c")
    (tmp_path / "bad.json").write_text('{"domain": 1}')
    with pytest.raises(SchemaError, match="expected a list of domain objects"):
        build_stats(shared_data_root, "all", tmp_path / "bad.json", tmp_path / "d")


def test_regions_come_from_the_country_of_birth():
    assert region_of("United States") == "US" and region_of("United Kingdom") == "UK"
    assert region_of("Canada") == "Northern America" and region_of("Mexico") == "Latin America and the Caribbean"
    assert region_of("New Zealand") == "Australia and New Zealand" and region_of("Fiji") == "Oceania"
    assert region_of("N/A") == region_of("Prefer not to say") == "Prefer not to say"
    assert region_of("Atlantis") == "Other"


def test_cli_prints_the_tables(shared_data_root, schema_path, tmp_path):
    proc = run_cli(
        "stats", str(shared_data_root), f"stats.schema={schema_path}", f"stats.out_dir={tmp_path}", timeout=120
    )
    for title in ("Table 1", "Table 6", "Table 7", "Table 8", "Table 9"):
        assert f"### {title}:" in proc.stdout
    assert "| Total SD | 86 | 206 |" in proc.stdout
    assert (tmp_path / "stats.md").is_file()
    bad = run_cli("stats", str(shared_data_root), f"stats.schema={tmp_path}/none.json", timeout=120, check=False)
    assert bad.returncode == 2 and "personalens stats: error:" in bad.stderr
