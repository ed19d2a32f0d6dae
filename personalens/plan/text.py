"""The plan as a person reads it: the same numbers as plan.json, one topic per block."""

from __future__ import annotations

from collections.abc import Mapping

from personalens.config.roles import lines as roles_lines
from personalens.engines.placement.gpus import GIB
from personalens.plan.schedule import duration
from personalens.plan.served import lines as served_lines

_ROLE_NAMES = {"user": "user agent", "user_first": "user agent's first", "assistant": "assistant", "judge": "judge"}


def _n(value: float | None) -> str:
    return "unknown" if value is None else f"{round(value):,}"


def _estimate(label: str, totals: Mapping) -> list[str]:
    a = totals["all"]
    out = [
        f"  {label}: {_n(a['turns'])} turns, prompts {_n(a['prompt'])} tokens, generated {_n(a['generated'])} tokens; "
        f"judge: {_n(a['judgments'])} judgments, prompts {_n(a['judge_prompt'])} tokens, generated "
        f"{_n(a['judge_generated'])} tokens"
    ]
    for kind, d in totals["per_dialogue"].items():
        out.append(
            f"    per {kind} dialogue: {d['turns']:.1f} turns, prompts {_n(d['prompt'])}, generated "
            f"{_n(d['generated'])}; {d['judgments']:.1f} judgments, prompts {_n(d['judge_prompt'])}, generated "
            f"{_n(d['judge_generated'])}"
        )
    return out


def _selection(s: Mapping) -> list[str]:
    kinds = ", ".join(f"{n} {k}" for k, n in s["scenarios"].items())
    dialogues = sum(s["dialogues"].values())
    largest = ", ".join(f"{n} {k}" for k, n in s["largest_shard"].items())
    return [
        f"selection: {s['users']} user(s), {sum(s['scenarios'].values())} scenarios ({kinds}) x {s['trials']} "
        f"trial(s) = {dialogues} dialogues, in {s['shards']} shard(s) by user; the largest: {largest} dialogues",
        f"  data: {s['data_root']}",
        *_written(s.get("written")),
    ]


def _written(w: Mapping | None) -> list[str]:
    if w is None:
        return []
    partial = w["partial_shards"]
    where = "; ".join(f"shard {k}: {p['dialogues']} ({p['turns']} turns stored)" for k, p in partial.items())
    return [
        f"  already in run.out_dir: {w['dialogues']} dialogues written"
        + (f"; partly simulated by a stopped generate, which resumes them: {where}" if partial else "")
    ]


def _placement(p: Mapping) -> list[str]:
    if not p["planned"]:
        return [f"placement: not planned: {p['why']}"]
    planned = [layout["basis"] for layout in p["jobs"].values() if "basis" in layout]
    out = [planned[0] if planned else f"placement on {p['gpus']}:"]  # the same basis for every job
    for job, layout in p["jobs"].items():
        if "refused" in layout:
            out.append(f"  {job}: REFUSED: {layout['refused']}")
            if "max_model_len_fits" in layout:
                ended = layout.get("context_ended_at_fit")
                out.append(
                    f"    the largest max_model_len that fits: {layout['max_model_len_fits']:,}"
                    + (
                        ""
                        if ended is None
                        else f"; at it {ended:.0%} of the calibration run's dialogues would end on context"
                    )
                )
        else:
            out += [f"  {job}: {layout['why']}", *(f"  {line}" for line in layout["lines"][1:])]
            out += _throughput(layout.get("throughput"))
    return out


def _reproducible(r: Mapping) -> list[str]:
    if not r["on"]:
        return [f"reproducible: off; {r['note']}"]
    env = " ".join(f"{k}={v}" for k, v in r["env"].items())
    return [
        f"reproducible: on: {r['mode']} ({env}) for every engine started; {r['cost']}",
        f"  {r['here']}",
    ]


