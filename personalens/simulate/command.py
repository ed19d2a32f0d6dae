"""`personalens generate`: user-agent / assistant dialogues of this shard's scenarios, in lockstep."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from omegaconf import DictConfig

from personalens import config as C
from personalens import console
from personalens.config import run as R
from personalens.config.saved import start_date
from personalens.engines.stop import Stop

if TYPE_CHECKING:
    from personalens.engines.stop import Stop

ROLES = ("user_agent", "assistant")


def generate(cfg: DictConfig, engines: Callable[[], dict] | None = None, stop: Stop | None = None) -> int:
    """`stop`: checked after each lockstep step (engines/stop.py); a stopped run keeps every finished
    step's turns, and running it again resumes its dialogues from them."""
    from personalens.engines.placement.cohorts import setting as cohorts_setting
    from personalens.prompts.render import assistant_chat_turns
    from personalens.simulate.dialogue import EndRules
    from personalens.simulate.generate import Protocol, Scheduling
    from personalens.simulate.generate import generate as simulate
    from personalens.simulate.history import KEPT, check_history
    from personalens.store import (
        DIALOGUE_SCHEMA,
        KEY_COLUMNS,
        TRACE_SCHEMA,
        TURNS_SCHEMA,
        PartWriter,
        append_summary,
        existing_values,
        shard_dir,
        spec_decode_recorded,
        stored_turns,
    )

    fidelity = R.fidelity(cfg)
    scenarios = R.scenarios(cfg)
    setting = R.setting(cfg)
    family = R.prompt_family(cfg)
    templates, templates_digest = R.templates(cfg, fidelity)
    R.history_reasoning(cfg, "user_agent")
    keep = R.history_reasoning(cfg, "assistant")
    (user, user_chosen), (assistant, assistant_chosen) = R.sampling(cfg, "user_agent"), R.sampling(cfg, "assistant")
    sampling = {"user": user, "assistant": assistant}
    chosen = {"user_agent": user_chosen, "assistant": assistant_chosen}
    if keep in KEPT:  # refused before anything loads where the assistant would not see its thinking
        chat_turns = assistant_chat_turns(templates, setting, family)
        check_history(keep, str(cfg.assistant.name), chat_turns, *R.chat_template(cfg, "assistant"))
    out_dir = Path(cfg.run.out_dir)
    digest, parts = identity(cfg, chosen, templates_digest)
    # checks the models, their layout and chat templates before the config is saved
    load = engines or R.engines(cfg, ROLES, stop, first=next(iter(scenarios), None))
    count = cohorts_setting(cfg.lockstep.get("cohorts", "auto"), one=getattr(load, "in_process_core", False))
    # the spec-decode counters of its speculative models, recorded however it ends (engines/spec_decode.py)
    recorded = spec_decode_recorded(out_dir, "generate", cfg.shard.index, cfg.shard.count)
    with R.shard_lease(cfg, "generate", stop) as lease, recorded as drafts:
        # fixed for the run once its config is checked, before any model loads or server starts: they render with it
        date = start_date(out_dir, fix=True)
        resolved = {
            **R.resolved(cfg, ROLES, load),
            "sampling": {role: c.record() for role, c in chosen.items()},
            "start_date": date,
        }
        C.check_or_save(out_dir, "generate", cfg, digest, resolved, parts, ROLES)
        folder = shard_dir(out_dir, "dialogues", cfg.shard.index, cfg.shard.count)
        turns = shard_dir(out_dir, "turns", cfg.shard.index, cfg.shard.count)
        done = existing_values(folder, KEY_COLUMNS)
        print(f"generate: fidelity option {fidelity.name}, assistant prompt family {family}", file=console.err())
        summary = simulate(
            scenarios,
            setting=setting,
            templates=templates,
            load_engines=lambda: drafts.seen({"user": load()["user_agent"], "assistant": load()["assistant"]}),
            protocol=Protocol(
                cfg.protocol.max_rounds_sd,
                cfg.protocol.max_rounds_md,
                sampling,
                EndRules(fidelity.terminate, fidelity.reply_after_cap),
                context_room(cfg.protocol.get("context_room")),
            ),
            trials=int(cfg.trials),
            seed=int(cfg.seed),
            # each part lands only while the lease is still this invocation's (store/lease.py)
            writer=PartWriter(folder, DIALOGUE_SCHEMA, lease.confirm),
            trace_writer=PartWriter(
                shard_dir(out_dir, "trace", cfg.shard.index, cfg.shard.count), TRACE_SCHEMA, lease.confirm
            ),
            turn_writer=PartWriter(turns, TURNS_SCHEMA, lease.confirm),
            stored=stored_turns(turns, skip=done),
            stop=stop,
            done=done,
            run_id=str(cfg.run.name),
            config_hash=digest,
            progress=bool(cfg.progress),
            family=family,
            history_reasoning=keep,
            scheduling=Scheduling(
                str(cfg.scheduling),
                int(cfg.lockstep.max_requests_per_call),
                bool(cfg.lockstep.token_ids),
                int(cfg.continuous.in_flight) if "continuous" in cfg else 0,  # scheduling=continuous's alone
                count,
                in_flight(cfg.lockstep.get("in_flight", "auto")),
                tuple(getattr(load, "caches", ())),  # the layout's (engines/factory.py); none without GPUs
            ),
        )
        if summary.dialogues:
            lease.confirm()
            append_summary(out_dir, "generate", cfg.shard.index, cfg.shard.count, summary)
    return 0


def identity(cfg: DictConfig, chosen: dict, templates_digest: str) -> tuple[str, dict]:
    """The run's fingerprint and the parts it hashes: what its dialogues depend on (`chosen`: the dialogue
    roles' resolved sampling, config/sampling.py)."""
    parts = {
        "assistant": C.model_identity(cfg.assistant),
        "user_agent": C.model_identity(cfg.user_agent),
        # context_room at its default (null) is left out, so runs started before it still resume
        "protocol": {
            k: chosen[k].identity() if k in chosen else C.sampling_identity(v)
            for k, v in cfg.protocol.items()
            if k != "judge" and not (k == "context_room" and v is None)
        },
        "templates": templates_digest,
        "seed": int(cfg.seed),
        "data_root": str(Path(cfg.data.root).resolve()),
        "fidelity": R.fidelity(cfg).identity(),
        **C.run_options(cfg),
    }
    return C.fingerprint(parts), parts


def in_flight(value: object) -> int:
    """lockstep.in_flight, checked: auto (window.py AUTO), all (0) or a whole number >= 1."""
    from personalens.errors import PersonalensError
    from personalens.simulate.window import AUTO

    if value in ("auto", "all"):
        return AUTO if value == "auto" else 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PersonalensError(f"lockstep.in_flight: expected auto, all or a whole number >= 1, got {value!r}")
    return value


def context_room(value: object) -> int | None:
    """protocol.context_room, checked: null or a whole number of tokens >= 0."""
    from personalens.errors import PersonalensError

    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise PersonalensError(f"protocol.context_room: expected null or a number of tokens >= 0, got {value!r}")
    return value
