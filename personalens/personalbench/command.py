"""`personalens personalbench run|export|score`: from the Hydra config to the stages, sheets and report."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

from omegaconf import DictConfig

from personalens import config as C
from personalens import console
from personalens.engines.base import Embedder, sampling_from
from personalens.engines.stop import Stop
from personalens.errors import PersonalensError
from personalens.personalbench.extraction import Rules
from personalens.personalbench.histories import Filters
from personalens.personalbench.relevance import Rule
from personalens.personalbench.stage import UNTIL, Settings, Shard
from personalens.personalbench.templates import Prompts

# settings that change what is read, reported or where, not what the models produce
_NOT_FINGERPRINTED = {
    "action",
    "until",
    "annotations",
    "sheets_dir",
    "report_dir",
    "bootstrap",
    "out_dir",
    "batch_size",
    "html_items",
}


def settings(cfg: DictConfig) -> Settings:
    pb = cfg.personalbench
    source = str(pb.generation.attributes)
    if source not in ("model", "human"):
        raise PersonalensError(f"personalbench.generation.attributes: {source!r}, expected model or human")
    try:
        return Settings(
            input=tuple(pb.input),
            prompts_file=str(pb.prompts_file),
            prompts_per_user=int(pb.prompts_per_user),
            filters=Filters(
                languages=tuple(pb.filters.languages),
                min_conversations=int(pb.filters.min_conversations),
                min_user_turns=int(pb.filters.min_user_turns),
                max_duplicate_share=float(pb.filters.max_duplicate_share),
                duplicate_similarity=float(pb.filters.duplicate_similarity),
                max_conversations=int(pb.filters.max_conversations),
                holdout=int(pb.filters.holdout),
            ),
            rules=Rules(
                categories=tuple(pb.extraction.categories),
                max_attributes=int(pb.extraction.max_attributes),
                min_confidence=float(pb.extraction.min_confidence),
                duplicate_similarity=float(pb.extraction.duplicate_similarity),
                drop_failed_evidence=bool(pb.extraction.drop_failed_evidence),
                max_history_chars=int(pb.extraction.max_history_chars),
                sensitive_categories=tuple(pb.sensitive.attribute_categories),
                sensitive_moderation=tuple(pb.sensitive.moderation_categories),
            ),
            bm25=Rule(int(pb.relevance.bm25_top_k)),
            embedding=Rule(int(pb.embedding.top_k), float(pb.embedding.min_similarity)) if pb.embedding.path else None,
            extraction=sampling_from(pb.extraction.sampling),
            relevance=sampling_from(pb.relevance.sampling),
            generation=sampling_from(pb.generation.sampling),
            judge=sampling_from(pb.judging.sampling),
            seed=int(cfg.seed),
            batch_size=int(pb.batch_size),
            progress=bool(cfg.progress),
            human_selection=human_selection(pb) if source == "human" else None,
        )
    except (ValueError, TypeError) as err:
        raise PersonalensError(f"personalbench: bad setting: {err}") from None


def embedding_config(cfg: DictConfig):
    """The embedding baseline's model, or None where personalbench.embedding.path is null."""
    from personalens.engines.vllm.embedding import EmbeddingConfig

    e = cfg.personalbench.embedding
    if not e.path:
        return None
    try:
        return EmbeddingConfig(
            path=str(e.path),
            dtype=str(e.dtype),
            gpu_memory_utilization=float(e.gpu_memory_utilization),
            seed=int(cfg.seed),
        )
    except (ValueError, TypeError) as err:
        raise PersonalensError(f"personalbench.embedding: bad setting: {err}") from None


def human_selection(pb: DictConfig) -> frozenset[tuple[str, str, str]]:
    """The (user, prompt, attribute) items whose human-majority relevance label is "relevant"."""
    from personalens.personalbench.metrics import gold
    from personalens.personalbench.sheets import load_annotations

    if not pb.annotations:
        raise PersonalensError("personalbench.generation.attributes=human needs personalbench.annotations")
    labels = gold(load_annotations(Path(pb.annotations)).labels["relevance"])
    return frozenset(tuple(item.split("|")) for item, relevant in labels.items() if relevant)


def digests(cfg: DictConfig, prompts: Prompts, chosen: Settings) -> tuple[str, str]:
    """Fingerprints of stages 1-3 (histories, extraction, relevance) and of stages 4-5 (generation,
    judging): the second may change alone, e.g. to generate from human labels after annotating."""
    pb = {k: C.plain(v) for k, v in cfg.personalbench.items() if k not in _NOT_FINGERPRINTED}
    later = {k: pb.pop(k) for k in ("generation", "judging")}
    selection = C.fingerprint(
        {
            "personalbench": pb,
            "assistant": C.model_identity(cfg.assistant),
            "prompts": prompts.digest,
            "seed": int(cfg.seed),
            "shards": int(cfg.shard.count),
        }
    )
    responses = C.fingerprint(
        {
            "selection": selection,
            **later,
            "judge": C.model_identity(cfg.judge),
            "human_selection": sorted(chosen.human_selection or ()),
        }
    )
    return selection, responses


