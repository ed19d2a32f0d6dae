"""`personalens judge` killed with SIGKILL mid-batch, then run again: every judgment present exactly
once, those written before the kill kept as they were; then the run re-judged by a second judge (the
embedded model at another temperature), killed and resumed too: only its rows are added, and the
report gives Table 3 under each judge and their agreement (through the real CLI and vLLM)."""

from __future__ import annotations

import csv
from collections import Counter

import pytest
from cli_helpers import ENGINE_CORE_HERE, kill_once, read_rows, run_cli, start_cli
from run_rows import dialogue_row

from personalens.data import load_scenarios
from personalens.store import DIALOGUE_SCHEMA, PartWriter, shard_dir

pytestmark = pytest.mark.vllm

# per dialogue: task completion, personalization, naturalness and coherence of each of the 2 speakers
PER_DIALOGUE = 6


def judgment_keys(rows: list[dict]) -> list[tuple]:
    return [
        (r["user_id"], r["task_id"], r["setting"], r["trial"], r["dimension"], r["speaker"], r["turn"]) for r in rows
    ]


def one_round_dialogues(sample_root, out) -> list[dict]:
    """The 4 single-domain dialogues of user0, one short round each, written as `generate` writes
    them (the judge under test needs dialogues, not a second engine start to make them)."""
    turns = [
        {
            "role": "user",
            "text": "Can you help me book a table for two tonight?",
            "prompt_tokens": 9,
            "completion_tokens": 9,
        },
        {"role": "assistant", "text": "Of course. Which time and cuisine?", "prompt_tokens": 9, "completion_tokens": 8},
    ]
    rows = [
        dialogue_row(s.user.user_id, s.task.task_id, s.task.kind, list(s.task.domains), turns=turns)
        for s in load_scenarios(sample_root, users="0", kinds="SD")
    ]
    PartWriter(shard_dir(out, "dialogues", 0, 1), DIALOGUE_SCHEMA).write(rows)
    return rows


def test_a_killed_judge_resumes_with_every_judgment_present_exactly_once(sample_root, tmp_path):
    out = tmp_path / "run"
    common = ["data.users=0", "data.kinds=SD", "protocol=quick", f"run.out_dir={out}", "progress=false"]
    dialogues = one_round_dialogues(sample_root, out)
    assert len(read_rows(out / "dialogues")) == len(dialogues) == 4
    expected = len(dialogues) * PER_DIALOGUE

    # 6 judgments per generate call: 4 part files; killed once the first is on disk
    args = ["judge", *common, "judging.chunk=6"]
    folder = out / "judgments"
    proc = start_cli(*args, log=tmp_path / "first.log", env=ENGINE_CORE_HERE)
    kill_once(proc, lambda: any(folder.rglob("part-*.parquet")), tmp_path / "first.log")
    parts_before = {p: p.read_bytes() for p in folder.rglob("part-*.parquet")}
    before = read_rows(folder)
    assert before and len(before) < expected, f"{len(before)} of {expected} judged before the kill"
    assert len(before) % 6 == 0  # whole chunks only: a part is renamed into place once complete

    resumed = run_cli(*args, env=ENGINE_CORE_HERE)
    after = read_rows(folder)
    counts = Counter(judgment_keys(after))
    assert len(after) == expected and max(counts.values()) == 1
    ids = {(d["user_id"], d["task_id"], d["setting"], d["trial"]) for d in dialogues}
    assert {k[:4] for k in counts} == ids
    assert Counter(k[4] for k in counts) == Counter(
        {"task_completion": 4, "personalization": 4, "naturalness": 8, "coherence": 8}
    )
    # the judgments written before the kill were not judged again: their parts are untouched and
    # the resumed run judged only the rest
    assert all(p.read_bytes() == data for p, data in parts_before.items())
    assert f"judge: {expected - len(before)} judgments in" in resumed.stderr + (out / "logs" / "judge.log").read_text(
        errors="replace"
    )
    assert "Traceback" not in resumed.stderr

    # re-judged by a second judge: the first judge's parts stay as they are, the new one's rows are
    # added under its own key, and a kill of the re-judge loses nothing when it runs again
    parts_first = {p: p.read_bytes() for p in folder.rglob("part-*.parquet")}
    panel = [*args, "judges=[{name: warm, sampling: {temperature: 0.8}}]"]
    proc = start_cli(*panel, log=tmp_path / "rejudge.log", env=ENGINE_CORE_HERE)
    kill_once(proc, lambda: len(list(folder.rglob("part-*.parquet"))) > len(parts_first), tmp_path / "rejudge.log")
    killed = read_rows(folder)
    assert expected < len(killed) < 2 * expected
    run_cli(*panel, env=ENGINE_CORE_HERE)
    rows = read_rows(folder)
    assert all(p.read_bytes() == data for p, data in parts_first.items())
    keys = Counter(r["judge_key"] for r in rows)
    assert len(keys) == 2 and set(keys.values()) == {expected}
    assert Counter((r["judge_key"], *k) for r, k in zip(rows, judgment_keys(rows))).most_common(1)[0][1] == 1
    assert (out / "judge-warm.yaml").is_file()

    run_cli("report", str(out), "report.bootstrap=200", "progress=false")
    md = (out / "report" / "report.md").read_text()
    assert "Table 3 under judge judge (SmolLM2-135M-Instruct)" in md and "Table 3 under judge warm" in md
    with open(out / "report" / "judge_agreement.csv") as f:
        agreement = list(csv.DictReader(f))
    assert len(agreement) == 6 and all(int(r["kappa_n"]) > 0 for r in agreement)
