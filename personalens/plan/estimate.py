"""The token budget and the time of a planned run: the parts of `personalens plan` past the selection
and the placement, with every assumption said in the output."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from omegaconf import DictConfig

from personalens.config import run as R
from personalens.config.judges import panel
from personalens.plan.budget import (
    ZERO,
    Fixed,
    PerDialogue,
    Turns,
    Workload,
    cap_turns,
    longest_prompts,
    per_dialogue,
    turns_at_cap,
)
from personalens.plan.calibration import Calibration, read_calibration
from personalens.plan.options import PlanOptions
from personalens.plan.pilot import command_overrides, judge_replies
from personalens.plan.prompt_tokens import count_prompts, fixed_by_kind, judged, load_tokenizers, sample
from personalens.plan.schedule import Rates, array_size, duration, parse_time_limit, shard_loads


@dataclass(frozen=True)
class Judging:
    prompts: tuple[str, ...]  # "dimension/speaker" per dialogue
    turn_level: bool
    max_tokens: int


# the rates of one job when none is given or measured: from the placement modelled on this workload
Modelled = Callable[[Workload | None, Calibration | None], Rates | None]


def estimate(
    cfg: DictConfig, options: PlanOptions, scenarios: Sequence, models: Mapping, modelled: Modelled | None = None
) -> tuple[dict, Workload | None, Calibration | None]:
    """tokens, calibration, time and assumptions of the plan; the dialogues' shape the engines see
    (None when the tokens could not be counted); and the calibration run read (None: none given).
    `modelled` gives the jobs' rates where neither plan.tokens_per_s nor a calibration does."""
    tokenizers, missing = load_tokenizers(models)
    assumptions = [
        "dialogues follow this config (fidelity, prompt setting, templates, protocol); turn t's prompt = its "
        "role's fixed part + `history` tokens per earlier turn; the judge sees the conversation as text, "
        "`history` tokens per turn"
    ]
    if missing:
        if modelled is not None:
            modelled(None, None)  # the placement, without a workload to model its throughput on
        why = "; ".join(f"{role}: {reason}" for role, reason in missing.items())
        return (
            {
                "tokens": {"not_counted": why},
                "time": {"unknown": "no token budget"},
                "assumptions": assumptions,
            },
            None,
            None,
        )
    fidelity = R.fidelity(cfg)
    templates, _ = R.templates(cfg, fidelity)
    setting, family = R.setting(cfg), R.prompt_family(cfg)
    dimensions = list(cfg.judging.dimensions)

    def count(chosen: Sequence) -> list:
        return count_prompts(
            sample(chosen, options.max_rendered, int(cfg.seed)), templates, setting, family, tokenizers, dimensions
        )

    rows = count(scenarios)
    if len(rows) < len(scenarios):
        assumptions.append(
            f"prompts of {len(rows)} of the {len(scenarios)} scenarios rendered (a seeded sample, plan.max_rendered); "
            "totals are their means times the counts"
        )
    fixed = fixed_by_kind(rows)
    dialogues = {k: n * int(cfg.trials) for k, n in Counter(s.task.kind for s in scenarios).items()}
    first = [r.user_first for r in rows]
    requests, answers = _reply_tokens(cfg)
    judging = Judging(
        tuple(f"{d}/{s}" for d, s in judged(dimensions)),
        bool(cfg.judging.turn_level) and "personalization" in dimensions,
        requests["judge"],
    )
    replies = {"user": requests["user_agent"], "assistant": requests["assistant"]}
    history = {"user": answers["user_agent"], "assistant": answers["assistant"]}
    caps = {
        k: cap_turns(
            turns_at_cap(int(cfg.protocol[f"max_rounds_{k.lower()}"]), fidelity.reply_after_cap), replies, history
        )
        for k in fixed
    }
    at_cap = {k: _one(fixed[k], caps[k], judging.max_tokens, judging) for k in fixed}
    tokens = {
        "counted_with": {role: models[role].source("tokenizer") for role in tokenizers},
        "rendered_scenarios": len(rows),
        "first_prompts": {
            "user_agent_total": round(sum(first) / len(first) * sum(dialogues.values())),
            "mean": sum(first) / len(first),
            "max": max(first),
            "max_model_len": _tokens(models["user_agent"].max_model_len),
        },
        "fixed_parts": {
            kind: {**vars(f), "judge": dict(f.judge), "shared": dict(f.shared), "tail": dict(f.tail)}
            for kind, f in fixed.items()
        },
        "at_cap": _totals(at_cap, dialogues),
        # vLLM refuses a prompt longer than the model's max_model_len
        "longest_prompts_at_cap": {k: longest_prompts(fixed[k], caps[k]) for k in fixed},
        "max_model_len": {
            "dialogue": min(
                (_tokens(m.max_model_len) for r, m in models.items() if r != "judge" and _tokens(m.max_model_len)),
                default=None,
            ),
            "judge": _tokens(models["judge"].max_model_len),
        },
    }
    tokens["overflows"] = overflows(models, tokens["longest_prompts_at_cap"], requests)
    assumptions.append(
        "at the cap: every dialogue runs to the protocol's round cap, every reply to its max_tokens and thinking "
        "budget, each earlier turn adds the mean of the two answers' max_tokens where the templates drop earlier "
        "thinking (history_reasoning family or none; chat markup not counted)"
    )
    per_kind, calibration, measured = at_cap, None, None
    workload = Workload(fixed, caps, judging.max_tokens, judging.prompts, judging.turn_level, "at the protocol's cap")
    if options.calibrate is not None:
        measured = read_calibration(options.calibrate)
        per_kind, turns, judge_reply, calibration = _calibrated(cfg, measured, fixed, caps, judging, count, assumptions)
        calibration["context_ended"] = measured.context_ended(dialogues)
        calibration["thinking_ended"] = measured.context_ended(dialogues, "thinking")
        tokens["calibrated"] = _totals(per_kind, dialogues)
        workload = dataclasses.replace(workload, turns=turns, judge_reply=judge_reply, source="calibrated")
    tokens["judge_replies"] = judge_replies(judging.max_tokens, calibration, command_overrides())
    estimated = {
        "tokens": tokens,
        "calibration": calibration,
        "time": _time(
            cfg, options, scenarios, per_kind, calibration, assumptions, modelled and modelled(workload, measured)
        ),
        "assumptions": assumptions,
    }
    return estimated, workload, measured


