"""`personalens plan`: a dry run of this config that loads no model (nor vLLM, nor torch): the selection
and its shards, where each model would run and the memory it gets (engines/placement/layout.py, the
layout the commands take), the token budget from the real templates and tokenizers, and the time per shard
from a measured or given throughput. Printed, and written to plan.json."""

from __future__ import annotations

import json
from collections import Counter

from omegaconf import DictConfig

from personalens import console
from personalens.config import run as R
from personalens.errors import PersonalensError
from personalens.plan.options import JOBS, PlanOptions


def plan(cfg: DictConfig) -> int:
    from personalens.config.roles import roles as resolve_roles
    from personalens.engines.factory import ROLES, model_configs
    from personalens.engines.placement.gpus import visible_gpu_spec
    from personalens.plan.estimate import estimate
    from personalens.plan.judges import self_preference
    from personalens.plan.noise import advice
    from personalens.plan.noise import lines as noise_lines
    from personalens.plan.text import lines

    options = PlanOptions.from_config(cfg)
    roles = resolve_roles(cfg)  # refused here, before anything is counted, where a role's sampling cannot run
    for line in roles.notes:
        print(line, file=console.err())
    scenarios = R.selection(cfg)
    if not scenarios:
        raise PersonalensError("the selection holds no scenario (data.users, data.kinds)")
    models = model_configs({role: cfg[role] for role in ROLES})
    R.check_templates(cfg, models, scenarios[0])  # a template that refuses the run's prompts: refused here too
    gpus = described(options) if options.gpus else visible_gpu_spec()
    chosen = selection(cfg, scenarios)
    placed: dict = {}

    def modelled(workload, measured):
        placed.update(placement(cfg, models, options, gpus, workload, chosen["largest_shard"], measured))
        return modelled_rates(placed, options.gpu_type)

    estimated, workload, measured = estimate(cfg, options, scenarios, models, modelled)
    result = {
        "command": "personalens plan",
        "roles": roles.as_dict(),
        "selection": chosen,
        "placement": placed,
        "reproducible": reproducibility(cfg, gpus, given=bool(options.gpus)),
        **estimated,
    }
    servers = external(cfg, models, estimated["tokens"])
    if servers:
        result["servers"] = servers
    result["self_preference"] = self_preference(cfg)
    if cfg.plan.get("noise_from"):
        result["noise"] = advice(cfg, estimated, chosen["users"], sum(chosen["scenarios"].values()), options.gpus)
    for line in [
        *lines(result),
        *result["self_preference"],
        *(noise_lines(result["noise"]) if "noise" in result else []),
    ]:
        print(line, file=console.out())
    options.out.parent.mkdir(parents=True, exist_ok=True)
    options.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"plan: wrote {options.out}", file=console.err())
    return 2 if any("refused" in job for job in result["placement"].get("jobs", {}).values()) else 0


def external(cfg: DictConfig, models: dict, tokens: dict) -> dict:
    """The `vllm serve` line and checklist of each role served by the lab (plan/served.py)."""
    from personalens.config.core import plain
    from personalens.plan.estimate import _reply_tokens
    from personalens.plan.served import external_servers

    longest = tokens.get("longest_prompts_at_cap")
    raw = {role: plain(cfg[role]) for role in ("user_agent", "assistant", "judge")}
    return external_servers(raw, models, longest, _reply_tokens(cfg)[0] if longest else None)


def described(options: PlanOptions):
    """The GPUs plan.gpus and plan.gpu_memory_gib describe, of plan.gpu_type's compute capability."""
    import dataclasses

    from personalens.engines.placement.gpus import simulated
    from personalens.plan.gpu_model import GPUS

    gpus = simulated(options.gpus, options.gpu_memory_gib)
    return dataclasses.replace(gpus, capabilities=(GPUS[options.gpu_type].capability,) * gpus.count)


def selection(cfg: DictConfig, scenarios: list) -> dict:
    from personalens.plan.schedule import shard_loads

    trials, count = int(cfg.trials), int(cfg.shard.count)
    kinds = Counter(s.task.kind for s in scenarios)  # SD first, as the data lists them
    loads = shard_loads(scenarios, count, trials)
    return {
        "data_root": str(cfg.data.root),
        "users": len({s.user.index for s in scenarios}),
        "scenarios": dict(kinds),
        "trials": trials,
        "dialogues": {kind: n * trials for kind, n in kinds.items()},
        "shards": count,
        "largest_shard": max(loads, key=lambda load: sum(load.values())),
        **({"written": written} if (written := progress(cfg, count)) else {}),
    }


