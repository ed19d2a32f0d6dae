"""The modelled throughput of a job's layouts (engines/placement/layout.py): the job's dialogues, shaped as
`plan` estimates them (at the protocol's cap, or calibrated by a finished run), replayed under
lockstep through the engine model (engine_model.py), each model's engine sized from its
architecture, its GPUs' published figures and the KV cache the layout gives it. Pure."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from personalens.engines.placement.cohorts import auto_cohorts, least_share
from personalens.engines.placement.inflight import in_flight, run_window
from personalens.engines.placement.placed import Layout, Placement
from personalens.engines.placement.sizing import ModelNeed
from personalens.plan.budget import Workload, judge_prompts, turn_prompts
from personalens.plan.engine_model import Turn, simulate
from personalens.plan.gpu_model import GpuFigures, GpuModel, decode_step, engine_of
from personalens.plan.speculative import SpecDecode, measured

# which model serves a turn: the dialogue's roles are the user agent's and the assistant's turns
TURN_ROLES = {"user": "user_agent", "assistant": "assistant", "judge": "judge"}


def sampled(load: Mapping[str, int], workload: Workload, limit: int) -> list[tuple[str, int]]:
    """(kind, turns) of up to `limit` dialogues in the proportions of `load` (dialogues per kind)
    and of each kind's turn counts, largest remainders first; no randomness."""
    total = sum(load.values())
    scale = min(1.0, limit / total) if total else 0.0
    out = []
    for kind, n in load.items():
        counts = workload.turns[kind].counts
        want = {t: share * max(1, round(n * scale)) for t, share in counts.items()}
        whole = {t: int(w) for t, w in want.items()}
        for t in sorted(want, key=lambda t: whole[t] - want[t])[: max(1, round(n * scale)) - sum(whole.values())]:
            whole[t] += 1
        out += [(kind, t) for t, k in sorted(whole.items()) for _ in range(k)]
    return out


def dialogues(
    shapes: Sequence[tuple[str, int]], workload: Workload, longest: Mapping[str, int | None]
) -> tuple[list[list[Turn]], list[list[Turn]]]:
    """The dialogues' turns, and the judge's requests (each alone), of dialogues of these shapes. A
    turn repeats its role's previous prompt as a prefix but for that prompt's tail (`Fixed.tail`:
    instructions after the conversation, as under fidelity=official), and begins with what the same
    user's other dialogues' prompts begin with (`Fixed.shared`). `longest` is per turn
    role the longest prompt that still runs (its model's max_model_len less the room kept for the
    reply, as simulate/ keeps it): a dialogue ends at a longer one, a judgment is left out. A reply
    is its role's mean, or, calibrated, as long as the calibration's replies were (`_spread`)."""
    turns_out, judge_out = [], []
    for number, (kind, n) in enumerate(shapes):
        fixed, turns = workload.fixed[kind], workload.turns[kind]
        last = {"user": 0, "assistant": 0}  # the tokens of the role's previous prompt its next repeats
        kept = []
        for t, (role, prompt) in enumerate(turn_prompts(fixed, n, turns.history)):
            prompt = round(prompt)
            if longest.get(role) is not None and prompt > longest[role]:
                break
            reply = turns.reply[role] * _spread(turns.spread.get(role, ()), number, t)
            shared = round(fixed.shared.get(role, 0))
            kept.append(Turn(role, prompt, min(last[role], prompt), max(1, round(reply)), shared))
            last[role] = max(0, prompt - round(fixed.tail.get("user_first" if t == 0 else role, 0)))
        turns_out.append(kept)
        reply = max(1, round(workload.judge_reply))
        for prompt in judge_prompts(fixed, len(kept), turns.history, workload.judged, workload.turn_level):
            if longest.get("judge") is None or round(prompt) <= longest["judge"]:
                judge_out.append([Turn("judge", round(prompt), 0, reply, round(fixed.shared.get("judge", 0)))])
    return turns_out, judge_out


