"""One build stage as batched generate calls over keyed jobs, streamed to a Parquet table that resumes.

A stage's table is `<root>/<stage>/shard-KKK-of-NNN/part-*.parquet` with one row per try of a job. A
job is done once a row of it parses; an output that does not (cut off by max_tokens) is tried again
with another seed and a doubled token budget (capped), up to `retries` more times: the budget is
what changes the outcome of a stage sampled at temperature 0, where the seed changes nothing. A stage that is not selected only reads: any job it
lacks is an error that names the stage to run."""

from __future__ import annotations

import dataclasses
import json
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from personalens.engines.base import Engine, Request, Sampling, derive_seed
from personalens.errors import PersonalensError
from personalens.progress import Progress
from personalens.store import PartWriter, read_table, shard_dir

STAGE_SCHEMA = pa.schema(
    [
        ("key", pa.string()),  # the job's key as a JSON list, e.g. ["user3", "Movies", 0]
        ("user_index", pa.int32()),  # -1 for jobs shared by all users (tasks)
        ("try", pa.int32()),
        ("seed", pa.int64()),
        ("text", pa.string()),  # the raw output
        ("value", pa.string()),  # the parsed output as JSON; null when it did not parse
        ("prompt_tokens", pa.int32()),
        ("completion_tokens", pa.int32()),
        ("model", pa.string()),
        ("config_hash", pa.string()),
    ]
)


@dataclass(frozen=True)
class Job:
    key: tuple
    user_index: int
    messages: list[dict]
    grammar: str
    parse: Callable[[str], Any]  # the parsed value, or None when the output is unusable


@dataclass
class StageCount:
    jobs: int = 0
    skipped: int = 0  # already done by an earlier run
    requests: int = 0  # generated now, retries included
    retries: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0


def retry_sampling(base: Sampling, attempt: int, cap: int, seed: int) -> Sampling:
    """The sampling of try `attempt` (0 = first): its own seed, and a budget doubled per earlier try up
    to `cap` (a cap below the stage's budget keeps the stage's)."""
    budget = min(base.max_tokens * 2**attempt, max(cap, base.max_tokens))
    return dataclasses.replace(base, seed=seed, max_tokens=budget)


def encode_key(key: Sequence) -> str:
    return json.dumps(list(key), ensure_ascii=False)


