"""What every PersonalBench stage shares: its settings, this shard's tables, batched and
seeded requests to an engine."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from personalens.engines.base import Engine, Request, Sampling, derive_seed
from personalens.engines.progress import generate_in_chunks
from personalens.personalbench.extraction import Rules
from personalens.personalbench.histories import Filters
from personalens.personalbench.relevance import Rule
from personalens.personalbench.schema import TABLES
from personalens.store import PartWriter, existing_values, read_table, shard_dir

STAGES = ("extract", "relevance", "generate", "judge")  # the model stages, in order
UNTIL = ("read", *STAGES)  # personalbench.until: `read` stops before the first model stage


CHUNK = 512  # requests per generate call: large batches, yet results reach disk steadily


@dataclass(frozen=True)
class Settings:
    input: tuple[str, ...]
    prompts_file: str
    prompts_per_user: int  # bundled prompts paired with each user (a seeded sample); 0 = all
    filters: Filters
    rules: Rules
    bm25: Rule  # the BM25 baseline: top k with a positive score
    extraction: Sampling
    relevance: Sampling
    generation: Sampling
    judge: Sampling
    seed: int
    batch_size: int = 1024  # Parquet rows per read
    progress: bool = True
    # personalized responses from these (user, prompt, attribute) triples, the human-majority
    # relevant ones, instead of the model's selection: isolates generation from selection
    human_selection: frozenset[tuple[str, str, str]] | None = None
    embedding: Rule | None = None  # the embedding-similarity baseline, where an embedding model is configured


@dataclass(frozen=True)
class Shard:
    out_dir: Path
    index: int = 0
    count: int = 1

    def folder(self, table: str) -> Path:
        return shard_dir(self.out_dir, table, self.index, self.count)

    def writer(self, table: str) -> PartWriter:
        return PartWriter(self.folder(table), TABLES[table][0])

    def done(self, table: str) -> set[tuple]:
        return existing_values(self.folder(table), TABLES[table][1])

    def rows(self, table: str) -> list[dict]:
        found = read_table(self.folder(table))
        return [] if found is None else found.to_pylist()


def batched(
    items: list,
    requests: Callable[[list], list[Request]],
    load: Callable[[], Engine],
    label: str,
    progress: bool,
    write: Callable[[list, list, Engine], None],
) -> None:
    generate_in_chunks(items, requests, load, write, label=label, unit="request", progress=progress, chunk=CHUNK)


def messages(text: str, system: str | None = None) -> list[dict]:
    return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]


def seeded(sampling: Sampling, seed: int, *key: object) -> Sampling:
    """`sampling` with the request's own seed, derived as every pipeline derives it."""
    return dataclasses.replace(sampling, seed=derive_seed(seed, *key))
