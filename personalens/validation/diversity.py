"""Table 10: lexical diversity of generated dialogues (Dist-1, Dist-2, Ent-4, Self-BLEU), after LAPS.

The protocol (Joko et al., 2024), for each group of utterances (SD or MD, all turns or one speaker):
shuffle the utterances with a seeded generator and take them in that order until a fixed token
budget is reached; score the sample; repeat with the next seed and average. Tokens are the
lower-cased text split on whitespace. Dist-n is distinct n-grams / all n-grams of the sample,
Ent-4 the entropy (natural log) of its 4-gram frequencies, Self-BLEU the mean BLEU-4 (NLTK,
smoothing method 1) of a seeded sample of its utterances, each against all the others of the
sample as references. n-grams never cross utterances. Only the sample is ever tokenized, so the
cost does not grow with the corpus beyond reading its text column.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu
from nltk.util import ngrams
from scipy.stats import entropy

from personalens.errors import PersonalensError
from personalens.store import read_table
from personalens.tables.model import Column, Table

ALL_TURNS = "all turns"
SPEAKERS = ("user", "assistant")
KIND_ORDER = ("SD", "MD")
_SMOOTHING = SmoothingFunction().method1
_CHUNK = 4096  # utterances converted to Python at a time while filling a sample


class DiversityError(PersonalensError, ValueError):
    """Dialogues that cannot be read or lack the columns of our schema; bad protocol settings."""


@dataclass(frozen=True)
class Protocol:
    token_budget: int = 10_000  # whitespace tokens per sample
    repeats: int = 5  # samples averaged
    hypotheses: int = 100  # Self-BLEU hypotheses per sample
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("token_budget", "repeats", "hypotheses"):
            if getattr(self, name) < 1:
                raise DiversityError(f"diversity.{name} must be >= 1, got {getattr(self, name)}")

    def describe(self) -> tuple[str, ...]:
        return (
            "Tokens: the lower-cased text split on whitespace; n-grams do not cross utterances; empty "
            "utterances are left out.",
            f"Sampling: utterances shuffled with seed {self.seed} + r for sample r = 0..{self.repeats - 1} and "
            f"taken in that order until {self.token_budget:,} tokens are reached (the last one whole); each "
            f"metric is the mean over the {self.repeats} samples. A group with fewer tokens is used whole.",
            "Dist-n: distinct / all n-grams of a sample. Ent-4: entropy (natural log) of its 4-gram frequencies.",
            f"Self-BLEU: BLEU-4 (NLTK sentence_bleu, smoothing method 1) of {self.hypotheses} utterances drawn "
            "from the sample with the same seed, each against all other utterances of the sample; their mean.",
        )


@dataclass(frozen=True)
class Scores:
    utterances: int  # in the group
    tokens: float  # mean tokens per sample
    dist1: float
    dist2: float
    ent4: float
    self_bleu: float


# ---- metrics on one sample (lists of tokens) -------------------------------------------------------


def tokenize(text: str) -> list[str]:
    return text.lower().split()


def distinct_n(sample: Sequence[Sequence[str]], n: int) -> float:
    grams = [g for tokens in sample for g in ngrams(tokens, n)]
    return len(set(grams)) / len(grams) if grams else float("nan")


def ngram_entropy(sample: Sequence[Sequence[str]], n: int = 4) -> float:
    counts = Counter(g for tokens in sample for g in ngrams(tokens, n))
    return float(entropy(list(counts.values()))) if counts else float("nan")


def self_bleu(sample: Sequence[Sequence[str]], hypotheses: int, rng: np.random.Generator) -> float:
    """Mean BLEU-4 of `hypotheses` utterances drawn from the sample, each against all the others."""
    if len(sample) < 2:
        return float("nan")
    chosen = rng.choice(len(sample), size=min(hypotheses, len(sample)), replace=False)
    return float(
        np.mean(
            [
                sentence_bleu([r for j, r in enumerate(sample) if j != i], sample[i], smoothing_function=_SMOOTHING)
                for i in chosen
            ]
        )
    )


# ---- sampling ------------------------------------------------------------------------------------


def sample_to_budget(texts: pa.Array, budget: int, rng: np.random.Generator) -> list[list[str]]:
    """Utterances in a seeded random order, tokenized, until `budget` tokens are reached."""
    order = rng.permutation(len(texts))
    sample: list[list[str]] = []
    total = 0
    for start in range(0, len(order), _CHUNK):
        for text in texts.take(pa.array(order[start : start + _CHUNK])).to_pylist():
            tokens = tokenize(text or "")
            if tokens:
                sample.append(tokens)
                total += len(tokens)
                if total >= budget:
                    return sample
    return sample


def scores(texts: pa.Array, protocol: Protocol) -> Scores | None:
    """The group's metrics averaged over the protocol's samples; None for a group without text."""
    samples = []
    for r in range(protocol.repeats):
        rng = np.random.default_rng(protocol.seed + r)
        sample = sample_to_budget(texts, protocol.token_budget, rng)
        if not sample:
            return None
        samples.append(
            (
                sum(map(len, sample)),
                distinct_n(sample, 1),
                distinct_n(sample, 2),
                ngram_entropy(sample, 4),
                self_bleu(sample, protocol.hypotheses, rng),
            )
        )
    values = np.array(samples, dtype=np.float64)
    defined = ~np.isnan(values)  # Self-BLEU is undefined for a sample of one utterance
    means = np.where(defined.any(axis=0), np.nansum(values, axis=0) / np.maximum(defined.sum(axis=0), 1), np.nan)
    return Scores(len(texts), *map(float, means))


# ---- dialogues -----------------------------------------------------------------------------------


def read_dialogues(source: Path) -> pa.Table:
    """`kind` and `turns` of a Parquet file, or of every part file under a folder (a run's dialogues/)."""
    source = Path(source)
    columns = ["kind", "turns"]
    try:
        if source.is_dir():
            table = read_table(source, columns)
            if table is None:
                raise DiversityError(
                    f"{source}: no part-*.parquet files (expected a run's dialogues/ folder "
                    "or a Parquet file of dialogues)"
                )
        elif source.is_file():
            table = ds.dataset(str(source), format="parquet").to_table(columns=columns)
        else:
            raise DiversityError(f"{source}: no such file or folder")
    except (pa.ArrowInvalid, OSError) as err:
        raise DiversityError(
            f"{source}: cannot read dialogues: {err} (expected the columns kind and turns of "
            "the dialogue schema, personalens/store/schema.py)"
        ) from None
    turn_type = table.schema.field("turns").type
    if not (
        pa.types.is_list(turn_type)
        and pa.types.is_struct(turn_type.value_type)
        and {"role", "text"} <= {f.name for f in turn_type.value_type}
    ):
        raise DiversityError(f"{source}: column turns is {turn_type}, expected a list of structs with role and text")
    return table


def utterance_groups(dialogues: pa.Table, by_speaker: bool) -> dict[tuple[str, str], pa.Array]:
    """(kind, speaker) -> the texts of the group's utterances; speaker ALL_TURNS is every turn."""
    turns = dialogues.column("turns").combine_chunks()
    flat = turns.flatten()
    text, role = flat.field("text"), flat.field("role")
    kind = pc.take(dialogues.column("kind").combine_chunks(), pc.list_parent_indices(turns))
    kinds = sorted(
        set(dialogues.column("kind").to_pylist()) - {None},
        key=lambda k: (KIND_ORDER.index(k) if k in KIND_ORDER else len(KIND_ORDER), k),
    )
    groups = {}
    for k in kinds:
        in_kind = pc.equal(kind, k)
        groups[(k, ALL_TURNS)] = text.filter(in_kind)
        if by_speaker:
            for speaker in SPEAKERS:
                groups[(k, speaker)] = text.filter(pc.and_(in_kind, pc.equal(role, speaker)))
    return groups


def table10(dialogues: pa.Table, protocol: Protocol, by_speaker: bool) -> Table:
    dialogue_counts = {row["values"]: row["counts"] for row in pc.value_counts(dialogues.column("kind")).to_pylist()}
    rows = []
    for (kind, speaker), texts in utterance_groups(dialogues, by_speaker).items():
        s = scores(texts, protocol)
        rows.append(
            (
                (kind, speaker),
                (dialogue_counts[kind], len(texts))
                + ((None,) * 5 if s is None else (s.tokens, s.dist1, s.dist2, s.ent4, s.self_bleu)),
            )
        )
    columns = (
        Column("dialogues", "", "#Dial", holds="count"),
        Column("utterances", "", "#Utt.", holds="count"),
        Column("tokens", "", "Tokens/sample", 0, holds="value"),
        Column("dist1", "", "Dist-1", 3, holds="value"),
        Column("dist2", "", "Dist-2", 3, holds="value"),
        Column("ent4", "", "Ent-4", 3, holds="value"),
        Column("self_bleu", "", "Self-BLEU", 3, holds="value"),
    )
    return Table(
        "table10",
        "Table 10: lexical diversity of the dialogues",
        ("Kind", "Speaker"),
        columns,
        tuple(rows),
        notes=protocol.describe(),
    )