def run(
    cfg: DictConfig,
    engines: Callable[[], dict] | None = None,
    embedder: Callable[[], Embedder] | None = None,
    stop: Stop | None = None,
) -> int:
    """`engines` (the chat models by role) and `embedder` (the embedding baseline's model) default to
    the configured ones, each loaded when a stage first needs it."""
    from personalens.personalbench.pipeline import run as run_stages

    prompts = Prompts(cfg.personalbench.prompts_dir)
    out_dir = Path(cfg.personalbench.out_dir)
    from personalens.engines.factory import EngineLoader, model_configs

    models = {"assistant": cfg.assistant, "judge": cfg.judge}
    model_configs(models)  # bad model configs fail before anything is saved
    engines = engines or EngineLoader(models, out_dir / "logs", stop=stop)  # so does a layout that cannot fit
    embedding = embedding_config(cfg)
    if embedding is not None:
        from personalens.engines.vllm.embedding import model_dir

        model_dir(embedding)  # so does a missing embedding model
    chosen = settings(cfg)
    until = str(cfg.personalbench.until)
    if until not in UNTIL:
        raise PersonalensError(f"personalbench.until: {until!r}, expected one of {list(UNTIL)}")
    selection, responses = digests(cfg, prompts, chosen)
    C.check_or_save(out_dir, "personalbench", cfg, selection)
    if UNTIL.index(until) >= UNTIL.index("generate"):
        C.check_or_save(out_dir, "personalbench-responses", cfg, responses)
    if embedder is None and embedding is not None:
        from personalens.engines.vllm.embedding import VllmEmbedder

        embedder = functools.cache(lambda: VllmEmbedder(embedding))
    run_stages(chosen, prompts, Shard(out_dir, int(cfg.shard.index), int(cfg.shard.count)), engines, until, embedder)
    print(f"personalbench: outputs in {out_dir}", file=console.err())
    return 0


def export(cfg: DictConfig) -> int:
    from personalens.personalbench.sheets import export as write_sheets

    pb = cfg.personalbench
    _require_run(Path(pb.out_dir))
    counts = write_sheets(Path(pb.out_dir), Path(pb.sheets_dir), int(cfg.seed))
    print(
        f"personalbench: annotation sheets in {pb.sheets_dir}: "
        + ", ".join(f"{n} {s} items" for s, n in counts.items())
    )
    return 0


def score(cfg: DictConfig) -> int:
    from personalens.personalbench import report
    from personalens.personalbench.page import write_html
    from personalens.personalbench.sheets import Annotations, load_annotations
    from personalens.tables import render
    from personalens.tables.stats import Bootstrap

    pb = cfg.personalbench
    out_dir = Path(pb.out_dir)
    _require_run(out_dir)
    if int(pb.html_items) < 0:
        raise PersonalensError(f"personalbench.html_items: must be >= 0, got {pb.html_items}")
    notes = load_annotations(Path(pb.annotations)) if pb.annotations else Annotations()
    run = report.run_items(out_dir)
    others = [report.run_items(Path(d)) for d in pb.get("compare") or []]
    # items are the unit here, with the plain percentile interval of its scipy statistics (docs/personalbench.md)
    boot = Bootstrap(int(pb.bootstrap), int(cfg.seed), by_user=False, expanded=False)
    scores = report.score(run, notes, boot, others)
    tables = [*scores.tables, report.counts_table(report.input_summary(out_dir), run, notes, scores.unmatched)]
    files = report.write(tables, Path(pb.report_dir))
    write_html(
        out_dir,
        tables,
        [f for f in files if f.suffix == ".png"],
        notes,
        Path(pb.report_dir) / "report.html",
        bootstrap=boot,
        items=int(pb.html_items),
    )
    print(render.markdown(tables))
    print(f"personalbench: report written to {files[-1]}", file=console.err())
    return 0


def _require_run(out_dir: Path) -> None:
    if not (out_dir / "personalbench.yaml").is_file():
        raise PersonalensError(
            f"no PersonalBench run in {out_dir}: run `personalens personalbench run` with the same run.out_dir first"
        )


def personalbench(cfg: DictConfig, engines: Callable[[], dict] | None = None, stop: Stop | None = None) -> int:
    """`personalens personalbench run|export|score` (docs/personalbench.md)."""
    action = str(cfg.personalbench.action)  # the CLI has checked it against its actions
    return run(cfg, engines, stop=stop) if action == "run" else export(cfg) if action == "export" else score(cfg)
