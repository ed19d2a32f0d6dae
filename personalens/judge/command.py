"""`personalens judge`: score this shard's dialogues with the judge model."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from omegaconf import DictConfig

from personalens import config as C
from personalens import console
from personalens.config import run as R
from personalens.config.saved import start_date
from personalens.engines.stop import Stop
from personalens.errors import PersonalensError

if TYPE_CHECKING:
    from personalens.engines.stop import Stop


def judge(cfg: DictConfig, engines: Callable[[], dict] | None = None, stop: Stop | None = None) -> int:
    """`stop`: checked after each part file of judgments (engines/stop.py); running it again resumes."""
    from personalens.judge.run import judge as score
    from personalens.store import append_summary, read_table, shard_dir

    fidelity = R.fidelity(cfg)
    out_dir = Path(cfg.run.out_dir)
    dialogues = read_table(shard_dir(out_dir, "dialogues", cfg.shard.index, cfg.shard.count))
    if dialogues is None:
        raise PersonalensError(
            f"no dialogues in {shard_dir(out_dir, 'dialogues', cfg.shard.index, cfg.shard.count)}: "
            "run `personalens generate` with the same run.out_dir and shard first"
        )
    templates, templates_digest = R.templates(cfg, fidelity)
    R.history_reasoning(cfg, "judge")
    sampling, chosen = R.sampling(cfg, "judge")
    formats, chunk = settings(cfg)
    parts = {
        "judge": C.model_identity(cfg.judge),
        "sampling": chosen.identity(),
        "templates": templates_digest,
        "turn_level": bool(cfg.judging.turn_level),
        "fidelity": fidelity.identity(),
        **C.run_options(cfg),
    }
    digest = C.fingerprint(parts)
    scenarios = R.scenarios(cfg)
    date = start_date(out_dir)  # before the model loads or its server starts: they render with it
    # checks the model, its layout and its chat template before the config is saved
    load = engines or R.engines(cfg, ("judge",), stop, first=next(iter(scenarios), None))
    with R.shard_lease(cfg, "judge", stop):
        resolved = {**R.resolved(cfg, ("judge",), load), "sampling": {"judge": chosen.record()}, "start_date": date}
        C.check_or_save(out_dir, "judge", cfg, digest, resolved, parts, ("judge",))
        print(f"judge: fidelity option {fidelity.name}", file=console.err())
        summary = score(
            dialogues.to_pylist(),
            {s.key: s for s in scenarios},
            templates=templates,
            load_engine=lambda: load()["judge"],
            sampling=sampling,
            dimensions=list(cfg.judging.dimensions),
            turn_level=bool(cfg.judging.turn_level),
            folder=shard_dir(out_dir, "judgments", cfg.shard.index, cfg.shard.count),
            progress=bool(cfg.progress),
            formats=formats,
            chunk=chunk,
            stop=stop,
        )
        if summary.judgments:
            append_summary(out_dir, "judge", cfg.shard.index, cfg.shard.count, summary)
    return 0


def settings(cfg: DictConfig) -> tuple[Mapping, int]:
    """The judge's output formats and chunk size, checked: `run` calls this before generating, so a
    judge setting that cannot work stops the command before any dialogue is simulated."""
    from personalens.judge.formats import formats_named

    try:
        formats = formats_named(R.fidelity(cfg).judge_format, int(cfg.protocol.judge.max_tokens))
    except ValueError as err:
        raise PersonalensError(f"fidelity.judge_format: {err}") from None
    chunk = int(cfg.judging.chunk)
    if chunk < 1:
        raise PersonalensError(f"judging.chunk must be at least 1 (judgments per generate call), not {chunk}")
    return formats, chunk