def _reply_tokens(cfg: DictConfig) -> tuple[dict[str, int], dict[str, int]]:
    """Per role the tokens a reply may generate (its thinking budget and its answer's max_tokens) and
    what it adds to later prompts: its answer alone, unless the assistant keeps its thinking in its
    history (history_reasoning last or all)."""
    from personalens.config.sampling import role_sampling

    requests, answers = {}, {}
    for role in ("user_agent", "assistant", "judge"):
        chosen = role_sampling(cfg, role)
        requests[role] = chosen.request_max_tokens
        kept = str(cfg[role].get("history_reasoning", "family")) in ("last", "all")
        answers[role] = requests[role] if kept else int(chosen.section["max_tokens"])
    return requests, answers


def overflows(models: Mapping, longest: Mapping[str, Mapping[str, float]], requests: Mapping[str, int]) -> list[str]:
    """Each role whose max_model_len cannot hold its longest prompt at the cap with its reply (vLLM
    refuses such a request; simulate ends the dialogue on context first), named with that prompt."""
    out = []
    for kind, prompts in longest.items():
        for role, where in (("user_agent", "dialogue"), ("assistant", "dialogue"), ("judge", "judge")):
            limit = _tokens(models[role].max_model_len)
            if limit and prompts[where] + requests[role] > limit:
                out.append(
                    f"{models[role].name} ({role}): max_model_len {limit:,} cannot hold the longest {kind} {where} "
                    f"prompt at the cap, {prompts[where]:,.0f} tokens, with a reply of up to {requests[role]:,}"
                )
    return out


def _tokens(max_model_len: int | str | None) -> int | None:
    """A configured max_model_len in tokens; None where unset or `auto` (the layout decides it)."""
    return max_model_len if isinstance(max_model_len, int) else None


def _one(fixed: Fixed, turns: Turns, judge_reply: float, judging: Judging) -> PerDialogue:
    return per_dialogue(fixed, turns, judge_reply, judging.prompts, judging.turn_level)


def _totals(per_kind: Mapping[str, PerDialogue], dialogues: Mapping[str, int]) -> dict:
    total = ZERO
    for kind, one in per_kind.items():
        total = total.plus(one.scaled(dialogues.get(kind, 0)))
    return {
        "per_dialogue": {k: vars(v) for k, v in per_kind.items()},
        "all": {k: round(v) for k, v in vars(total).items()},
    }


