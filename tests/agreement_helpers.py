"""A run directory built by hand from the sample data's real scenarios, in the store's own schemas."""

from __future__ import annotations

from pathlib import Path

from run_rows import dialogue_row, judgment_row

from personalens.data import load_scenarios
from personalens.store import DIALOGUE_SCHEMA, JUDGMENT_SCHEMA, PartWriter, shard_dir

SECRET = "JUDGE-EXPLANATION-NEVER-SHOWN"
# (dimension, speaker) of every whole-dialogue judgment
JUDGED = (
    ("task_completion", ""),
    ("personalization", ""),
    ("naturalness", "user"),
    ("naturalness", "assistant"),
    ("coherence", "user"),
    ("coherence", "assistant"),
)


def sample_dialogue(scenario, setting: str = "base") -> dict:
    user_id, task_id = scenario.key
    turns = [
        {"role": role, "text": f"{role} turn {k} of {user_id}/{task_id}", "prompt_tokens": 3, "completion_tokens": 4}
        for k, role in enumerate(("user", "assistant") * 2)
    ]
    return dialogue_row(
        user_id,
        task_id,
        scenario.task.kind,
        scenario.task.domains,
        user_index=scenario.user.index,
        setting=setting,
        seed=1,
        turns=turns,
        run_id="hand",
    )


def write_sample_run(run_dir: Path, sample_root: Path, score) -> list[dict]:
    """Every sample scenario as a dialogue, judged with `score(index, dimension, speaker)`; two shards."""
    dialogues = [sample_dialogue(s) for s in load_scenarios(sample_root, "all", "both")]
    judgments = [
        judgment_row(d, dim, score(i, dim, spk), speaker=spk, text=f"{SECRET} {dim}")
        for i, d in enumerate(dialogues)
        for dim, spk in JUDGED
    ]
    for k in range(2):
        PartWriter(shard_dir(run_dir, "dialogues", k, 2), DIALOGUE_SCHEMA).write(dialogues[k::2])
        PartWriter(shard_dir(run_dir, "judgments", k, 2), JUDGMENT_SCHEMA).write(judgments[k::2])
    return dialogues
