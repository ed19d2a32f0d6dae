"""`judge`: score every dialogue on the paper's dimensions in large batched, grammar-constrained
calls, streaming the judgments to Parquet and skipping those a previous run already wrote."""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from personalens.data.records import Scenario, Turn
from personalens.engines.base import Engine, Generation, Request, Sampling, conversation, derive_seed
from personalens.engines.chat.reasoning import THINKING
from personalens.engines.progress import generate_in_chunks
from personalens.engines.stop import Stop
from personalens.judge.formats import FORMATS, JudgeFormat, Verdict, format_for
from personalens.progress import prompt_usage
from personalens.prompts.render import SPEAKERS, judge_messages
from personalens.prompts.templates import Templates
from personalens.store import (
    ID_FIELDS,
    JUDGMENT_KEY,
    JUDGMENT_SCHEMA,
    KEY_COLUMNS,
    PartWriter,
    read_table,
)

log = logging.getLogger(__name__)
_ID_NAMES = [name for name, _ in ID_FIELDS]
CHUNK = 512  # judgments per generate call (`judging.chunk`): large batches, yet results reach disk steadily


@dataclass(frozen=True)
class Item:
    dialogue: dict  # a dialogue row
    scenario: Scenario
    dimension: str
    speaker: str
    turn: int  # -1: the whole dialogue; k: cut after the k-th assistant reply

    @property
    def key(self) -> tuple:
        d = self.dialogue
        return (d["user_id"], d["task_id"], d["setting"], d["trial"], self.dimension, self.speaker, self.turn)

    def turns(self) -> list[Turn]:
        turns = [Turn(t["role"], t["text"]) for t in self.dialogue["turns"]]
        if self.turn < 0:
            return turns
        replies = [i for i, t in enumerate(turns) if t.role == "assistant"]
        return turns[: replies[self.turn - 1] + 1]


@dataclass(frozen=True)
class JudgeSummary:
    judgments: int
    seconds: float
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    failed: int  # outputs without a valid score (refused and cut ones included)
    kept_out_of_range: int
    refused: int = 0  # requests the judge's engine refused (a prompt longer than its context, say)
    cut: int = 0  # outputs cut at max_tokens before a valid score
    thinking: int = 0  # outputs that stopped inside a reasoning judge's thinking (no output to parse)
    reasoning_tokens: int = 0  # of completion_tokens, a reasoning judge's thinking (as far as counted)


def failure(verdict: Verdict, gen: Generation) -> str | None:
    """Why a judgment has no valid score (the `failure` column; None when it has one)."""
    if gen.error is not None:
        return f"prompt does not fit the judge's context: {gen.error}" if gen.over_context else f"refused: {gen.error}"
    if verdict.parsed:
        return None
    if gen.finish_reason == THINKING:
        return f"stopped inside its thinking at {gen.completion_tokens} tokens"
    if gen.finish_reason == "length":
        return f"cut at {gen.completion_tokens} tokens"
    return "no valid score"


def plan(
    dialogues: Sequence[dict],
    scenarios: Mapping[tuple[str, str], Scenario],
    dimensions: Sequence[str],
    turn_level: bool,
    done: set[tuple],
) -> list[Item]:
    items = []
    for d in dialogues:
        scenario = scenarios.get((d["user_id"], d["task_id"]))
        if scenario is None or d.get("ended") == "failed" or not d["turns"]:
            continue  # outside this run's selection, refused by an engine, or empty: judge() says how many
        for dim in dimensions:
            for speaker in SPEAKERS.get(dim, ("",)):
                items.append(Item(d, scenario, dim, speaker, -1))
        if turn_level and "personalization" in dimensions:
            items.extend(Item(d, scenario, "personalization", "", k) for k in range(1, d["rounds"] + 1))
    return [i for i in items if i.key not in done]


def judge_seed(item: Item) -> int:
    """A judgment's sampling seed: from its dialogue's seed (the run's seed, the user, the task and the
    trial: simulate/generate.py) and the rest of its key, so that a judge sampling at a temperature
    above 0 draws the same numbers for the same judgment in any batch, shard or resume."""
    return derive_seed(item.dialogue.get("seed"), "judge", *item.key)


def render(templates: Templates, item: Item) -> list[dict]:
    return judge_messages(templates, item.dimension, item.scenario, item.turns(), speaker=item.speaker or None)


