"""The subcommands: each takes the resolved Hydra config and returns an exit code.

Heavy imports (vLLM, torch) happen inside the commands that need them."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

from omegaconf import DictConfig

from personalens import config as C
from personalens import console
from personalens.errors import PersonalensError


def validate(cfg: DictConfig) -> int:
    from personalens.data import validate as check

    report = check(Path(cfg.data.root), strict=bool(cfg.data.strict))
    print(report.format())
    return 0 if report.ok else 1


def generate(cfg: DictConfig, engines: Callable[[], dict] | None = None) -> int:
    from personalens.simulate.dialogue import EndRules
    from personalens.simulate.generate import Protocol
    from personalens.simulate.generate import generate as simulate
    from personalens.store import DIALOGUE_SCHEMA, KEY_COLUMNS, PartWriter, existing_values, shard_dir

    scenarios = _scenarios(cfg)
    setting = _setting(cfg)
    family = _prompt_family(cfg)
    templates, templates_digest = _templates(cfg)
    out_dir = Path(cfg.run.out_dir)
    digest = C.fingerprint(
        {
            "assistant": C.model_identity(cfg.assistant),
            "user_agent": C.model_identity(cfg.user_agent),
            "protocol": {k: C.plain(v) for k, v in cfg.protocol.items() if k != "judge"},
            "templates": templates_digest,
            "seed": int(cfg.seed),
            "data_root": str(Path(cfg.data.root).resolve()),
            "fidelity": _fidelity_identity(cfg),
        }
    )
    _check_models(cfg, ("user_agent", "assistant"))  # before the config is saved as this run's
    C.check_or_save(out_dir, "generate", cfg, digest, _resolved(cfg, ("user_agent", "assistant")))
    folder = shard_dir(out_dir, "dialogues", cfg.shard.index, cfg.shard.count)
    load = engines or functools.cache(lambda: _engines(cfg, ("user_agent", "assistant")))
    print(f"generate: fidelity option {cfg.fidelity.name}, assistant prompt family {family}", file=console.err())
    simulate(
        scenarios,
        setting=setting,
        templates=templates,
        load_engines=lambda: {"user": load()["user_agent"], "assistant": load()["assistant"]},
        protocol=Protocol(
            cfg.protocol.max_rounds_sd,
            cfg.protocol.max_rounds_md,
            {"user": C.sampling(cfg.protocol.user_agent), "assistant": C.sampling(cfg.protocol.assistant)},
            EndRules(str(cfg.fidelity.terminate), bool(cfg.fidelity.reply_after_cap)),
        ),
        trials=int(cfg.trials),
        seed=int(cfg.seed),
        writer=PartWriter(folder, DIALOGUE_SCHEMA),
        done=existing_values(folder, KEY_COLUMNS),
        run_id=str(cfg.run.name),
        config_hash=digest,
        progress=bool(cfg.progress),
        family=family,
    )
    return 0


def judge(cfg: DictConfig, engines: Callable[[], dict] | None = None) -> int:
    from personalens.judge.formats import formats_named
    from personalens.judge.run import judge as score
    from personalens.store import read_table, shard_dir

    out_dir = Path(cfg.run.out_dir)
    dialogues = read_table(shard_dir(out_dir, "dialogues", cfg.shard.index, cfg.shard.count))
    if dialogues is None:
        raise PersonalensError(
            f"no dialogues in {shard_dir(out_dir, 'dialogues', cfg.shard.index, cfg.shard.count)}: "
            "run `personalens generate` with the same run.out_dir and shard first"
        )
    templates, templates_digest = _templates(cfg)
    try:
        formats = formats_named(str(cfg.fidelity.judge_format), int(cfg.protocol.judge.max_tokens))
    except ValueError as err:
        raise PersonalensError(f"fidelity.judge_format: {err}") from None
    digest = C.fingerprint(
        {
            "judge": C.model_identity(cfg.judge),
            "sampling": C.plain(cfg.protocol.judge),
            "templates": templates_digest,
            "turn_level": bool(cfg.judging.turn_level),
            "fidelity": _fidelity_identity(cfg),
        }
    )
    _check_models(cfg, ("judge",))
    C.check_or_save(out_dir, "judge", cfg, digest, _resolved(cfg, ("judge",)))
    load = engines or functools.cache(lambda: _engines(cfg, ("judge",)))
    print(f"judge: fidelity option {cfg.fidelity.name}", file=console.err())
    score(
        dialogues.to_pylist(),
        {s.key: s for s in _scenarios(cfg)},
        templates=templates,
        load_engine=lambda: load()["judge"],
        sampling=C.sampling(cfg.protocol.judge),
        dimensions=list(cfg.judging.dimensions),
        turn_level=bool(cfg.judging.turn_level),
        folder=shard_dir(out_dir, "judgments", cfg.shard.index, cfg.shard.count),
        progress=bool(cfg.progress),
        formats=formats,
    )
    return 0


def merge(cfg: DictConfig) -> int:
    from personalens.data import assign_shards, scenario_counts
    from personalens.merge import merge as check

    scenarios = _selection(cfg)
    label = _setting(cfg).label
    assignment = assign_shards(scenario_counts(scenarios), int(cfg.shard.count))
    expected = {
        (s.user.user_id, s.task.task_id, label, t): assignment[s.user.index]
        for s in scenarios
        for t in range(int(cfg.trials))
    }
    result = check(Path(cfg.run.out_dir), expected, list(cfg.judging.dimensions), int(cfg.shard.count))
    print(result.format())
    return 0 if result.ok else 1


def report(cfg: DictConfig) -> int:
    from personalens.report import build_report

    runs = [Path(r) for r in (cfg.report.runs or [cfg.run.out_dir])]
    result = build_report(
        runs,
        Path(cfg.report.out_dir),
        bootstrap=int(cfg.report.bootstrap),
        seed=int(cfg.seed),
        figure5_domains=list(cfg.report.figure5_domains),
        html_dialogues=int(cfg.report.html_dialogues),
    )
    print(result.table3_markdown(), file=console.out())
    print(f"\nreport written to {cfg.report.out_dir}", file=console.err())
    return 0


def run(cfg: DictConfig) -> int:
    """generate, judge and report in one process, loading each model once (and only if needed)."""
    engines = functools.cache(lambda: _engines(cfg, ("user_agent", "assistant", "judge")))
    return generate(cfg, engines) or judge(cfg, engines) or report(cfg)


def _selection(cfg: DictConfig):
    """Every scenario of the selected users and kinds."""
    from personalens.data import load_scenarios

    return load_scenarios(Path(cfg.data.root), cfg.data.users, cfg.data.kinds, strict=bool(cfg.data.strict))


def _scenarios(cfg: DictConfig):
    """The scenarios of this shard."""
    from personalens.data import shard

    return shard(_selection(cfg), int(cfg.shard.index), int(cfg.shard.count))


def _setting(cfg: DictConfig):
    from personalens.prompts.setting import PromptSetting

    try:
        return PromptSetting(
            mode=cfg.prompt.mode,
            demographics=bool(cfg.prompt.demographics),
            interactions=bool(cfg.prompt.interactions),
            situation=bool(cfg.prompt.situation),
        )
    except ValueError as err:
        raise PersonalensError(f"prompt: {err}") from None


def _templates(cfg: DictConfig):
    """The fidelity option's template set, or the folder prompt.dir names, with the option's rules."""
    from personalens.prompts.sections import STYLES
    from personalens.prompts.templates import load_templates

    rules = cfg.fidelity.prompts
    if rules.style not in STYLES:
        raise PersonalensError(f"fidelity.prompts.style: {rules.style!r} is not one of {', '.join(STYLES)}")
    templates = load_templates(cfg.prompt.dir or rules.dir, style=str(rules.style), verbatim=bool(rules.verbatim))
    return templates, C.fingerprint(dict(templates.sources))


def _fidelity_identity(cfg: DictConfig) -> dict:
    """The fidelity option as it shapes results: its rules, not where its template folder lies
    (the templates' text is fingerprinted by itself)."""
    identity = C.plain(cfg.fidelity)
    identity["prompts"] = {k: v for k, v in identity["prompts"].items() if k != "dir"}
    return identity


def _prompt_family(cfg: DictConfig) -> str:
    from personalens.prompts.render import FAMILIES

    family = str(cfg.assistant.get("prompt_family", "default"))
    if family not in FAMILIES:
        raise PersonalensError(f"assistant.prompt_family: {family!r} is not one of {', '.join(FAMILIES)}")
    return family


def _check_models(cfg: DictConfig, roles: tuple[str, ...]) -> None:
    from personalens.engines.factory import model_configs

    model_configs({role: cfg[role] for role in roles})


def _resolved(cfg: DictConfig, roles: tuple[str, ...]) -> dict:
    """What each in-process model's `dtype` means on this machine, kept in the saved config (the
    fingerprint keeps the configured value, so shards on different CPUs still form one run)."""
    from personalens.engines.dtype import local_dtype

    return {role: {"dtype": vars(local_dtype(str(cfg[role].dtype)))} for role in roles if cfg[role].engine == "vllm"}


def _engines(cfg: DictConfig, roles: tuple[str, ...]) -> dict:
    from personalens.engines.factory import build_engines

    return build_engines({role: cfg[role] for role in roles})


def stats(cfg: DictConfig) -> int:
    from personalens.validation.build import build_stats

    result = build_stats(
        Path(cfg.data.root), cfg.data.users, cfg.stats.schema and Path(cfg.stats.schema), Path(cfg.stats.out_dir)
    )
    print(result.markdown())
    for message in result.messages:
        print(f"personalens stats: {message}", file=console.err())
    print(f"\nstats written to {cfg.stats.out_dir}", file=console.err())
    return 0


def diversity(cfg: DictConfig) -> int:
    from personalens.validation.build import build_diversity
    from personalens.validation.diversity import Protocol

    d = cfg.diversity
    source = Path(d.input) if d.input else Path(cfg.run.out_dir) / "dialogues"
    protocol = Protocol(int(d.token_budget), int(d.repeats), int(d.self_bleu_hypotheses), int(cfg.seed))
    result = build_diversity(source, protocol, bool(d.by_speaker), Path(d.out_dir))
    print(result.markdown())
    print(f"\ndiversity of {source} written to {d.out_dir}", file=console.err())
    return 0


def build(cfg: DictConfig, engine: Callable | None = None) -> int:
    """Build a PersonaLens-style dataset from a demographics table and a domain schema (docs/build.md)."""
    from personalens.data import validate as check
    from personalens.datagen.pipeline import STAGE_TABLES
    from personalens.datagen.pipeline import build as run_build
    from personalens.validation.build import built_data_stats

    plan, runner, templates = _build_setup(cfg, engine)
    result = run_build(plan, runner, templates)
    _write_consistency_table(result.verdicts, plan.out_dir / STAGE_TABLES / "consistency", cfg)
    print(result.line(runner), file=console.err())
    if not result.assembled:
        return 0
    report = check(plan.out_dir)
    print(report.format(), file=console.out())
    if not report.ok:
        return 1
    # what `personalens stats` shows of the new data, with the schema it was built from
    stats = built_data_stats(plan.out_dir, plan.domains, plan.out_dir / STAGE_TABLES / "stats")
    print(stats.markdown(), file=console.out())
    print(
        f"build: Table 1 and Tables 8-9 of the new data written to {plan.out_dir / STAGE_TABLES / 'stats'}",
        file=console.err(),
    )
    return 0


def consistency(cfg: DictConfig, engine: Callable | None = None) -> int:
    """Check the profiles of data.root (data.users, sharded like generate) with model@builder (Figure 21)."""
    from personalens.data import list_user_indices, load_user, user_indices
    from personalens.datagen.consistency import Profile, check_job
    from personalens.datagen.grammars import Limits
    from personalens.datagen.prompts import load_build_templates

    root = Path(cfg.data.root)
    selected = user_indices(cfg.data.users)
    indices = list(selected if selected is not None else list_user_indices(root))
    mine = indices[int(cfg.shard.index) :: int(cfg.shard.count)]
    templates = load_build_templates(cfg.build.prompts)
    limits = Limits(**C.plain(cfg.build.limits))
    out_dir = Path(cfg.run.out_dir)
    digest = C.fingerprint(
        {
            "builder": C.model_identity(cfg.builder),
            "sampling": C.plain(cfg.build.check_sampling),
            "max_tokens": int(cfg.build.max_tokens.consistency),
            "limits": C.plain(cfg.build.limits),
            "template": templates.sources["consistency.txt"],
            "seed": int(cfg.build.seed),
            "data_root": str(root.resolve()),
        }
    )
    C.check_or_save(out_dir, "consistency", cfg, digest)
    profiles = []
    for index in mine:
        user = load_user(root, index)
        kept = {d: a for d, a in user.affinities.items() if user.interests.get(d) == 1 and a}
        profiles.append(Profile(user.user_id, index, user.demographics, kept))
    runner = _runner(cfg, out_dir, engine, digest)
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


def _runner(cfg: DictConfig, root: Path, engine: Callable | None, digest: str):
    from personalens.datagen.batch import Runner
    from personalens.engines.base import Sampling

    def sampling(stage: str) -> Sampling:
        section = cfg.build.check_sampling if stage == "consistency" else cfg.build.sampling
        return Sampling(
            temperature=float(section.temperature),
            top_p=float(section.top_p),
            max_tokens=int(cfg.build.max_tokens[stage]),
        )

    return Runner(
        root=root,
        shard=(int(cfg.shard.index), int(cfg.shard.count)),
        engine=engine or functools.cache(lambda: _builder_engine(cfg)),
        sampling=sampling,
        seed=int(cfg.build.seed),
        retries=int(cfg.build.retries),
        chunk=int(cfg.build.chunk),
        config_hash=digest,
        progress=bool(cfg.progress),
    )


def _builder_engine(cfg: DictConfig):
    from personalens.engines.config import ModelConfig
    from personalens.engines.factory import build_engine

    return build_engine(ModelConfig.from_mapping(cfg.builder, where="model@builder"))


def _build_setup(cfg: DictConfig, engine: Callable | None):
    """The build plan, its runner and templates from the config; refuses an output root built with
    another configuration."""
    import hashlib

    from personalens.data.schema import find_schema, load_schema
    from personalens.datagen.demographics import load_demographics
    from personalens.datagen.grammars import Limits
    from personalens.datagen.pipeline import STAGE_TABLES, BuildPlan, stage_names
    from personalens.datagen.prompts import load_build_templates

    b = cfg.build
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
    from personalens.engines.config import ModelConfig

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
    return plan, _runner(cfg, out_dir / STAGE_TABLES, engine, digest), templates


def agreement(cfg: DictConfig) -> int:
    """`agreement export`: annotation sheet and guide for a sample of run.out_dir's dialogues;
    `agreement score`: Table 5 from the filled sheets (docs/agreement.md)."""
    from personalens.tables.stats import Bootstrap

    out_dir, run_dir = Path(cfg.agreement.out_dir), Path(cfg.run.out_dir)
    if cfg.agreement.action == "export":
        from personalens.agreement import export
        from personalens.data import load_scenarios

        done = export(
            run_dir,
            lambda users: load_scenarios(Path(cfg.data.root), users, "both"),
            out_dir,
            dialogues=int(cfg.agreement.dialogues),
            seed=int(cfg.seed),
        )
        kinds = [item["kind"] for item in done.items]
        print(f"export {done.export_id}: {len(kinds)} dialogues ({kinds.count('SD')} SD, {kinds.count('MD')} MD)")
        print("\n".join(f"  {path}" for path in done.files))
        return 0
    from personalens.agreement import score_sheets
    from personalens.tables import render
    from personalens.tables.render import write_tables

    table = score_sheets(
        out_dir, [Path(p) for p in cfg.agreement.sheets], run_dir, Bootstrap(int(cfg.report.bootstrap), int(cfg.seed))
    )
    print(render.markdown([table]))
    print(f"written: {', '.join(map(str, write_tables([table], out_dir)))}", file=console.err())
    return 0


def personalbench(cfg: DictConfig, engines: Callable[[], dict] | None = None) -> int:
    """`personalens personalbench run|export|score` (docs/personalbench.md)."""
    from personalens.personalbench import command

    action = str(cfg.personalbench.action)  # the CLI has checked it against cli.ACTIONS
    return command.run(cfg, engines) if action == "run" else getattr(command, action)(cfg)
