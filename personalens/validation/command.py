"""`personalens validate | stats | diversity`: check a data root, describe it (Tables 1, 6-9,
Figure 3), and measure the lexical diversity of dialogues (Table 10)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from omegaconf import DictConfig

from personalens import console


def validate(cfg: DictConfig) -> int:
    from personalens.data import validate as check

    report = check(Path(cfg.data.root), strict=bool(cfg.data.strict))
    print(report.format())
    return 0 if report.ok else 1


def stats(cfg: DictConfig) -> int:
    from personalens.validation.pipeline import build_stats

    result = build_stats(
        Path(cfg.data.root), cfg.data.users, cfg.stats.schema and Path(cfg.stats.schema), Path(cfg.stats.out_dir)
    )
    print(result.markdown())
    for message in result.messages:
        print(f"personalens stats: {message}", file=console.err())
    print(f"\nstats written to {cfg.stats.out_dir}", file=console.err())
    return 0


def describe_built(root: Path, schema: Sequence, out_dir: Path) -> int:
    """What `personalens stats` shows of data `personalens build` has just made, with the schema it
    was built from: Table 1 and Tables 8-9."""
    from personalens.validation.pipeline import built_data_stats

    result = built_data_stats(root, schema, out_dir)
    print(result.markdown(), file=console.out())
    print(f"build: Table 1 and Tables 8-9 of the new data written to {out_dir}", file=console.err())
    return 0


def diversity(cfg: DictConfig) -> int:
    from personalens.validation.diversity import Protocol
    from personalens.validation.pipeline import build_diversity

    d = cfg.diversity
    source = Path(d.input) if d.input else Path(cfg.run.out_dir) / "dialogues"
    protocol = Protocol(int(d.token_budget), int(d.repeats), int(d.self_bleu_hypotheses), int(cfg.seed))
    result = build_diversity(source, protocol, bool(d.by_speaker), Path(d.out_dir))
    print(result.markdown())
    print(f"\ndiversity of {source} written to {d.out_dir}", file=console.err())
    return 0