def _spread(ratios: Sequence[float], dialogue: int, turn: int) -> float:
    """A reply's length over its role's mean: the calibration's quantiles (`Turns.spread`) dealt to
    the turns in a fixed order, by strides coprime to their count, so that a call's replies (one turn
    of consecutive dialogues) and a dialogue's replies each take them all; 1 without."""
    if not ratios:
        return 1.0
    return ratios[(dialogue * 7 + turn * 5) % len(ratios)]


def longest_sequences(work: Sequence[Sequence[Turn]]) -> dict[str, float]:
    """Per model role, the tokens one dialogue keeps in that role's cache at its longest (its last
    prompt and reply), the mean over `work`'s dialogues."""
    out = {}
    for turn_role, role in TURN_ROLES.items():
        last = [max((t.prompt + t.reply for t in d if t.role == turn_role), default=0) for d in work]
        if any(last):
            out[role] = sum(last) / len(last)
    return out


@dataclass(frozen=True)
class Modelled:
    seconds: float
    generated: int
    prompt: int
    computed: int
    busy: Mapping[str, float]  # per model key: the share of the time its engines computed
    reloaded: int = 0  # prompt tokens copied back from host memory (kv_offload_gib)

    @property
    def tokens_per_s(self) -> float:
        return self.generated / self.seconds if self.seconds else 0.0


@dataclass(frozen=True)
class Cohorts:
    """How the run deals a layout's dialogues into lockstep cohorts, as the engine model replays them."""

    count: int = 1  # cohorts modelled
    least: int = 1  # a cohort's fewest dialogues of a window (engines/placement/cohorts.py)
    run: int = 1  # cohorts the run makes of the modelled dialogues
    at_once: int = 1  # of them, those a window leaves dialogues to
    shared_gpus: tuple[int, ...] = ()  # GPUs the dialogue models share: their calls are modelled taking turns


