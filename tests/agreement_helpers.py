"""A run directory built by hand from the sample data's real scenarios, in the store's own schemas."""

from __future__ import annotations

from pathlib import Path

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


def dialogue_row(scenario, setting: str = "base") -> dict:
    user_id, task_id = scenario.key
    turns = [
        {"role": role, "text": f"{role} turn {k} of {user_id}/{task_id}", "prompt_tokens": 3, "completion_tokens": 4}
        for k, role in enumerate(("user", "assistant") * 2)
    ]
    return {
        "run_id": "hand",
        "user_id": user_id,
        "user_index": scenario.user.index,
        "task_id": task_id,
        "kind": scenario.task.kind,
        "domains": list(scenario.task.domains),
        "setting": setting,
        "trial": 0,
        "assistant_model": "m",
        "user_model": "u",
        "seed": 1,
        "turns": turns,
        "rounds": 2,
        "ended": "terminated",
        "opening_terminate": False,
        "seconds": 1.0,
        "config_hash": "h",
    }


def judgment_row(d: dict, dimension: str, speaker: str, score: float | None, turn: int = -1) -> dict:
    ids = {
        k: d[k]
        for k in (
            "run_id",
            "user_id",
            "user_index",
            "task_id",
            "kind",
            "domains",
            "setting",
            "trial",
            "assistant_model",
            "user_model",
        )
    }
    return {
        **ids,
        "dimension": dimension,
        "speaker": speaker,
        "turn": turn,
        "score": score,
        "parsed": score is not None,
        "judge_text": f"{SECRET} {dimension}",
        "judge_model": "j",
        "prompt_hash": "p",
    }


def write_sample_run(run_dir: Path, sample_root: Path, score) -> list[dict]:
    """Every sample scenario as a dialogue, judged with `score(index, dimension, speaker)`; two shards."""
    dialogues = [dialogue_row(s) for s in load_scenarios(sample_root, "all", "both")]
    judgments = [judgment_row(d, dim, spk, score(i, dim, spk)) for i, d in enumerate(dialogues) for dim, spk in JUDGED]
    for k in range(2):
        PartWriter(shard_dir(run_dir, "dialogues", k, 2), DIALOGUE_SCHEMA).write(dialogues[k::2])
        PartWriter(shard_dir(run_dir, "judgments", k, 2), JUDGMENT_SCHEMA).write(judgments[k::2])
    return dialogues