def _calibrated(
    cfg: DictConfig,
    measured: Calibration,
    fixed: Mapping[str, Fixed],
    caps: Mapping[str, Turns],
    judging: Judging,
    count: Callable[[Sequence], list],
    assumptions: list[str],
) -> tuple[dict[str, PerDialogue], dict[str, Turns], float, dict]:
    """Per-kind estimates from a finished run's measurements, the turns and judge replies they rest on,
    and what it measured."""
    from personalens.data import load_scenarios

    users = sorted({d["user_index"] for d in measured.dialogues})
    keys = {(d["user_id"], d["task_id"]) for d in measured.dialogues}
    own = {r.key: r for r in count([s for s in load_scenarios(cfg.data.root, users, "both") if s.key in keys])}
    reply = measured.reply()
    history = measured.history(own)
    if history is None:
        history = sum(measured.answer().values()) / 2
        assumptions.append(
            "`history` per earlier turn: the mean reply less its thinking (the run's scenarios are not in data.root)"
        )
    judge_reply = measured.judge_reply()
    if judge_reply is None:
        judge_reply = judging.max_tokens
        assumptions.append("the judge's replies at max_tokens: the calibration run has no judge summary")
    per_kind, turns = {}, {}
    for kind in fixed:
        turns[kind] = measured.turns(kind, history)
        if turns[kind] is None:
            turns[kind] = caps[kind]
            assumptions.append(f"{kind} dialogues at the protocol's cap: the calibration run has none")
        per_kind[kind] = _one(fixed[kind], turns[kind], judge_reply, judging)
    pairs = [
        (own[k].user_first, d["turns"][0]["prompt_tokens"])
        for d in measured.dialogues
        if (k := (d["user_id"], d["task_id"])) in own
    ]
    assumptions.append(
        f"calibrated by {measured.run_dir}: its turns per dialogue, reply tokens (the modelled dialogues' replies "
        "as spread as its replies) and judge reply tokens (a reasoning model's thinking among them), `history` "
        "fitted to its prompts; its models, prompt setting, "
        "protocol and thinking budgets should be this config's"
    )
    return (
        per_kind,
        turns,
        judge_reply,
        {
            "run_dir": measured.run_dir,
            "measured": measured.totals(),
            "turns_per_dialogue": measured.turn_counts(),
            "reply_tokens": reply,
            "thinking_tokens": measured.thinking(),  # of reply_tokens, where the run counted them
            "history_tokens_per_turn": history,
            "judgments": measured.judgments,
            "judge_reply_tokens": judge_reply,
            "judge_thinking_tokens": measured.judge_thinking,
            "generate": measured.generate.as_dict() if measured.generate else None,
            "judge": measured.judge.as_dict() if measured.judge else None,
            # the same dialogues' first prompts: rendered here, and as the run's engine counted them
            "first_prompts": {"rendered": sum(r for r, _ in pairs), "measured": sum(m for _, m in pairs)},
        },
    )


def _rates(options: PlanOptions, calibration: dict | None) -> Rates | None:
    if options.tokens_per_s is not None:
        return Rates(options.tokens_per_s, options.tokens_per_s, "given (plan.tokens_per_s), for generate and judge")
    measured = calibration and {
        job: calibration[job] and calibration[job]["tokens_per_s"] for job in ("generate", "judge")
    }
    if measured and any(measured.values()):
        return Rates(measured["generate"], measured["judge"], f"measured by {calibration['run_dir']}")
    return None


NO_RATE = (
    "no throughput: a modelled rate needs each job's layout to fit the GPUs given (plan.gpus=N "
    "plan.gpu_memory_gib=G) with its models in process or as managed servers; else give "
    "plan.tokens_per_s=<generated tokens/s of one job> or plan.calibrate=<a finished run>"
)


def _time(
    cfg: DictConfig,
    options: PlanOptions,
    scenarios: Sequence,
    per_kind: Mapping[str, PerDialogue],
    calibration: dict | None,
    assumptions: list[str],
    modelled: Rates | None = None,
) -> dict:
    rates = _rates(options, calibration) or modelled
    if rates is None:
        return {"unknown": NO_RATE}
    if rates is modelled:
        assumptions.append(
            "rates modelled (plan/throughput.py, plan.gpu_type's published figures), not measured: each job's chosen "
            f"layout on the largest shard at shard.count={int(cfg.shard.count)}, taken for every shard count"
        )
    assumptions.append(
        "time = generated tokens / generated tokens per second of one job, alike on every shard's node; model "
        "loading and server start-up not counted; a shard batching fewer dialogues may be slower than the rate"
    )
    judges = len(panel(cfg))
    if judges > 1:  # each judge of a panel makes every judgment: the judge job generates that many times the tokens
        per_kind = {k: dataclasses.replace(v, judge_generated=v.judge_generated * judges) for k, v in per_kind.items()}
        assumptions.append(
            f"judge time covers the panel's {judges} judges one after another, each with model@judge's reply "
            "tokens and rate (a panel judge of another model or sampling may differ)"
        )
    shards = [rates.seconds(load, per_kind) for load in shard_loads(scenarios, int(cfg.shard.count), int(cfg.trials))]
    out = {
        "rates_tokens_per_s": {"generate": rates.generate, "judge": rates.judge, "source": rates.source},
        "basis": "calibrated" if calibration else "at the protocol's cap (an upper bound)",
        "per_shard_s": [{"generate": g, "judge": j} for g, j in shards],
        "judges": judges,
    }
    for i, job in enumerate(("generate", "judge")):
        known = [s[i] for s in shards if s[i] is not None]
        if known:
            out[f"{job}_s"] = {"largest_shard": max(known), "all": sum(known), "readable": duration(max(known))}
    if options.time_limit is not None:
        limit = parse_time_limit(options.time_limit)
        size = array_size(scenarios, int(cfg.trials), per_kind, rates, limit)
        out["time_limit"] = {"limit": options.time_limit, "seconds": limit, "shards": size}
    return out
