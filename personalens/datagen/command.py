"""`personalens build` (a new dataset the way the paper made it, Appendix A) and `personalens
consistency` (the build's profile check, Figure 21, run alone on any data root): from the Hydra
config to the stages (docs/build.md)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig

from personalens import config as C
from personalens import console
from personalens.config import run as R
from personalens.engines.stop import Stop


@dataclass(frozen=True)
class Built:
    code: int  # the exit code
    root: Path | None = None  # the assembled data root, once it validates
    domains: tuple = ()  # the schema's domains it was built from (data.schema.Domain)
    stats_dir: Path | None = None  # where its statistics belong


def build(cfg: DictConfig, engine: Callable | None = None, stop: Stop | None = None) -> Built:
    """Build a PersonaLens-style dataset from a demographics table and a domain schema (docs/build.md);
    the CLI's `build` then describes the new data (validation's stats)."""
    from personalens.data import validate as check
    from personalens.datagen.pipeline import STAGE_TABLES
    from personalens.datagen.pipeline import build as run_build

    plan, runner, templates = _build_setup(cfg, engine, stop)
    result = run_build(plan, runner, templates)
    _write_consistency_table(result.verdicts, plan.out_dir / STAGE_TABLES / "consistency", cfg)
    print(result.line(runner), file=console.err())
    if not result.assembled:
        return Built(0)
    report = check(plan.out_dir)
    print(report.format(), file=console.out())
    if not report.ok:
        return Built(1)
    return Built(0, plan.out_dir, tuple(plan.domains), plan.out_dir / STAGE_TABLES / "stats")


def consistency(cfg: DictConfig, engine: Callable | None = None, stop: Stop | None = None) -> int:
    """Check the profiles of data.root (data.users, sharded like generate) with model@builder (Figure 21)."""
    from personalens.data import list_user_indices, load_user, user_indices
    from personalens.datagen.consistency import Profile, check_job
    from personalens.datagen.grammars import Limits
    from personalens.datagen.prompts import load_build_templates

    root = Path(cfg.data.root)
    selected = user_indices(cfg.data.users)
    indices = list(selected if selected is not None else list_user_indices(root))
    mine = indices[int(cfg.shard.index) :: int(cfg.shard.count)]
    templates = load_build_templates(cfg.datagen.prompts)
    limits = Limits(**C.plain(cfg.datagen.limits))
    out_dir = Path(cfg.run.out_dir)
    digest = C.fingerprint(
        {
            "builder": C.model_identity(cfg.builder),
            "sampling": C.plain(cfg.datagen.check_sampling),
            "max_tokens": int(cfg.datagen.max_tokens.consistency),
            "max_tokens_cap": int(cfg.datagen.max_tokens_cap),
            "limits": C.plain(cfg.datagen.limits),
            "template": templates.sources["consistency.txt"],
            "seed": int(cfg.datagen.seed),
            "data_root": str(root.resolve()),
        }
    )
    C.check_or_save(out_dir, "consistency", cfg, digest)
    profiles = []
    for index in mine:
        user = load_user(root, index)
        kept = {d: a for d, a in user.affinities.items() if user.interests.get(d) == 1 and a}
        profiles.append(Profile(user.user_id, index, user.demographics, kept))
    runner = _runner(cfg, out_dir, engine, digest, stop)
    found = runner.run("consistency", [check_job(templates, p, limits, (p.user_id,)) for p in profiles], active=True)
    _write_consistency_table([found[(p.user_id,)] for p in profiles], out_dir / "consistency", cfg)
    print(runner.summary(), file=console.err())
    return 0


def _write_consistency_table(verdicts, folder: Path, cfg: DictConfig) -> None:
    from personalens.datagen.consistency import flag_counts
    from personalens.datagen.flags import consistency_table
    from personalens.tables.render import markdown, write_tables

    if not verdicts:
        return
    table = consistency_table(flag_counts(verdicts), (("model", str(cfg.builder.name)),))
    folder.mkdir(parents=True, exist_ok=True)
    write_tables([table], folder, formats=("md", "csv"))
    print(markdown([table]), file=console.out())  # not print(): descriptor 1 is the log file by now


def _runner(cfg: DictConfig, root: Path, engine: Callable | None, digest: str, stop: Stop | None):
    from personalens.datagen.batch import Runner
    from personalens.engines.base import Sampling, sampling_from

    def sampling(stage: str) -> Sampling:
        section = cfg.datagen.check_sampling if stage == "consistency" else cfg.datagen.sampling
        return sampling_from(section, max_tokens=int(cfg.datagen.max_tokens[stage]))

    return Runner(
        root=root,
        shard=(int(cfg.shard.index), int(cfg.shard.count)),
        engine=engine or functools.cache(lambda: R.engine(cfg, "builder", stop)),
        sampling=sampling,
        seed=int(cfg.datagen.seed),
        retries=int(cfg.datagen.retries),
        max_tokens_cap=int(cfg.datagen.max_tokens_cap),
        chunk=int(cfg.datagen.chunk),
        config_hash=digest,
        progress=bool(cfg.progress),
    )


def _build_setup(cfg: DictConfig, engine: Callable | None, stop: Stop | None):
    """The build plan, its runner and templates from the config; refuses an output root built with
    another configuration."""
    import hashlib

    from personalens.data.schema import find_schema, load_schema
    from personalens.datagen.demographics import load_demographics
    from personalens.datagen.grammars import Limits
    from personalens.datagen.pipeline import STAGE_TABLES, BuildPlan, stage_names
    from personalens.datagen.prompts import load_build_templates

    b = cfg.datagen
    schema_path = find_schema(b.schema, cfg.data.root)
    domains = load_schema(schema_path, "all" if b.domains == "all" else list(b.domains))
    people = load_demographics(
        b.demographics.path,
        C.plain(b.demographics.columns),
        b.users if b.users == "all" else int(b.users),
        C.plain(b.demographics.skip),
    )
    templates = load_build_templates(b.prompts)
    out_dir = Path(b.out_dir)
    settings = {
        k: C.plain(v)
        for k, v in b.items()
        if k not in ("out_dir", "stages", "chunk", "schema", "prompts", "demographics")
    }
    digest = C.fingerprint(
        {
            "build": settings,
            "builder": C.model_identity(cfg.builder),
            "templates": dict(templates.sources),
            "schema": hashlib.sha256(schema_path.read_bytes()).hexdigest(),
            "demographics": [
                hashlib.sha256(Path(b.demographics.path).read_bytes()).hexdigest(),
                C.plain(b.demographics.columns),
                C.plain(b.demographics.skip),
            ],
        }
    )
    from personalens.engines.models.config import ModelConfig

    ModelConfig.from_mapping(cfg.builder, where="model@builder")  # a bad model config fails before anything is saved
    C.check_or_save(out_dir, "build", cfg, digest)
    index, count = int(cfg.shard.index), int(cfg.shard.count)
    plan = BuildPlan(
        out_dir=out_dir,
        people={i: p for i, p in enumerate(people) if i % count == index},
        domains=domains,
        stages=stage_names(list(b.stages)),
        sharded=count > 1,
        min_interests=int(b.interests.min_domains),
        sd_per_domain=int(b.tasks.sd_per_domain),
        md_count=int(b.tasks.md_count),
        md_per_request=int(b.tasks.md_per_request),
        md_span=(int(b.tasks.md_domains[0]), int(b.tasks.md_domains[1])),
        check=bool(b.consistency.check),
        max_regenerations=int(b.consistency.max_regenerations),
        limits=Limits(**C.plain(b.limits)),
    )
    return plan, _runner(cfg, out_dir / STAGE_TABLES, engine, digest, stop), templates