def _throughput(t: Mapping | None) -> list[str]:
    if not t:
        return []
    if "not_modelled" in t:
        return [f"    throughput not modelled: {t['not_modelled']}"]
    out = [
        f"    modelled throughput ({t['dialogues']:,} of the largest shard's {t['of']:,} dialogues {t['basis']}, "
        f"lockstep in the run's cohorts, {t['gpu']} figures):"
    ]
    for row in t["layouts"]:
        chosen = (f" (chosen: {row['why']})" if "copies" in row else " (chosen)") if row["chosen"] else ""
        best = " [modelled best]" if row.get("best") else ""
        out.append(
            f"      {row['name']}{chosen}{best}: " + (_modelled(row) if row["fits"] else f"does not fit ({row['why']})")
        )
    out += _alternatives(t.get("alternatives", ()))
    if "node_limit" in t:
        out.append(_limit(t["node_limit"]))
    if "decode_step" in t:
        out.append("    per decode step, each engine reads per GPU: " + "; ".join(map(_step, t["decode_step"].items())))
        out += [_speculative(item) for item in t["decode_step"].items() if item[1].get("speculative")]
    if "in_flight" in t:
        out.append(
            f"    dialogues in flight whose histories the dialogue models' KV caches keep: {t['in_flight']:,} "
            f"(engines/placement/inflight.py); the run takes lockstep.in_flight={t['lockstep_in_flight']}: "
            + (
                f"{t['run_in_flight']:,} in flight"
                if t.get("run_in_flight")
                else "every dialogue in flight"
                + (
                    " (too few for a batch: below a quarter of max_num_seqs)"
                    if t["lockstep_in_flight"] == "auto"
                    else ""
                )
            )
        )
    return out


def _alternatives(rows) -> list[str]:
    """The layouts tried for the bottleneck model, one line each, the chosen one with its overrides."""
    if not rows:
        return []
    out = ["    layouts for the job's bottleneck model (engines/placement/alternatives.py), as the run takes each:"]
    for row in rows:
        name = row["name"]
        if not row["overrides"] and row["fits"]:
            name += f" ({row['tp']} GPU(s) per engine, {row['engines']} engine(s))"
        if not row["fits"]:
            why = row["why"].split(". Ways out")[0]  # plan.json has it whole, with the sizes
            if why.startswith("these models do not fit"):
                why = why.split(": ")[0]
            out.append(f"      {name}: does not fit ({why})")
            continue
        hours = (
            f"{row['tokens_per_s']:,.0f} generated tokens/s ({row['seconds']:,.0f} s, the largest shard "
            f"{duration(row['largest_shard_s'])})"
            if "seconds" in row
            else "nothing to model"
        )
        chosen = " (chosen: the fastest that fits)" if row["chosen"] else ""
        runs = f"; the job builds it with {' '.join(row['overrides'])}" if row["chosen"] and row["overrides"] else ""
        out.append(f"      {name}{chosen}: {hours}{runs}")
    return out


def _limit(n: Mapping) -> str:
    models = "; ".join(
        f"{key} {m['bytes_read'] / 1e12:,.1f} TB read ({m['memory_s']:,.0f} s), {m['flops'] / 1e18:,.2f} EFLOP "
        f"({m['compute_s']:,.0f} s)"
        for key, m in n["models"].items()
    )
    return (
        f"    the node's limit, no layout faster (plan/limit.py: weights read once a step of max_num_seqs, each "
        f"token's KV so far, 2 x parameters FLOPs per token, at {n['gpus']} GPUs' peak figures, the models "
        f"in turn): {n['seconds']:,.0f} s, the largest shard {duration(n['largest_shard_s'])}; {models}"
    )


def _step(item: tuple[str, Mapping]) -> str:
    key, d = item
    quantized = f" ({d['quantization']})" if d["quantization"] else ""
    arithmetic = "FP8" if d["fp8_compute"] else "16-bit"
    reduce = d.get("allreduce")
    communication = (
        f"; {reduce['per_step']} all-reduces over its {reduce['gpus']} GPUs, {reduce['latency_s'] * 1e3:.2f} ms a step "
        f"+ {reduce['per_token_s'] * 1e6:.1f} us a sequence"
        if reduce
        else ""
    )
    return (
        f"{key} {d['weights_per_gpu'] / GIB:.1f} GiB of weights{quantized}, then its KV; "
        f"{arithmetic} arithmetic at {d['tflops']:,.0f} TFLOPS peak{communication}"
    )