def judge(
    dialogues: Sequence[dict],
    scenarios: Mapping[tuple[str, str], Scenario],
    *,
    templates: Templates,
    load_engine: Callable[[], Engine],
    sampling: Sampling,
    dimensions: Sequence[str],
    turn_level: bool,
    folder: Path,
    progress: bool = True,
    formats: Mapping[str, JudgeFormat] = FORMATS,
    chunk: int = CHUNK,
    stop: Stop | None = None,
    judge_key: str | None = None,
    legacy: bool = True,
    guard: Callable[[], None] | None = None,
) -> JudgeSummary:
    """Judge what this judge (`judge_key`, written on its rows) has not judged yet; returns what was
    done. Rows without a key (runs written before judge panels) count as this judge's when `legacy`
    (the run's own judge, judge.yaml). `load_engine` is
    called only when there is something to judge; `formats` are the output grammars and parsers;
    each `chunk` judgments are one generate call and one part file. `stop` is checked after each
    part file is written (engines/stop.py); `guard` before each part file lands (store/parts.py)."""
    for dim in dimensions:
        format_for(dim, formats)  # an unknown dimension fails before any model call
    writer = PartWriter(folder, JUDGMENT_SCHEMA, guard)
    outside = sum((d["user_id"], d["task_id"]) not in scenarios for d in dialogues)
    if outside:
        log.warning(
            f"judge: {outside} dialogues in {folder.parent.parent} are outside the data selection and are not judged"
        )
    failed = sum(d.get("ended") == "failed" for d in dialogues)
    if failed:
        log.warning(f"judge: {failed} dialogues failed (an engine refused a request of theirs) and are not judged")
    empty = sum(d.get("ended") != "failed" and not d["turns"] for d in dialogues)
    if empty:
        log.warning(f"judge: {empty} dialogues ended on context before their first turn and are not judged")
    items = plan(dialogues, scenarios, dimensions, turn_level, judged(folder, judge_key, legacy))
    counts = dict.fromkeys(
        (
            "failed",
            "kept_out_of_range",
            "refused",
            "cut",
            "thinking",
            "reasoning_tokens",
            "prompt_tokens",
            "cached_tokens",
            "completion_tokens",
        ),
        0,
    )
    started = time.monotonic()
    session_started = time.time()

    def requests(chunk: Sequence[Item]) -> list[Request]:
        return [
            Request(
                messages=render(templates, i),
                sampling=dataclasses.replace(sampling, seed=judge_seed(i)),
                grammar=format_for(i.dimension, formats).grammar,
                # a dialogue's judgments share its text: one copy of the judge's model answers them all
                affinity=conversation(*(i.dialogue[k] for k in KEY_COLUMNS)),
            )
            for i in chunk
        ]

    def write(chunk: Sequence[Item], generations: list, engine: Engine) -> None:
        rows = []
        for item, gen in zip(chunk, generations):
            judge_format = format_for(item.dimension, formats)
            # only the answer is parsed: a reasoning judge's thinking is split off by its engine
            # (engines/chat/reasoning.py), and one that stopped inside it has no answer
            answered = gen.error is None and gen.finish_reason != THINKING
            verdict = judge_format.parse(gen.text) if answered else Verdict(None, False)
            why = failure(verdict, gen)
            counts["failed"] += not verdict.parsed
            counts["refused"] += gen.error is not None
            counts["cut"] += why is not None and gen.finish_reason == "length"
            counts["thinking"] += gen.finish_reason == THINKING
            counts["reasoning_tokens"] += gen.reasoning_tokens or 0
            counts["kept_out_of_range"] += verdict.score is not None and not judge_format.in_range(verdict.score)
            rows.append(
                {
                    **{k: item.dialogue[k] for k in _ID_NAMES},
                    "dimension": item.dimension,
                    "speaker": item.speaker,
                    "turn": item.turn,
                    "score": verdict.score,
                    "parsed": verdict.parsed,
                    "judge_text": gen.text,
                    "judge_model": engine.name,
                    "prompt_hash": prompt_hash(render(templates, item)),  # rendering is cheap; prompts are not kept
                    "finish_reason": gen.finish_reason,
                    "failure": why,
                    "judge_reasoning": gen.reasoning,
                    "reasoning_tokens": gen.reasoning_tokens,
                    "session_started": session_started,
                    "judge_key": judge_key,
                }
            )
        writer.write(rows)
        counts["prompt_tokens"] += sum(g.prompt_tokens for g in generations)
        counts["cached_tokens"] += sum(g.cached_tokens for g in generations)
        counts["completion_tokens"] += sum(g.completion_tokens for g in generations)
        if stop is not None:
            stop.check()

    generate_in_chunks(
        items, requests, load_engine, write, label="judge", unit="judgment", progress=progress, chunk=chunk
    )
    summary = JudgeSummary(len(items), time.monotonic() - started, **counts)
    log.info(
        f"judge: {summary.judgments} judgments in {summary.seconds:.1f} s, "
        f"{summary.failed} outputs without a valid score ({summary.refused} refused by the engine, "
        f"{summary.cut} cut at max_tokens, {summary.thinking} stopped in their thinking), "
        f"{summary.reasoning_tokens} thinking tokens, {summary.kept_out_of_range} out-of-range scores "
        f"kept as the released code keeps them; {prompt_usage(summary.prompt_tokens, summary.cached_tokens)}"
    )
    return summary


def judged(folder: Path, judge_key: str | None, legacy: bool) -> set[tuple]:
    """The JUDGMENT_KEY tuples of `folder` that judge `judge_key` wrote; rows without a key count as
    its own when `legacy`."""
    table = read_table(folder, JUDGMENT_KEY, optional=("judge_key",))
    if table is None:
        return set()
    keys = table.column("judge_key").to_pylist() if "judge_key" in table.column_names else [None] * table.num_rows
    rows = zip(*(table.column(c).to_pylist() for c in JUDGMENT_KEY))
    return {row for row, key in zip(rows, keys) if key == judge_key or (key is None and legacy)}


def prompt_hash(messages: Sequence[dict]) -> str:
    text = "\x1e".join(f"{m['role']}\x1f{m['content']}" for m in messages)
    return hashlib.sha256(text.encode()).hexdigest()
