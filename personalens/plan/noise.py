"""Whether one more trial or one more judging buys more precision per GPU hour (`plan.noise_from`,
docs/validation.md#where-a-scores-noise-comes-from): the variance components a finished run measured
(store/components.py) set against the modelled cost of a trial and of a judging (the plan's time).

For a mean over n users, m scenarios each, T trials of a scenario and J judgings of a dialogue, the
variance is s2_user / n + s2_scenario / (n m) + s2_trial / (n m T) + s2_judging / (n m T J). A further
trial cuts the last two terms and costs one trial's generation and its J judgings; a further judging
cuts the last one and costs one judging of every trial's dialogues."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from personalens.config.judges import panel, run_judges
from personalens.errors import PersonalensError
from personalens.store.components import metric_components
from personalens.store.metrics import TABLE3
from personalens.store.results import KINDS, load_runs
from personalens.tables.components import Components, Design
from personalens.tables.stats import Bootstrap


def mean_variance(c: Components, design: Design) -> float:
    """The variance of a metric's mean over `design`'s users."""
    return c.per_user(design) / design.users


def costs(time: dict, tokens: dict, trials: int, judgings: int = 1) -> tuple[float, float, str] | None:
    """(one trial's generation, one judging of one trial's dialogues, the unit): GPU-job seconds from the
    plan's time where it is known (its judge time covers the panel's `judgings` judges one after
    another), else generated tokens (both jobs at one rate); None without either."""
    if "generate_s" in time and "judge_s" in time:
        return time["generate_s"]["all"] / trials, time["judge_s"]["all"] / trials / judgings, "job-seconds"
    counted = tokens.get("calibrated") or tokens.get("at_cap")
    if not counted:
        return None
    per = counted["all"]
    return per["generated"] / trials, per["judge_generated"] / trials, "generated tokens (one rate for both jobs)"


def advice(cfg: DictConfig, estimated: dict, users: int, scenarios: int, gpus: int | None) -> dict:
    """Per assistant, task kind and Table 3 metric of run `plan.noise_from`: the share of the mean's
    variance one more trial and one more judging would cut at this config's design, what each costs,
    and which cuts more per unit of cost."""
    run = Path(str(cfg.plan.noise_from))
    if not (run / "judgments").is_dir():
        raise PersonalensError(f"plan.noise_from: {run} holds no judgments (a finished run's out_dir)")
    trials, judgings = int(cfg.trials), len(panel(cfg))
    cost = costs(estimated.get("time", {}), estimated.get("tokens", {}), trials, judgings)
    if cost is None:
        return {"from": str(run), "unknown": "no token budget or time to cost a trial and a judging with"}
    trial_cost, judging_cost, unit = cost
    per_gpu = gpus if unit == "job-seconds" and gpus else None
    scale = (per_gpu / 3600) if per_gpu else 1.0
    design = Design(users, scenarios / max(users, 1), trials, judgings)
    more_trials, more_judgings = (
        Design(users, design.scenarios, trials + 1, judgings),
        Design(users, design.scenarios, trials, judgings + 1),
    )
    judgments = run_judges([run]).keyed(load_runs([run], dialogues=False).judgments)
    boot = Bootstrap(int(cfg.report.bootstrap), int(cfg.seed))
    rows = []
    for group in sorted({(j.assistant_model, j.setting) for j in judgments}):
        for kind in KINDS:
            of_kind = [j for j in judgments if (j.assistant_model, j.setting) == group and j.kind == kind]
            for metric in TABLE3:
                c = metric_components(of_kind, metric, boot)
                if c is None:
                    continue
                now = mean_variance(c, design)
                cut_t = (now - mean_variance(c, more_trials)) / now if now > 0 else 0.0
                cut_j = (now - mean_variance(c, more_judgings)) / now if now > 0 else 0.0
                per_t = cut_t / ((trial_cost + judgings * judging_cost) * scale)
                per_j = cut_j / (trials * judging_cost * scale)
                split = c.variances["trial"] is not None or c.variances["judging"] is not None
                rows.append(
                    {
                        "assistant": group[0],
                        "setting": group[1],
                        "kind": kind,
                        "metric": metric.label,
                        "variances": {k: (None if e is None else e.mean) for k, e in c.variances.items()},
                        "trial_cut": cut_t,
                        "judging_cut": cut_j,
                        "better": _better(per_t, per_j, split),
                    }
                )
    return {
        "from": str(run),
        "trials": trials,
        "judgings": judgings,
        "unit": f"GPU hours ({per_gpu} GPUs a job)" if per_gpu else unit,
        "trial_cost": (trial_cost + judgings * judging_cost) * scale,
        "judging_cost": trials * judging_cost * scale,
        "metrics": rows,
    }


def _better(per_trial: float, per_judging: float, split: bool) -> str:
    """Which cuts more variance per unit of cost; "unknown" where the run split off neither the
    dialogue's nor the judge's share (one trial, one judging)."""
    if not split:
        return "unknown"
    return "trial" if per_trial > per_judging else "judging" if per_judging > per_trial else "either"


def lines(noise: dict) -> list[str]:
    """The advice as plan prints it."""
    if "unknown" in noise:
        return [f"noise ({noise['from']}): {noise['unknown']}"]
    better = [r["better"] for r in noise["metrics"]]
    out = [
        f"noise: from {noise['from']}'s variance components, at trials={noise['trials']} and {noise['judgings']} "
        f"judging(s) a dialogue: one more trial costs {noise['trial_cost']:,.3g} {noise['unit']}, one more judging "
        f"{noise['judging_cost']:,.3g}; per unit of cost a trial cuts the mean's variance more for "
        f"{better.count('trial')} of {len(better)} metrics, a judging for {better.count('judging')}"
    ]
    out += [
        f"  {r['assistant']} {r['setting']} {r['kind']} {r['metric']}: a trial cuts {r['trial_cut']:.1%}, "
        f"a judging {r['judging_cut']:.1%} -> {r['better']}"
        for r in noise["metrics"]
    ]
    return out
