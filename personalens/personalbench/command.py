"""`personalens personalbench run|export|score`: from the Hydra config to the stages, sheets and report."""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Callable

from omegaconf import DictConfig

from personalens import config as C
from personalens.errors import PersonalensError
from personalens.personalbench.extraction import Rules
from personalens.personalbench.histories import Filters
from personalens.personalbench.pipeline import Settings, Shard
from personalens.personalbench.templates import Prompts

ACTIONS = ("run", "export", "score")
# settings that change what is read, reported or where, not what the models produce
_NOT_FINGERPRINTED = {"action", "annotations", "sheets_dir", "report_dir", "bootstrap", "out_dir", "batch_size"}


def settings(cfg: DictConfig) -> Settings:
    pb = cfg.personalbench
    try:
        return Settings(
            input=tuple(pb.input), prompts_file=str(pb.prompts_file), prompts_per_user=int(pb.prompts_per_user),
            filters=Filters(languages=tuple(pb.filters.languages), min_conversations=int(pb.filters.min_conversations),
                            min_user_turns=int(pb.filters.min_user_turns),
                            max_duplicate_share=float(pb.filters.max_duplicate_share),
                            duplicate_similarity=float(pb.filters.duplicate_similarity),
                            max_conversations=int(pb.filters.max_conversations), holdout=int(pb.filters.holdout)),
            rules=Rules(categories=tuple(pb.extraction.categories), max_attributes=int(pb.extraction.max_attributes),
                        min_confidence=float(pb.extraction.min_confidence),
                        duplicate_similarity=float(pb.extraction.duplicate_similarity),
                        drop_failed_evidence=bool(pb.extraction.drop_failed_evidence),
                        max_history_chars=int(pb.extraction.max_history_chars),
                        sensitive_categories=tuple(pb.sensitive.attribute_categories),
                        sensitive_moderation=tuple(pb.sensitive.moderation_categories)),
            bm25_top_k=int(pb.relevance.bm25_top_k),
            extraction=C.sampling(pb.extraction.sampling), relevance=C.sampling(pb.relevance.sampling),
            generation=C.sampling(pb.generation.sampling), judge=C.sampling(pb.judging.sampling),
            seed=int(cfg.seed), batch_size=int(pb.batch_size), progress=bool(cfg.progress),
        )
    except (ValueError, TypeError) as err:
        raise PersonalensError(f"personalbench: bad setting: {err}") from None


def digest(cfg: DictConfig, prompts: Prompts) -> str:
    pb = {k: C.plain(v) for k, v in cfg.personalbench.items() if k not in _NOT_FINGERPRINTED}
    return C.fingerprint({"personalbench": pb, "assistant": C.model_identity(cfg.assistant),
                          "judge": C.model_identity(cfg.judge), "prompts": prompts.digest,
                          "seed": int(cfg.seed), "shards": int(cfg.shard.count)})


def run(cfg: DictConfig, engines: Callable[[], dict] | None = None) -> int:
    from personalens.personalbench.pipeline import run as run_stages

    prompts = Prompts(cfg.personalbench.prompts_dir)
    out_dir = Path(cfg.personalbench.out_dir)
    from personalens.engines.build import model_configs
    model_configs({"assistant": cfg.assistant, "judge": cfg.judge})  # bad model configs fail before anything is saved
    C.check_or_save(out_dir, "personalbench", cfg, digest(cfg, prompts))
    if engines is None:
        from personalens.engines.build import build_engines
        engines = functools.cache(lambda: build_engines({"assistant": cfg.assistant, "judge": cfg.judge}))
    run_stages(settings(cfg), prompts, Shard(out_dir, int(cfg.shard.index), int(cfg.shard.count)), engines)
    print(f"personalbench: outputs in {out_dir}", file=sys.stderr)
    return 0


def export(cfg: DictConfig) -> int:
    from personalens.personalbench.sheets import export as write_sheets
    pb = cfg.personalbench
    _require_run(Path(pb.out_dir))
    counts = write_sheets(Path(pb.out_dir), Path(pb.sheets_dir), int(cfg.seed))
    print(f"personalbench: annotation sheets in {pb.sheets_dir}: " + ", ".join(f"{n} {s} items" for s, n in counts.items()))
    return 0


def score(cfg: DictConfig) -> int:
    from personalens.personalbench import report
    from personalens.personalbench.sheets import Annotations, load_annotations
    from personalens.report import render
    from personalens.report.stats import Bootstrap

    pb = cfg.personalbench
    out_dir = Path(pb.out_dir)
    _require_run(out_dir)
    notes = load_annotations(Path(pb.annotations)) if pb.annotations else Annotations()
    run = report.run_items(out_dir)
    others = [report.run_items(Path(d)) for d in pb.get("compare") or []]
    scores = report.score(run, notes, Bootstrap(int(pb.bootstrap), int(cfg.seed)), others)
    counts = report.counts_table(report.input_summary(out_dir), run, notes, scores.unmatched)
    files = report.write([*scores.tables, counts], Path(pb.report_dir))
    print(render.markdown([*scores.tables, counts]))
    print(f"personalbench: report written to {files[-1]}", file=sys.stderr)
    return 0


def _require_run(out_dir: Path) -> None:
    if not (out_dir / "personalbench.yaml").is_file():
        raise PersonalensError(f"no PersonalBench run in {out_dir}: run `personalens personalbench run` "
                               "with the same run.out_dir first")