def progress(cfg: DictConfig, count: int) -> dict | None:
    """What run.out_dir already holds of this shard count's dialogues: those written whole, and those
    a stopped `generate` partly simulated (turns stored), by shard, which running it again resumes
    (store/turns.py); None where it holds none."""
    from pathlib import Path

    from personalens.store import KEY_COLUMNS, existing_values, partial_dialogues, shard_dir

    out_dir, written, partial = Path(cfg.run.out_dir), 0, {}
    for index in range(count):
        done = existing_values(shard_dir(out_dir, "dialogues", index, count), KEY_COLUMNS)
        stored = partial_dialogues(shard_dir(out_dir, "turns", index, count), done)
        written += len(done)
        if stored:
            partial[index] = {"dialogues": len(stored), "turns": sum(stored.values())}
    return {"dialogues": written, "partial_shards": partial} if written or partial else None


def kv_refusals(configs: dict, gpus, gpu_type: str) -> str | None:
    """The KV options the job's GPUs cannot run (engines/vllm/kv.py), as the job would refuse them
    when it starts; whether the installed vLLM takes them is the job's own check."""
    from personalens.engines.vllm.kv import kv_refusal

    found = [
        why
        for config in dict.fromkeys(configs.values())
        if config.engine == "vllm"
        and (why := kv_refusal(config, gpus=gpus, cpu_build=False, cpu_flags=(), takes=lambda _: True))
    ]
    return f"{'; '.join(found)} (plan.gpu_type={gpu_type})" if found else None


def modelled_rates(placed: dict, gpu_type: str):
    """The generate and judge jobs' rates from their chosen layouts' modelled throughput (a `run` job's
    for both where it is the one planned); None where neither is modelled (no GPUs, served models)."""
    from personalens.plan.schedule import Rates

    def rate(job: str) -> float | None:
        modelled = ((placed.get("jobs") or {}).get(job) or {}).get("throughput", {})
        rows = modelled.get("alternatives") or modelled.get("layouts", [])  # the fastest layout, where compared
        return next((row.get("tokens_per_s") for row in rows if row["chosen"] and row["fits"]), None)

    compared = any("alternatives" in (job.get("throughput") or {}) for job in (placed.get("jobs") or {}).values())
    chosen = "fastest" if compared else "chosen"
    generate, judge = rate("generate"), rate("judge")
    if generate is None and judge is None:
        generate = judge = rate("run")
        if generate is None:
            return None
        return Rates(generate, judge, f"modelled for the run job's {chosen} layout ({gpu_type} figures)")
    return Rates(generate, judge, f"modelled for each job's {chosen} layout ({gpu_type} figures)")


def placement(
    cfg: DictConfig, models: dict, options: PlanOptions, gpus, workload, largest: dict, calibration=None
) -> dict:
    """Each job's layout on `gpus` (given, else this machine's) and the modelled throughput of the
    layouts it could take; a layout that cannot fit is shown refused, with the largest max_model_len
    at which it would fit and, from a calibration run, the share of its dialogues that would end on
    context there."""
    from personalens.engines.placement.alternatives import alternatives
    from personalens.engines.placement.layout import fitting_max_model_len, plan_layout

    if gpus is None:
        return {
            "planned": False,
            "why": "no GPU here and none given: give plan.gpus=N plan.gpu_memory_gib=G to plan for a node "
            "(on this machine's CPU vLLM, in-process engines run as configured)",
        }
    jobs = {}
    for job in options.jobs:
        roles = R.run_roles(cfg) if job == "run" else JOBS[job]
        configs = {role: models[role] for role in roles}
        in_process = R.in_process_roles(cfg, roles)
        refused = kv_refusals(configs, gpus, options.gpu_type)
        if refused:
            jobs[job] = {"refused": refused}
            continue
        try:
            layout = plan_layout(configs, gpus, in_process, R.work(cfg, roles))
        except PersonalensError as err:
            jobs[job] = {"refused": str(err)}
            fitting = fitting_max_model_len(configs, gpus, in_process)
            if fitting is not None:
                jobs[job]["max_model_len_fits"] = fitting
                if calibration is not None:
                    jobs[job]["context_ended_at_fit"] = calibration.ended_at(fitting, _room(cfg))
            continue
        jobs[job] = {**layout.as_dict(), "lines": layout.lines()}
        if workload is not None:
            tried = alternatives(configs, gpus, in_process, R.work(cfg, roles))
            spec = calibration.spec_decode if calibration is not None else {}
            jobs[job]["throughput"] = throughput(job, layout, models, workload, largest, options, cfg, tried, spec)
    if {"judge", "run"} & set(options.jobs):
        jobs.update(panel_phases(cfg, gpus))
    return {"planned": True, "gpus": gpus.describe(), "jobs": jobs}


