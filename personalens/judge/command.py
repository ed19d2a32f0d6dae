"""`personalens judge`: score this shard's dialogues with the judge model, and with every further judge of
a panel (`judges`, config/judges.py)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from omegaconf import DictConfig

from personalens import config as C
from personalens import console
from personalens.config import run as R
from personalens.config.judges import DEFAULT, panel
from personalens.config.saved import start_date
from personalens.engines.stop import Stop
from personalens.errors import PersonalensError

if TYPE_CHECKING:
    from personalens.engines.spec_decode import SpecDecodeWatch
    from personalens.engines.stop import Stop


def judge(
    cfg: DictConfig,
    engines: Callable[[], dict] | None = None,
    stop: Stop | None = None,
    planned: list[JudgeGroup] | None = None,
) -> int:
    """Score this shard's dialogues with every judge of the panel (model@judge, then `judges`), one
    after another, each into the judgments under its own key and resumable on its own; judges with
    one model config share its engine. Every model's layout is planned (and refused when it cannot
    fit) before any loads; then each model is loaded, used and closed, its managed servers stopped,
    before the next loads. `engines`: model@judge's (`run` passes the engines it generated with);
    `planned`: the groups `judge_groups` planned (`run` plans them before generating). `stop`:
    checked after each part file of judgments (engines/stop.py); running it again resumes."""
    from personalens.store import spec_decode_recorded

    scenarios = R.scenarios(cfg)
    groups = planned if planned is not None else judge_groups(cfg, engines, stop, scenarios)
    out_dir = Path(cfg.run.out_dir)
    date = start_date(out_dir)  # before a model loads or its server starts: they render with it
    with R.shard_lease(cfg, "judge", stop) as lease:
        for i, group in enumerate(groups):  # model@judge's group first
            # its model's spec-decode counters, recorded however it ends (engines/spec_decode.py)
            recorded = spec_decode_recorded(out_dir, "judge", cfg.shard.index, cfg.shard.count)
            try:
                with recorded as drafts:
                    for member in group.members:  # each part lands only while the lease is this command's
                        args = (member.cfg, member.saved, member.name, group.load, scenarios, date, stop)
                        judge_one(*args, drafts, lease.confirm)
            finally:
                if not group.shared or i + 1 < len(groups):  # `run`'s, when last, end with the command
                    getattr(group.load, "close", lambda: None)()
    return 0


@dataclass(frozen=True)
class JudgeGroup:
    members: list  # the panel judges of one model config (config/judges.py PanelJudge)
    load: Callable[[], dict]  # its engines: an EngineLoader, planned and not loaded, or `run`'s
    shared: bool  # `load` is the engines `run` generated with


def judge_groups(
    cfg: DictConfig, engines: Callable[[], dict] | None, stop: Stop | None, scenarios: list | None = None
) -> list[JudgeGroup]:
    """The panel's judges grouped by model config, model@judge's first, each group's layout planned
    (a layout that cannot fit refused now, before any model loads); `engines` serve model@judge's
    group where given. Two entries that are one judge are refused."""
    judges = checked_panel(cfg)
    first = next(iter(scenarios if scenarios is not None else R.scenarios(cfg)), None)
    by_model: dict[str, list] = {}
    for member in judges:
        by_model.setdefault(member.model, []).append(member)
    return [
        JudgeGroup(members, engines, True)
        if engines is not None and i == 0
        else JudgeGroup(members, R.engines(members[0].cfg, ("judge",), stop, first=first), False)
        for i, members in enumerate(by_model.values())
    ]


def checked_panel(cfg: DictConfig) -> list:
    """The judge panel (config/judges.py), each judge's sampling and prompts checked (a bad value named
    with its entry) and no two entries one judge, which would write the same rows: `run` calls this
    before generating, so a panel that cannot judge stops it before any dialogue is simulated."""
    judges = panel(cfg)
    keys = {}
    for member in judges:
        try:
            key = identity(member.cfg)[0]
        except PersonalensError as err:
            if member.name == DEFAULT:
                raise
            raise PersonalensError(f"judges entry {member.name!r}: {err}") from None
        if key in keys:
            raise PersonalensError(
                f"judges: {member.name} is the same judge as {keys[key]} (model, sampling and prompts): drop one"
            )
        keys[key] = member.name
    return judges


def identity(cfg: DictConfig) -> tuple[str, dict]:
    """A judge's key (the fingerprint its rows and its saved config carry) and the parts it hashes:
    what a judgment depends on besides its dialogue."""
    fidelity = R.fidelity(cfg)
    _, templates_digest = R.templates(cfg, fidelity)
    _, chosen = R.sampling(cfg, "judge")
    parts = {
        "judge": C.model_identity(cfg.judge),
        "sampling": chosen.identity(),
        "templates": templates_digest,
        "turn_level": bool(cfg.judging.turn_level),
        "fidelity": fidelity.identity(),
        **C.run_options(cfg),
    }
    return C.fingerprint(parts), parts


def judge_one(
    cfg: DictConfig,
    saved: str,
    name: str,
    load: Callable[[], dict],
    scenarios: list,
    date: str,
    stop: Stop | None,
    drafts: SpecDecodeWatch,
    guard: Callable[[], None] | None = None,
) -> None:
    """One judge of the panel: its config saved as `<saved>.yaml` (refused when that name was saved
    under another judge) with the run's `date`, then what it has not judged yet; `drafts`: shown the
    engines it gets, for their spec-decode counters (engines/spec_decode.py); `guard`: called before
    each part of judgments lands (the shard lease's confirm, store/lease.py)."""
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
    templates, _ = R.templates(cfg, fidelity)
    R.history_reasoning(cfg, "judge")
    sampling, chosen = R.sampling(cfg, "judge")
    formats, chunk = settings(cfg)
    digest, parts = identity(cfg)
    # checks the model, its layout and its chat template before the config is saved
    resolved = {**R.resolved(cfg, ("judge",), load), "sampling": {"judge": chosen.record()}, "start_date": date}
    C.check_or_save(out_dir, saved, cfg, digest, resolved, parts, ("judge",))
    print(f"judge: fidelity option {fidelity.name}; judge {name} ({cfg.judge.name}), key {digest}", file=console.err())
    summary = score(
        dialogues.to_pylist(),
        {s.key: s for s in scenarios},
        templates=templates,
        load_engine=lambda: drafts.seen(load())["judge"],
        sampling=sampling,
        dimensions=list(cfg.judging.dimensions),
        turn_level=bool(cfg.judging.turn_level),
        folder=shard_dir(out_dir, "judgments", cfg.shard.index, cfg.shard.count),
        progress=bool(cfg.progress),
        formats=formats,
        chunk=chunk,
        stop=stop,
        judge_key=digest,
        legacy=saved == DEFAULT,
        guard=guard,
    )
    if summary.judgments:
        if guard is not None:
            guard()
        append_summary(out_dir, "judge", cfg.shard.index, cfg.shard.count, summary)


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