def cohorts_of(placements: Sequence[Placement], setting: int, dialogues: int, window: int | None = None) -> Cohorts:
    """The cohorts `generate` makes of `dialogues` on these placements (`setting`: lockstep.cohorts,
    0 for auto) with at most `window` in flight: on GPUs every engine joins calls (engines/base.py
    `joins_calls`), so auto makes small cohorts wherever the user agent and the assistant are
    distinct models, and a window too small for their parts runs fewer. Where their engines share
    GPUs the model cannot say how their overlapping steps contend for them, and replays the cohorts
    as one, taking turns: at most as fast as the run."""
    served = {role: p for p in placements for role in p.roles}
    user, assistant = served.get("user_agent"), served.get("assistant")
    if user is None or assistant is None or user is assistant:
        return Cohorts()
    run = setting or auto_cohorts(dialogues, True, True)
    least = least_share(run, not setting, True)
    running = run if window is None else min(run, max(1, -(-window // least)))
    gpus = [{g for c in (p, *p.copies) for g in c.gpus} for p in (user, assistant)]
    shared = tuple(sorted(gpus[0] & gpus[1]))
    if running == 1:  # the window has dialogues for one of them
        return Cohorts(run=run)
    if shared:
        return Cohorts(run=run, at_once=running, shared_gpus=shared)
    return Cohorts(run, least, run, running)


def modelled(
    engines: Mapping[str, Sequence[GpuModel]],
    work: Sequence[Sequence[Sequence[Turn]]],
    window: int | None = None,
    cohorts: Cohorts = Cohorts(),
) -> Modelled | None:
    """One job's phases (its dialogues, then its judgments) one after the other, under lockstep, at
    most `window` dialogues in flight (None: all), the dialogues in `cohorts`."""
    # the limit and the cohorts are the dialogues': a later phase (the judgments) runs every request at once
    results = [
        simulate(phase, engines, "lockstep", window, cohorts=cohorts.count, least=cohorts.least)
        if i == 0
        else simulate(phase, engines, "lockstep")
        for i, phase in enumerate(work)
        if phase
    ]
    if not results:
        return None
    count = {}
    for made in {id(g): g for models in engines.values() for g in models}.values():
        count[made.name] = count.get(made.name, 0) + 1
    seconds = sum(r.seconds for r in results)
    busy = {name: sum(r.busy.get(name, 0.0) for r in results) / (k * seconds) for name, k in count.items()}
    generated, prompt, computed, reloaded = (
        sum(getattr(r, f) for r in results) for f in ("generated", "prompt", "computed", "reloaded")
    )
    return Modelled(seconds, generated, prompt, computed, busy, reloaded)


def compare(
    layout: Layout,
    gpu: GpuFigures,
    work: Sequence[Sequence[Sequence[Turn]]],
    in_flight_setting: str | int = "auto",
    cohorts_setting: int = 0,
    spec: Mapping[str, SpecDecode] | None = None,
) -> dict:
    """The modelled throughput of the chosen layout with its copies on the GPUs it leaves free, with
    the dialogues in flight that `lockstep.in_flight` (`in_flight_setting`: auto, all or N) gives the
    run, and beside it with the other of a window and every dialogue in flight; then without the
    copies, and the other layout. auto's window is `run_window`'s (engines/placement/inflight.py) for
    the tokens the modelled dialogues keep at their longest, which is what the run learns from its own
    (simulate/window.py); the run's first dialogues, before any has ended, are not modelled. Every
    layout's dialogues run in the cohorts `lockstep.cohorts` (`cohorts_setting`, 0 for auto) gives
    it (`cohorts_of`); where that is more than one, the chosen row is modelled with one cohort too.
    The fastest is marked. A speculative model drafts as `spec` (per model name) measured it, else
    is modelled as without (plan/speculative.py)."""
    by_key = {n.key: n for n in layout.needs}
    planned = tuple(p for p in layout.placements if p.planned)
    longest = longest_sequences(work[0]) if work and work[0] else {}
    limit = in_flight(planned, longest) if longest else None
    run = _run_window(planned, work, in_flight_setting)
    dialogues = max(1, len(work[0])) if work and work[0] else 1
    window = _below(run, dialogues)
    with_copies = any(p.copies for p in planned)
    made = ", ".join(
        f"{len(p.copies)} cop{'y' if len(p.copies) == 1 else 'ies'} of {p.key} on GPU "
        + ",".join(str(g) for c in p.copies for g in c.gpus)
        for p in planned
        if p.copies
    )
    name = f"{layout.name} + {made}" if with_copies else layout.name
    why = layout.copies_why or layout.why

    def in_flight_name(n: int | None) -> str:
        return (
            f"{name}, every dialogue in flight"
            if n is None
            else f"{name}, {n} dialogue{'' if n == 1 else 's'} in flight"
        )

    other = limit if window is None and limit is not None and limit < dialogues else None
    variants = [(in_flight_name(window) if window or other else name, True, why, planned, window)]
    if window is not None or other is not None:
        variants.append((in_flight_name(other), False, why, planned, other))
    if with_copies:
        bare = tuple(dataclasses.replace(p, copies=()) for p in planned)
        alone = run_window(bare, longest) if in_flight_setting == "auto" and longest else run
        variants.append((f"{layout.name} without the copies", False, layout.why, bare, _below(alone, dialogues)))
    first = variants[0]
    dealt = cohorts_of(first[3], cohorts_setting, dialogues, first[4])
    if dealt.count > 1:  # beside it, the same with one cohort (lockstep.cohorts=1)
        variants.append((f"{first[0]}, one cohort (lockstep.cohorts=1)", False, *first[2:], Cohorts()))
    rows = []
    for name_, chosen, why_, placements, n, *one in variants:
        dealt = one[0] if one else cohorts_of(placements, cohorts_setting, dialogues, n)
        rows.append(
            {
                "name": name_,
                "chosen": chosen,
                "why": why_,
                "fits": True,
                **({"in_flight": n} if n else {}),
                **(
                    {"copies": {p.key: [list(c.gpus) for c in p.copies] for p in placements if p.copies}}
                    if any(p.copies for p in placements)
                    else {}
                ),
                **_cohorts_row(dealt),
                **_numbers(modelled(_engines(by_key, placements, gpu, spec), work, n, dealt), placements),
            }
        )
    if len(layout.needs) > 1:  # one model: the same GPUs either way
        for alternative in layout.others:
            row = {"name": alternative.name, "chosen": False, "why": alternative.why, "fits": alternative.fits}
            if alternative.fits:
                dealt = cohorts_of(alternative.placements, cohorts_setting, dialogues)
                row |= _cohorts_row(dealt)
                row |= _numbers(
                    modelled(_engines(by_key, alternative.placements, gpu, spec), work, None, dealt),
                    alternative.placements,
                )
            rows.append(row)
    timed = [r for r in rows if "tokens_per_s" in r]
    if timed:
        max(timed, key=lambda r: r["tokens_per_s"])["best"] = True
    return {
        "layouts": rows,
        "decode_step": {key: decode_step(need, gpu, measured(need, spec)) for key, need in by_key.items()},
        "lockstep_in_flight": in_flight_setting,
        "run_in_flight": window,
        **({"in_flight": limit} if limit is not None else {}),
    }


def as_run(
    layout: Layout,
    gpu: GpuFigures,
    work: Sequence[Sequence[Sequence[Turn]]],
    in_flight_setting: str | int = "auto",
    cohorts_setting: int = 0,
    spec: Mapping[str, SpecDecode] | None = None,
) -> Modelled | None:
    """`layout` modelled as the run takes it, as `compare`'s chosen row: its copies, the dialogues in
    flight `lockstep.in_flight` gives it, its cohorts."""
    planned = tuple(p for p in layout.placements or () if p.planned)
    dialogues = max(1, len(work[0])) if work and work[0] else 1
    window = _below(_run_window(planned, work, in_flight_setting), dialogues)
    dealt = cohorts_of(planned, cohorts_setting, dialogues, window)
    return modelled(_engines({n.key: n for n in layout.needs}, planned, gpu, spec), work, window, dealt)


def _run_window(
    planned: Sequence[Placement], work: Sequence[Sequence[Sequence[Turn]]], in_flight_setting: str | int
) -> int | None:
    """The dialogues in flight `lockstep.in_flight` gives the run (auto: `run_window` for the tokens
    the modelled dialogues keep at their longest; all: None)."""
    longest = longest_sequences(work[0]) if work and work[0] else {}
    auto = run_window(planned, longest) if longest else None
    return {"auto": auto, "all": None}.get(in_flight_setting, in_flight_setting)  # type: ignore[arg-type, return-value]


def _cohorts_row(dealt: Cohorts) -> dict:
    return {
        "cohorts": dealt.count,
        "cohorts_at_once": dealt.at_once,
        **({"run_cohorts": dealt.run} if dealt.run != dealt.count else {}),
        **({"shared_gpus": list(dealt.shared_gpus)} if dealt.shared_gpus else {}),
    }


def _below(n: int | None, dialogues: int) -> int | None:
    """A window that holds back some of the modelled dialogues, else None (every one in flight)."""
    return n if isinstance(n, int) and n < dialogues else None


def _engines(
    needs: Mapping[str, ModelNeed],
    placements: Sequence[Placement],
    gpu: GpuFigures,
    spec: Mapping[str, SpecDecode] | None = None,
) -> dict[str, list[GpuModel]]:
    engines = {}
    for p in placements:
        # each copy an engine of its own, taking its share of the dialogues
        made = [engine_of(needs[p.key], placed, gpu, measured(needs[p.key], spec)) for placed in (p, *p.copies)]
        for turn_role, role in TURN_ROLES.items():
            if role in p.roles:
                engines[turn_role] = made
    return engines


def _numbers(result: Modelled | None, placements: Sequence[Placement]) -> dict:
    kv = {p.key: p.kv_tokens for p in placements}
    host = {p.key: p.host_kv_tokens for p in placements if p.host_kv_tokens}
    kv_out = {"kv_tokens": kv, **({"host_kv_tokens": host} if host else {})}
    if result is None:
        return kv_out
    prefilled = result.computed / result.prompt if result.prompt else 0.0
    return {
        **kv_out,
        "tokens_per_s": result.tokens_per_s,
        "seconds": result.seconds,
        "prefilled_share": prefilled,
        "cached_share": 1 - prefilled if result.prompt else 0.0,
        "busy_share": dict(result.busy),
        **({"reloaded_share": result.reloaded / result.prompt} if result.reloaded and result.prompt else {}),
    }
