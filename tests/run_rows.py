"""Rows of a run's dialogue and judgment tables, built by hand in the store's own schemas."""

from __future__ import annotations

from personalens.store.schema import ID_FIELDS

ID_NAMES = [name for name, _ in ID_FIELDS]


def dialogue_row(
    user_id: str,
    task_id: str,
    kind: str,
    domains: list[str],
    *,
    user_index: int | None = None,
    setting: str = "base",
    trial: int = 0,
    seed: int = 0,
    turns: list[dict] = (),
    model: str = "m",
    run_id: str = "run",
) -> dict:
    return {
        "run_id": run_id,
        "user_id": user_id,
        "user_index": int(user_id.removeprefix("user")) if user_index is None else user_index,
        "task_id": task_id,
        "kind": kind,
        "domains": list(domains),
        "setting": setting,
        "trial": trial,
        "assistant_model": model,
        "user_model": "u",
        "seed": seed,
        "turns": list(turns),
        "rounds": len(turns) // 2,
        "ended": "terminated",
        "opening_terminate": False,
        "seconds": 1.0,
        "config_hash": "h",
    }


def judgment_row(
    dialogue: dict, dimension: str, score: float | None, *, speaker: str = "", turn: int = -1, text: str = "..."
) -> dict:
    """One judgment of `dialogue`: its identifying columns copied, `score` None for a parse failure."""
    return {
        **{name: dialogue[name] for name in ID_NAMES},
        "dimension": dimension,
        "speaker": speaker,
        "turn": turn,
        "score": score,
        "parsed": score is not None,
        "judge_text": text,
        "judge_model": "j",
        "prompt_hash": "p",
    }