def panel_phases(cfg: DictConfig, gpus) -> dict:
    """Each further model of a judge panel (config/judges.py), placed alone on `gpus` as `judge` and
    `run` load it: after the model before it is freed. Keyed `judge-<name>` (its judges' names)."""
    from personalens.config.judges import panel
    from personalens.engines.factory import model_configs
    from personalens.engines.placement.layout import plan_layout

    groups: dict[str, list] = {}
    for member in panel(cfg):
        groups.setdefault(member.model, []).append(member)
    phases = {}
    for members in list(groups.values())[1:]:  # model@judge's own is the judge job
        name = "judge-" + "+".join(m.name for m in members)
        try:
            layout = plan_layout(
                model_configs({"judge": members[0].cfg.judge}), gpus, frozenset(), R.work(members[0].cfg, ("judge",))
            )
        except PersonalensError as err:
            phases[name] = {"refused": str(err)}
            continue
        phases[name] = {**layout.as_dict(), "lines": layout.lines()}
    return phases


def reproducibility(cfg: DictConfig, gpus, *, given: bool) -> dict:
    """The `reproducible` mode, its cost, and whether `gpus` would take it: GPUs given to the plan
    (plan.gpus) run the batch-invariant kernels and say nothing of their compute capability, this
    machine's do; vLLM's CPU build without GPUs makes the same batches instead."""
    from personalens.config import reproducible
    from personalens.engines.dtype import vllm_is_cpu_build
    from personalens.engines.vllm import invariance

    if not reproducible(cfg):
        return {"on": False, "note": f"engines are not batch-invariant: {invariance.STILL_VARIES}"}
    minimum = ".".join(map(str, invariance.MIN_CAPABILITY))
    cpu_build = vllm_is_cpu_build() and not given
    mode = invariance.mode(gpus, cpu_build)
    refusal = None if given else invariance.refusal(gpus, cpu_build)
    if given:
        here = f"on the GPUs given: needs compute capability {minimum} or higher where the jobs run (plan.gpus does not say theirs)"
    elif mode.in_process_core:
        here = (
            "on this machine (vLLM's CPU build): each in-process engine's core in this process, so a call's requests "
            "are all queued before its first step; prefix caching off; one lockstep cohort; managed servers refused"
        )
    else:
        here = f"on this machine: {refusal or f'accepted on {gpus.describe()}'}"
    return {"on": True, "mode": mode.name, "env": dict(mode.env), "cost": mode.cost, "here": here}


def throughput(
    job: str,
    layout,
    models: dict,
    workload,
    largest: dict,
    options: PlanOptions,
    cfg: DictConfig,
    tried=(),
    spec=None,
) -> dict:
    """The job's layouts modelled on a sample of the largest shard's dialogues (plan/throughput.py), and
    the layouts `tried` for its bottleneck model beside the configured one (plan/layouts.py); its
    speculative models as the calibration run measured them (`spec`, plan/speculative.py)."""
    from personalens.engines.placement.cohorts import setting as cohorts
    from personalens.plan.gpu_model import GPUS
    from personalens.plan.layouts import compared as compared_layouts
    from personalens.plan.limit import node_limit
    from personalens.plan.throughput import TURN_ROLES, compare, dialogues, sampled

    served = [role for role in JOBS[job] if models[role].engine == "server"]
    if served:
        return {"not_modelled": f"{', '.join(served)} served elsewhere (engine: server)"}
    limit = {role: n.max_model_len for n in layout.needs for role in n.roles}
    room = _room(cfg)
    longest = {turn: None if limit.get(role) is None else limit[role] - room[role] for turn, role in TURN_ROLES.items()}
    shapes = sampled(largest, workload, options.model_dialogues)
    turns, judged = dialogues(shapes, workload, longest)
    work = {"generate": [turns], "judge": [judged], "run": [turns, judged]}[job]
    gpu = GPUS[options.gpu_type]
    lockstep = cfg.get("lockstep", {})
    settings = (lockstep.get("in_flight", "auto"), cohorts(lockstep.get("cohorts", "auto")))
    compared = compare(layout, gpu, work, *settings, spec)
    of = sum(largest.values())
    limit = node_limit(layout.needs, work, gpu, layout.gpus.count, spec)
    for row in [*compared["layouts"], limit]:
        if "seconds" in row:  # the sample's time scaled to the largest shard's dialogues
            row["largest_shard_s"] = row["seconds"] * of / len(shapes)
    compared["node_limit"] = limit
    if tried:
        compared["alternatives"] = compared_layouts(layout, tried, gpu, work, of / len(shapes), *settings, spec)
    return {"gpu": gpu.name, "dialogues": len(shapes), "of": of, "basis": workload.source, **compared}


def _room(cfg: DictConfig) -> dict[str, int]:
    """Per role the tokens a prompt leaves for the reply inside max_model_len (simulate's rule)."""
    room = cfg.protocol.get("context_room")
    return {
        role: int(cfg.protocol[role].max_tokens if room is None or role == "judge" else room)
        for role in ("user_agent", "assistant", "judge")
    }
