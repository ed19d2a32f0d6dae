"""What a finished run measured, for estimating a larger one (`plan.calibrate=<run dir>`): from its
dialogues (turns per dialogue, reply and prompt tokens of every turn, and a reasoning model's
thinking tokens of them), its judgments, the summary each generate and judge invocation wrote
(seconds, prefix-cache hits; store/summaries.py), and the spec-decode counters of its speculative
models where it recorded them (plan/speculative.py).

A reply's tokens are all it generated, its thinking included, so the time a run takes counts the
thinking; what a reply adds to later prompts is its answer alone (engines/chat/reasoning.py)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from personalens.errors import PersonalensError
from personalens.plan.budget import Turns, fit_history, role_of, spread
from personalens.plan.prompt_tokens import ScenarioTokens
from personalens.plan.speculative import SpecDecode, read_spec_decode
from personalens.store import read_summaries, read_table


@dataclass(frozen=True)
class Throughput:
    """Summed summaries of one command."""

    runs: int  # invocations (shards, resumes)
    items: int  # dialogues or judgments
    seconds: float
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int

    @property
    def tokens_per_s(self) -> float | None:
        return self.completion_tokens / self.seconds if self.seconds > 0 else None

    @property
    def cached_share(self) -> float | None:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else None

    def as_dict(self) -> dict:
        return dict(vars(self), tokens_per_s=self.tokens_per_s, cached_share=self.cached_share)


@dataclass(frozen=True)
class Calibration:
    run_dir: str
    dialogues: Sequence[dict]  # user_id, user_index, task_id, kind, turns (role, prompt and completion tokens)
    judgments: int
    generate: Throughput | None
    judge: Throughput | None
    judge_thinking: float | None = None  # a reasoning judge's thinking tokens per judgment, where counted
    # per model name, vLLM's spec-decode counters over the run, where it recorded them (plan/speculative.py)
    spec_decode: Mapping[str, SpecDecode] = field(default_factory=dict)

    def turn_counts(self) -> dict[str, dict[int, float]]:
        """kind -> share of dialogues with each number of turns."""
        out = {}
        for kind in dict.fromkeys(d["kind"] for d in self.dialogues):
            counts = Counter(len(d["turns"]) for d in self.dialogues if d["kind"] == kind)
            total = sum(counts.values())
            out[kind] = {n: c / total for n, c in sorted(counts.items())}
        return out

    def replies(self, role: str) -> list[int]:
        """The measured completion tokens of every reply of `role`."""
        return [t["completion_tokens"] for d in self.dialogues for t in d["turns"] if t["role"] == role]

    def reply(self) -> dict[str, float]:
        """role -> measured completion tokens per reply."""
        out = {}
        for role in ("user", "assistant"):
            replies = self.replies(role)
            out[role] = sum(replies) / len(replies) if replies else 0.0
        return out

    def thinking(self) -> dict[str, float | None]:
        """role -> measured thinking tokens per reply, over the replies whose thinking was counted
        (None: none was: no reasoning model, or a run written before thinking was stored)."""
        out = {}
        for role in ("user", "assistant"):
            counted = [
                t["reasoning_tokens"]
                for d in self.dialogues
                for t in d["turns"]
                if t["role"] == role and t.get("reasoning_tokens") is not None
            ]
            out[role] = sum(counted) / len(counted) if counted else None
        return out

    def answer(self) -> dict[str, float]:
        """role -> measured tokens per reply less its measured thinking: what a reply adds to a later
        prompt besides its chat markup."""
        thinking = self.thinking()
        return {role: tokens - (thinking[role] or 0.0) for role, tokens in self.reply().items()}

    def totals(self) -> dict[str, int]:
        turns = [t for d in self.dialogues for t in d["turns"]]
        return {
            "dialogues": len(self.dialogues),
            "turns": len(turns),
            "prompt_tokens": sum(t["prompt_tokens"] for t in turns),
            "completion_tokens": sum(t["completion_tokens"] for t in turns),
            "first_prompt_tokens": sum(d["turns"][0]["prompt_tokens"] for d in self.dialogues if d["turns"]),
        }

    def history(self, fixed: Mapping[tuple[str, str], ScenarioTokens]) -> float | None:
        """Prompt tokens an earlier turn adds, fitted on the dialogues whose fixed parts are known."""
        points = []
        for d in self.dialogues:
            parts = fixed.get((d["user_id"], d["task_id"]))
            if parts is None:
                continue
            for t, turn in enumerate(d["turns"][1:], start=2):
                own = parts.user_next if role_of(t) == "user" else parts.assistant
                points.append((t, turn["prompt_tokens"], own))
        return fit_history(points)

    def turns(self, kind: str, history: float) -> Turns | None:
        counts = self.turn_counts().get(kind)
        if counts is None:
            return None
        spreads = {role: spread(self.replies(role)) for role in ("user", "assistant")}
        return Turns(counts, self.reply(), history, f"measured by {self.run_dir}", spreads)

    def context_ended(self, planned: Mapping[str, int], ending: str = "context") -> dict[str, dict]:
        """kind -> its dialogues that ended on `ending` (context; thinking: a reply stopped inside its
        thinking) in this run, and what that share makes of the `planned` dialogues of the kind (runs
        written before endings were recorded: none known)."""
        out = {}
        for kind, n in planned.items():
            of_kind = [d for d in self.dialogues if d["kind"] == kind]
            known = [d for d in of_kind if d.get("ended") is not None]
            if not known:
                continue
            ended = sum(d["ended"] == ending for d in known)
            out[kind] = {"measured": ended, "of": len(known), "expected": round(ended / len(known) * n), "planned": n}
        return out

    def ended_at(self, max_model_len: int, room: Mapping[str, int]) -> float | None:
        """The share of this run's dialogues that would end on context at `max_model_len`: a turn's
        prompt leaves less than its role's `room` for the reply (None: no dialogue)."""
        if not self.dialogues:
            return None
        roles = {"user": "user_agent", "assistant": "assistant"}
        ended = sum(
            any(t["prompt_tokens"] > max_model_len - room[roles[t["role"]]] for t in d["turns"]) for d in self.dialogues
        )
        return ended / len(self.dialogues)

    def judge_reply(self) -> float | None:
        if self.judge is None or not self.judge.items:
            return None
        return self.judge.completion_tokens / self.judge.items