def _speculative(item: tuple[str, Mapping]) -> str:
    """One line per speculative model: the acceptance it is modelled at, or that none is known."""
    key, d = item
    head = f"    speculative decoding ({d['speculative']}) of {key}: "
    if "tokens_per_step" not in d:
        return head + (
            "no measured acceptance rate, so modelled as without it (a calibration run that recorded vLLM's "
            "spec-decode counters gives one: plan.calibrate=)"
        )
    return head + (
        f"{d['tokens_per_step']:.2f} tokens a verifying step ({d['acceptance']:.0%} of {d['drafted']:.1f} drafted "
        f"accepted), measured by {d['measured_by']}"
    )


def _modelled(row: Mapping) -> str:
    if "tokens_per_s" not in row:
        return "nothing to model: every request of this shape exceeds its model's max_model_len"
    host = row.get("host_kv_tokens", {})
    kv = ", ".join(
        f"{key} {tokens:,}" + (f" + {host[key]:,} in host memory" if key in host else "")
        for key, tokens in row["kv_tokens"].items()
    )
    busy = ", ".join(f"{key} {share:.0%}" for key, share in row["busy_share"].items())
    shard = f", the largest shard {duration(row['largest_shard_s'])}" if "largest_shard_s" in row else ""
    reloaded = f" ({row['reloaded_share']:.0%} reloaded from host memory)" if "reloaded_share" in row else ""
    return (
        f"{row['tokens_per_s']:,.0f} generated tokens/s ({row['seconds']:,.0f} s{shard}), prompt tokens "
        f"{row['prefilled_share']:.0%} prefilled / {row['cached_share']:.0%} cached{reloaded}; busy: {busy}; "
        f"KV cache tokens: {kv}" + _cohorts(row)
    )


def _cohorts(row: Mapping) -> str:
    """The lockstep cohorts the row was modelled with, where the run has more than one at once."""
    at_once = row.get("cohorts_at_once", 1)
    if "shared_gpus" in row:
        gpus = ",".join(map(str, row["shared_gpus"]))
        return f"; the run's {at_once} cohorts at once modelled taking turns (the dialogue models share GPU {gpus})"
    return f"; {at_once} cohorts at once" if at_once > 1 else ""


def _tokens(t: Mapping) -> list[str]:
    if "not_counted" in t:
        return [f"tokens: not counted: {t['not_counted']}"]
    first = t["first_prompts"]
    limit = first["max_model_len"]
    over = f"; OVER the user agent's max_model_len {limit}" if limit and first["max"] > limit else ""
    out = [
        "tokens (" + ", ".join(f"{role} with {source}" for role, source in t["counted_with"].items()) + "):",
        f"  the user agent's first prompts: {_n(first['user_agent_total'])} tokens in all, mean {_n(first['mean'])}, "
        f"max {_n(first['max'])}{over}",
    ]
    for kind, f in t["fixed_parts"].items():
        judge = sum(f["judge"].values())
        out.append(
            f"  fixed parts of a {kind} dialogue: user agent {_n(f['user_first'])} first, {_n(f['user_next'])} later; "
            f"assistant {_n(f['assistant'])}; judge {len(f['judge'])} prompts, {_n(judge)} in all"
        )
        if f.get("shared"):
            shared, tail = f["shared"], f.get("tail", {})
            out.append(
                "    shared with the user's other dialogues (prefix-cache hits): "
                + ", ".join(f"{_ROLE_NAMES.get(r, r)} {_n(n)}" for r, n in shared.items())
                + "; not repeated by the role's next prompt: "
                + ", ".join(f"{_ROLE_NAMES.get(r, r)} {_n(n)}" for r, n in tail.items())
            )
    out += _estimate("at the protocol's cap", t["at_cap"])
    for kind, longest in t["longest_prompts_at_cap"].items():
        notes = [
            f"{_n(tokens)} in a {where}" + (f", OVER its max_model_len {limit}" if limit and tokens > limit else "")
            for where, tokens in longest.items()
            for limit in [t["max_model_len"][where]]
        ]
        out.append(f"    the longest {kind} prompts at the cap: " + "; ".join(notes))
    out += [f"  OVER its context: {line}" for line in t.get("overflows", [])]
    if "calibrated" in t:
        out += _estimate("calibrated", t["calibrated"])
    return out + _judge_replies(t.get("judge_replies"))


