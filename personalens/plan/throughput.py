"""The modelled throughput of a job's layouts (engines/placement.py): the job's dialogues, shaped as
`plan` estimates them (at the protocol's cap, or calibrated by a finished run), replayed under
lockstep through the engine model (engine_model.py), each model's engine sized from its
architecture, its GPUs' published figures and the KV cache the layout gives it. Pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from personalens.engines.placement import Candidate, ModelNeed, Placement, Replicas
from personalens.plan.budget import Workload, judge_prompts, turn_prompts
from personalens.plan.engine_model import BANDWIDTH_EFFICIENCY, FLOPS_EFFICIENCY, GpuModel, Turn, simulate

# which model serves a turn: the dialogue's roles are the user agent's and the assistant's turns
TURN_ROLES = {"user": "user_agent", "assistant": "assistant", "judge": "judge"}


@dataclass(frozen=True)
class GpuFigures:
    """A GPU's peak figures, from its maker's datasheet."""

    name: str
    bandwidth: float  # bytes/s of HBM
    flops: float  # dense bf16 FLOP/s


# NVIDIA's datasheets (SXM boards): H100 3.35 TB/s and 989 TFLOPS, H200 4.8 TB/s and 989 TFLOPS,
# A100 80GB 2,039 GB/s and 312 TFLOPS
GPUS = {
    "h100": GpuFigures("H100 SXM", 3.35e12, 989e12),
    "h200": GpuFigures("H200 SXM", 4.8e12, 989e12),
    "a100": GpuFigures("A100 SXM 80GB", 2.039e12, 312e12),
}


def engine_of(need: ModelNeed, placed: Placement, gpu: GpuFigures) -> GpuModel:
    """The engine model of one model on its placement: its tensor-parallel GPUs add up (their
    communication not counted); its KV cache in tokens of every layer."""
    return GpuModel(
        params=need.arch.parameters(),
        layers=need.arch.layers,
        hidden=need.arch.hidden,
        kv_bytes_per_token=placed.kv_per_token_per_gpu * need.tp,
        bandwidth=gpu.bandwidth * BANDWIDTH_EFFICIENCY * need.tp,
        flops=gpu.flops * FLOPS_EFFICIENCY * need.tp,
        kv_tokens=placed.kv_cache_memory_bytes // placed.kv_per_token_per_gpu,
        max_num_seqs=need.max_num_seqs,
        max_batched_tokens=need.batched_tokens,
        bytes_per_param=need.dtype_bytes,
    )


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
    turn repeats its role's previous prompt as a prefix (instructions after the conversation, as
    under fidelity=official, make that an upper bound on prefix-cache hits). `longest` is per turn
    role the longest prompt that still runs (its model's max_model_len less the room kept for the
    reply, as simulate/ keeps it): a dialogue ends at a longer one, a judgment is left out."""
    turns_out, judge_out = [], []
    for kind, n in shapes:
        fixed, turns = workload.fixed[kind], workload.turns[kind]
        last = {"user": 0, "assistant": 0}
        kept = []
        for role, prompt in turn_prompts(fixed, n, turns.history):
            prompt = round(prompt)
            if longest.get(role) is not None and prompt > longest[role]:
                break
            kept.append(Turn(role, prompt, min(last[role], prompt), max(1, round(turns.reply[role]))))
            last[role] = prompt
        turns_out.append(kept)
        reply = max(1, round(workload.judge_reply))
        for prompt in judge_prompts(fixed, len(kept), turns.history, workload.judged, workload.turn_level):
            if longest.get("judge") is None or round(prompt) <= longest["judge"]:
                judge_out.append([Turn("judge", round(prompt), 0, reply)])
    return turns_out, judge_out


@dataclass(frozen=True)
class Modelled:
    seconds: float
    generated: int
    prompt: int
    computed: int

    @property
    def tokens_per_s(self) -> float:
        return self.generated / self.seconds if self.seconds else 0.0


def modelled(engines: Mapping[str, Sequence[GpuModel]], work: Sequence[Sequence[Sequence[Turn]]]) -> Modelled | None:
    """One job's phases (its dialogues, then its judgments) one after the other, under lockstep."""
    results = [simulate(phase, engines, "lockstep") for phase in work if phase]
    if not results:
        return None
    return Modelled(*(sum(getattr(r, f) for r in results) for f in ("seconds", "generated", "prompt", "computed")))


def compare(
    needs: Sequence[ModelNeed],
    candidates: Sequence[Candidate],
    copies: Replicas,
    gpu: GpuFigures,
    work: Sequence[Sequence[Sequence[Turn]]],
) -> dict:
    """Each candidate layout's modelled throughput; with copies on the GPUs the chosen layout leaves
    free (`copies`, the run's), the chosen layout with them (what the run uses) and without."""
    by_key = {n.key: n for n in needs}
    if len(needs) == 1:
        candidates = candidates[:1]  # one model: the same GPUs either way
    rows = []
    for i, candidate in enumerate(candidates):
        row = {"name": candidate.name, "chosen": i == 0, "why": candidate.why, "fits": candidate.placements is not None}
        if candidate.placements is not None:
            row |= _numbers(modelled(_engines(by_key, candidate.placements, gpu, {}), work), candidate.placements)
        rows.append(row)
    if copies.copies:
        chosen = candidates[0].placements
        made = ", ".join(
            f"{len(placed)} cop{'y' if len(placed) == 1 else 'ies'} of {key} on GPU "
            + ",".join(str(g) for p in placed for g in p.gpus)
            for key, placed in copies.copies
        )
        with_copies = {
            "name": f"{candidates[0].name} + {made}",
            "chosen": True,
            "why": copies.why,
            "fits": True,
            "copies": {key: [list(p.gpus) for p in placed] for key, placed in copies.copies},
            **_numbers(modelled(_engines(by_key, chosen, gpu, dict(copies.copies)), work), chosen),
        }
        rows = [
            with_copies,
            {**rows[0], "name": f"{candidates[0].name} without the copies", "chosen": False},
            *rows[1:],
        ]
    return {"layouts": rows}


def _engines(
    needs: Mapping[str, ModelNeed],
    placements: Sequence[Placement],
    gpu: GpuFigures,
    copies: Mapping[str, Sequence[Placement]],
) -> dict[str, list[GpuModel]]:
    engines = {}
    for p in placements:
        # each copy an engine of its own, taking its share of the dialogues
        made = [engine_of(needs[p.key], placed, gpu) for placed in (p, *copies.get(p.key, ()))]
        for turn_role, role in TURN_ROLES.items():
            if role in p.roles:
                engines[turn_role] = made
    return engines


def _numbers(result: Modelled | None, placements: Sequence[Placement]) -> dict:
    kv = {p.key: p.kv_cache_memory_bytes // p.kv_per_token_per_gpu for p in placements}
    if result is None:
        return {"kv_tokens": kv}
    return {
        "kv_tokens": kv,
        "tokens_per_s": result.tokens_per_s,
        "seconds": result.seconds,
        "prefilled_share": result.computed / result.prompt if result.prompt else 0.0,
    }