def read_calibration(run_dir: Path) -> Calibration:
    columns = ["user_id", "user_index", "task_id", "kind", "turns"]
    table = read_table(run_dir / "dialogues", columns, optional=["ended"])
    if table is None:
        raise PersonalensError(
            f"plan.calibrate: no dialogues under {run_dir / 'dialogues'}; give a finished run's out_dir"
        )
    dialogues = [
        {
            **d,
            "turns": [
                {k: t.get(k) for k in ("role", "prompt_tokens", "completion_tokens", "reasoning_tokens")}
                for t in d["turns"]
            ],
        }
        for d in table.to_pylist()
    ]
    judgments = read_table(run_dir / "judgments", ["user_id"], optional=["reasoning_tokens"])
    judged = judgments.to_pylist() if judgments is not None else []
    counted = [j["reasoning_tokens"] for j in judged if j.get("reasoning_tokens") is not None]
    return Calibration(
        str(run_dir),
        dialogues,
        len(judged),
        _summed(read_summaries(run_dir, "generate"), "dialogues"),
        _summed(read_summaries(run_dir, "judge"), "judgments"),
        sum(counted) / len(counted) if counted else None,
        read_spec_decode(run_dir),
    )


def _summed(records: Sequence[dict], items: str) -> Throughput | None:
    try:
        return (
            Throughput(
                len(records),
                sum(int(r[items]) for r in records),
                sum(float(r["seconds"]) for r in records),
                sum(int(r["prompt_tokens"]) for r in records),
                sum(int(r["cached_tokens"]) for r in records),
                sum(int(r["completion_tokens"]) for r in records),
            )
            if records
            else None
        )
    except (KeyError, TypeError, ValueError):
        return None  # written by another version: not used