def _judge_replies(j: Mapping | None) -> list[str]:
    """What the judge's reply tokens rest on: a cap bound (and the pilot that would measure them), or a run."""
    if not j:
        return []
    if j["basis"] == "calibrated":
        thinking = f", thinking {j['thinking']:.1f} of them" if j.get("thinking") else ""
        return [
            f"  the judge's replies: {j['tokens']:,.1f} tokens per judgment{thinking}, as {j['run_dir']}'s judge "
            f"wrote them (its max_tokens {j['max_tokens']:,})"
        ]
    return [
        f"  the judge's replies: CAP BOUND: each counted at its max_tokens, {j['max_tokens']:,} tokens (its thinking "
        "budget included), far above what a judge writes: its generated tokens and hours here are upper bounds, "
        "not estimates; a pilot of a few users measures them:",
        *(f"    {command}" for command in j["pilot"]),
    ]


def _thinking(c: Mapping, role: str) -> str:
    """A role's measured thinking tokens per reply, as part of its reply tokens (none where not counted)."""
    thinking = (c.get("thinking_tokens") or {}).get(role)
    return f" (thinking {thinking:.1f})" if thinking else ""


def _calibration(c: Mapping | None) -> list[str]:
    if not c:
        return []
    m = c["measured"]
    out = [
        f"calibration run {c['run_dir']}: {m['dialogues']} dialogues, {m['turns']} turns, prompts "
        f"{_n(m['prompt_tokens'])} tokens, generated {_n(m['completion_tokens'])}; replies "
        + ", ".join(f"{role} {v:.1f}{_thinking(c, role)}" for role, v in c["reply_tokens"].items())
        + f" tokens; history {c['history_tokens_per_turn']:.1f} tokens per earlier turn",
        f"  first prompts of its dialogues: rendered here {_n(c['first_prompts']['rendered'])}, counted by its "
        f"engine {_n(c['first_prompts']['measured'])}",
    ]
    for key, what in (("context_ended", "on a full context"), ("thinking_ended", "inside a reply's thinking")):
        ended = c.get(key) or {}
        if ended:
            out.append(
                f"  ended {what} in it: "
                + "; ".join(
                    f"{kind} {e['measured']} of {e['of']}, so about {_n(e['expected'])} of the {_n(e['planned'])} "
                    "planned"
                    for kind, e in ended.items()
                )
            )
    for job in ("generate", "judge"):
        r = c[job]
        if r:
            share = "unknown" if r["cached_share"] is None else f"{r['cached_share']:.0%}"
            rate = "unknown" if r["tokens_per_s"] is None else f"{r['tokens_per_s']:.1f}"
            out.append(
                f"  {job}: {r['items']} in {r['seconds']:.0f} s, {rate} generated tokens/s, {share} of prompt tokens cached"
            )
        else:
            out.append(f"  {job}: no summary in its logs/summaries/ (written by runs since `plan` exists)")
    return out


def _time(t: Mapping) -> list[str]:
    if "unknown" in t:
        return [f"time: unknown: {t['unknown']}"]
    r = t["rates_tokens_per_s"]
    out = [f"time ({t['basis']}; rates {r['source']}):"]
    for job in ("generate", "judge"):
        rate = r[job]
        judges = f" ({t['judges']} judges, one after another)" if job == "judge" and t.get("judges", 1) > 1 else ""
        if f"{job}_s" in t:
            s = t[f"{job}_s"]
            out.append(
                f"  {job}{judges} at {rate:.1f} generated tokens/s: the largest shard {s['readable']}, "
                f"all shards together {duration(s['all'])}"
            )
        else:
            out.append(f"  {job}: unknown (no rate)")
    limit = t.get("time_limit")
    if limit:
        n = limit["shards"]
        out.append(
            f"  under {limit['limit']} per job: {n} shards, `slurm/submit.sh {n} ...` (--array=0-{n - 1})"
            if n
            else f"  under {limit['limit']} per job: not even with one user per shard"
        )
    return out


def lines(plan: Mapping) -> list[str]:
    out = [
        *roles_lines(plan["roles"]),
        *_selection(plan["selection"]),
        *_placement(plan["placement"]),
        *_reproducible(plan["reproducible"]),
        *_tokens(plan["tokens"]),
        *_calibration(plan.get("calibration")),
        *_time(plan["time"]),
        *(["servers the lab runs (engine: server), what each needs:"] if plan.get("servers") else []),
        *served_lines(plan.get("servers") or {}),
        "assumptions:",
        *(f"  - {a}" for a in plan["assumptions"]),
    ]
    return out