@dataclass
class Runner:
    root: Path  # the stage tables' folder
    shard: tuple[int, int]  # (index, count) this process writes as
    engine: Callable[[], Engine]  # called only when something is generated
    sampling: Callable[[str], Sampling]  # stage -> sampling (its seed is replaced per try)
    seed: int
    retries: int
    chunk: int  # jobs per generate call: each chunk is written as soon as it is done
    config_hash: str
    progress: bool = True
    max_tokens_cap: int = 0  # the largest budget a retry may grow to (never below the stage's own)
    counts: dict[str, StageCount] = field(default_factory=dict)

    def folder(self, stage: str) -> Path:
        return self.root / stage

    def run(self, stage: str, jobs: Sequence[Job], *, active: bool) -> dict[tuple, Any]:
        """key -> parsed value for every job; generates the missing ones when `active`."""
        count = self.counts.setdefault(stage, StageCount())
        valid, tries = self._existing(stage)
        count.jobs += len(jobs)
        count.skipped += sum(1 for j in jobs if encode_key(j.key) in valid)
        todo = self._todo(jobs, valid, tries)
        if todo and not active:
            raise PersonalensError(
                f"build stage {stage!r}: {len(todo)} of {len(jobs)} outputs missing in {self.folder(stage)} "
                f"(e.g. {list(todo[0].key)}); run `personalens build` with the stage that makes them in "
                f"datagen.stages first (the tasks stage without sharding)"
            )
        if todo:
            writer = PartWriter(shard_dir(self.root, stage, *self.shard), STAGE_SCHEMA)
            bar = Progress(total=len(todo), label=f"build {stage}", unit="output", enabled=self.progress)
            while todo:
                for start in range(0, len(todo), self.chunk):
                    self._generate(stage, todo[start : start + self.chunk], writer, valid, tries, count, bar)
                todo = self._todo(jobs, valid, tries)
            bar.close()
        failed = [j.key for j in jobs if encode_key(j.key) not in valid]
        if failed:
            raise PersonalensError(
                f"build stage {stage!r}: {len(failed)} outputs unusable after {self.retries + 1} tries "
                f"(e.g. {list(failed[0])}): they were cut off even with the budget doubled per retry up to "
                f"datagen.max_tokens_cap; raise datagen.max_tokens.{stage} and datagen.max_tokens_cap, or lower datagen.limits"
            )
        return {j.key: valid[encode_key(j.key)] for j in jobs}

    def _todo(self, jobs: Sequence[Job], valid: dict, tries: Counter) -> list[Job]:
        return [j for j in jobs if encode_key(j.key) not in valid and tries[encode_key(j.key)] <= self.retries]

    def _existing(self, stage: str) -> tuple[dict[str, Any], Counter]:
        """Parsed values by key (the latest valid try) and the number of tries by key, over all shards."""
        table = read_table(self.folder(stage), ["key", "try", "value"])
        valid: dict[str, Any] = {}
        tries: Counter = Counter()
        rows = [] if table is None else sorted(table.to_pylist(), key=lambda r: r["try"])
        for row in rows:
            tries[row["key"]] += 1
            if row["value"] is not None:
                valid[row["key"]] = json.loads(row["value"])
        return valid, tries

    def _generate(
        self,
        stage: str,
        jobs: Sequence[Job],
        writer: PartWriter,
        valid: dict,
        tries: Counter,
        count: StageCount,
        bar: Progress,
    ) -> None:
        engine = self.engine()
        base = self.sampling(stage)
        started = time.monotonic()
        seeds = [derive_seed(self.seed, stage, encode_key(j.key), tries[encode_key(j.key)]) for j in jobs]
        outputs = engine.generate(
            [
                Request(j.messages, retry_sampling(base, tries[encode_key(j.key)], self.max_tokens_cap, s), j.grammar)
                for j, s in zip(jobs, seeds)
            ]
        )
        rows = []
        settled = 0  # jobs that parsed or ran out of tries: they leave the bar, so retries never push it past 100%
        for job, seed, out in zip(jobs, seeds, outputs):
            key = encode_key(job.key)
            value = job.parse(out.text)
            rows.append(
                {
                    "key": key,
                    "user_index": job.user_index,
                    "try": tries[key],
                    "seed": seed,
                    "text": out.text,
                    "value": None if value is None else json.dumps(value, ensure_ascii=False),
                    "prompt_tokens": out.prompt_tokens,
                    "completion_tokens": out.completion_tokens,
                    "model": engine.name,
                    "config_hash": self.config_hash,
                }
            )
            count.retries += tries[key] > 0
            tries[key] += 1
            if value is not None:
                valid[key] = value
            settled += value is not None or tries[key] > self.retries
        writer.write(rows)
        tokens = sum(o.completion_tokens for o in outputs)
        count.requests += len(jobs)
        count.prompt_tokens += sum(o.prompt_tokens for o in outputs)
        count.completion_tokens += tokens
        count.seconds += time.monotonic() - started
        bar.update(settled, active=0, tokens=tokens)

    def summary(self) -> str:
        parts = [
            f"{stage} {c.requests}"
            + (f" (+{c.skipped} done before)" if c.skipped else "")
            + (f" ({c.retries} retried)" if c.retries else "")
            for stage, c in self.counts.items()
        ]
        tokens = sum(c.completion_tokens for c in self.counts.values())
        seconds = sum(c.seconds for c in self.counts.values())
        rate = tokens / seconds if seconds > 0 else 0.0
        return (
            f"generated per stage: {', '.join(parts) or 'nothing'}; {tokens} tokens in {seconds:.1f} s "
            f"of generation ({rate:.1f} tokens/s)"
        )
