"""The node's limit for a job's dialogues: the least time any layout of its models on the node's GPUs could
take, from two floors per model, at the GPUs' peak figures (no efficiency applied) and with every GPU of
the node working on every model in turn.

- memory: every decode step reads the model's weights once (at their stored or quantized bytes) for at
  most `max_num_seqs` sequences, and each generated token's step reads its sequence's KV so far;
- compute: 2 x parameters FLOPs per generated token and per prompt token no prefix cache can serve
  (the part of a prompt that neither repeats its role's previous one nor is shared with other
  dialogues), at the FP8 rate where the model's weights are fp8 and the GPU has one.

A model takes the larger of its two floors; the models take turns on the node, so the limit is their
sum. Dependencies between turns, scheduling, prefill chunking and communication are left out: no
layout can be faster. Pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from personalens.engines.placement.sizing import ModelNeed
from personalens.plan.engine_model import Turn
from personalens.plan.gpu_model import GpuFigures, compute_rate
from personalens.plan.speculative import SpecDecode, measured
from personalens.plan.throughput import TURN_ROLES


def node_limit(
    needs: Sequence[ModelNeed],
    work: Sequence[Sequence[Sequence[Turn]]],
    gpu: GpuFigures,
    gpus: int,
    spec: Mapping[str, SpecDecode] | None = None,
) -> dict:
    """Per model key its floors (seconds) and the bytes and FLOPs behind them, and `seconds`, their sum.
    A speculative model measured in `spec` (per model name, plan/speculative.py) reads its weights and
    KV once a verifying step, for the tokens such a step gains, and computes its drafts too."""
    by_role = {role: need for need in needs for role in need.roles}
    totals: dict[str, dict[str, float]] = {}
    for phase in work:
        for dialogue in phase:
            for turn in dialogue:
                need = by_role.get(TURN_ROLES[turn.role])
                if need is None:
                    continue
                t = totals.setdefault(need.key, {"generated": 0, "computed": 0, "kv_read": 0})
                t["generated"] += turn.reply
                t["computed"] += turn.prompt - max(turn.reusable, turn.shared)
                # the KV each of its decode steps reads: the prompt, then one more token a step
                t["kv_read"] += turn.reply * turn.prompt + turn.reply * (turn.reply - 1) / 2
    out: dict = {"gpus": gpus, "models": {}}
    for need in needs:
        t = totals.get(need.key)
        if t is None:
            continue
        kv_per_token = need.kv_per_token * need.tp  # every layer's K and V, all its GPUs together
        drafts = measured(need, spec)
        gained, drafted = (drafts.tokens_per_step, drafts.drafted) if drafts else (1.0, 0.0)
        read = (t["generated"] / need.max_num_seqs * need.weights + t["kv_read"] * kv_per_token) / gained
        flops = 2 * need.arch.parameters() * (t["generated"] * (1 + drafted) / gained + t["computed"])
        memory_s, compute_s = read / (gpus * gpu.bandwidth), flops / (gpus * compute_rate(need, gpu))
        out["models"][need.key] = {
            "bytes_read": read,
            "flops": flops,
            "memory_s": memory_s,
            "compute_s": compute_s,
            "seconds": max(memory_s, compute_s),
        }
    out["seconds"] = sum(m["seconds"] for m in out["models"].values())
    return out
