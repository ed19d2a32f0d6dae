"""The layouts `plan` tries for a job's bottleneck model (engines/placement/alternatives.py) and models
(plan/layouts.py): each is what the engine loader `generate` uses builds under the option's overrides,
and the fastest that fits is chosen. Pure: published model configs (tests/fixtures/architectures/),
the engine loader with a recorder in place of vLLM (as tests/test_engine_layout.py)."""

from __future__ import annotations

import dataclasses
import json
import sys

import pytest
from cli_helpers import REPO, run_cli
from omegaconf import OmegaConf
from test_engine_layout import Recorder, conf, loader, model_dir

from personalens.engines.factory import model_configs
from personalens.engines.models.embedded import embedded_model_dir
from personalens.engines.placement.alternatives import alternatives, bottleneck, places
from personalens.engines.placement.free import held_by_gpu
from personalens.engines.placement.gpus import simulated
from personalens.engines.placement.layout import plan_layout
from personalens.errors import PersonalensError
from personalens.plan.engine_model import Turn
from personalens.plan.gpu_model import GPUS
from personalens.plan.layouts import compared
from personalens.plan.throughput import as_run

sys.path.insert(0, str(REPO / "scripts"))
import cluster_printouts as cp  # noqa: E402

NODE_8X80 = simulated(8, 80)
# per role the tokens it generates per dialogue (config/run.py `work`): 7 rounds of 200 and 300 tokens
WORK = {"user_agent": 1400.0, "assistant": 2100.0}


def _release_models(tmp_path, quantization=None) -> dict:
    """The release stand-in's generate models: Qwen2.5-72B's published config under the 70B's model
    config as the user agent (tensor parallel 4), Llama-3.1-8B as the assistant."""
    big = conf(tmp_path, "llama31_70b", quantization=quantization)
    big |= {"name": "Qwen2.5-72B-Instruct", "path": str(model_dir(tmp_path, "qwen25_72b"))}
    small = conf(tmp_path, "llama31_8b", quantization=quantization)
    return {"user_agent": big, "assistant": small}


def _dialogues(n: int, rounds: int, assistant: int = 300) -> list[list[Turn]]:
    """`n` dialogues of `rounds` rounds, each turn's prompt its role's previous one plus the turns between;
    the user agent's replies 200 tokens, the assistant's `assistant`."""
    out = []
    for _ in range(n):
        turns, seen, last = [], 800, {"user": 0, "assistant": 0}
        for _ in range(rounds):
            for role, reply in (("user", 200), ("assistant", assistant)):
                turns.append(Turn(role, seen, last[role], reply, 500))
                last[role], seen = seen, seen + reply
        out.append(turns)
    return out


def _overridden(raw: dict, overrides) -> dict:
    """The roles' model configs with `role.key=value` overrides applied, as the command line does."""
    overridden = OmegaConf.create(raw)
    for override in overrides:
        key, value = override.split("=")
        OmegaConf.update(overridden, key, int(value) if value.isdigit() else value)
    return OmegaConf.to_container(overridden)


def test_each_alternative_is_the_layout_the_engine_loader_builds_under_its_overrides(tmp_path):
    raw = _release_models(tmp_path, "fp8")
    configs = model_configs(raw)
    assert bottleneck(configs, WORK).name == "Qwen2.5-72B-Instruct"
    tried = alternatives(configs, NODE_8X80, frozenset(), WORK)
    # Qwen2.5-72B's 64 heads: widths 1, 2, 4, 8; own GPUs leave 7 for it, beside 8 (the 8B beside its
    # first engine, or a copy of the 8B beside each)
    shapes = [(a.tp, a.engines, a.beside, a.paired) for a in tried]
    own, first, each = (False, False), (True, False), (True, True)
    assert shapes == [
        (1, 7, *own),
        (1, 8, *first),
        (1, 8, *each),
        (2, 3, *own),
        (2, 4, *first),
        (2, 4, *each),
        (4, 1, *own),
        (4, 2, *first),
        (4, 2, *each),
        (8, 1, *first),
    ]
    fitting = [a for a in tried if a.layout is not None]
    assert [(a.tp, a.engines, a.paired) for a in fitting] == [(2, 3, False), (4, 1, False), (4, 2, False)] + [
        (4, 2, True),
        (8, 1, False),
    ]
    # 70 GiB of fp8 weights on one 80 GB GPU; beside the 8B on 2 GPUs, one 65,536-token sequence each does not fit
    for a in tried:
        assert (a.layout is None) == ("do not fit" in a.why), a.name
    for a in fitting:
        recorder = Recorder()
        load = loader(_overridden(raw, a.overrides), tmp_path, NODE_8X80, recorder)
        assert load.layout == a.layout, a.name
        [big] = [p for p in load.layout.placements if p.config.name == "Qwen2.5-72B-Instruct"]
        assert (len(big.gpus), 1 + len(big.copies)) == (a.tp, a.engines), a.name
        # every GPU holds what the layout puts there: the engines beside each other fit in its memory
        assert 0 < max(held_by_gpu(load.layout).values()) <= NODE_8X80.memory_bytes, a.name
        if a.paired:
            engines = load()
            paired_runs = (load.layout, recorder)
    beside = next(a for a in fitting if (a.tp, a.engines, a.beside, a.paired) == (4, 2, True, False))
    placed = {p.config.name: p for p in beside.layout.placements}
    assert placed["Llama-3.1-8B-Instruct"].gpus == (0,) and placed["Qwen2.5-72B-Instruct"].gpus == (0, 1, 2, 3)
    assert [c.gpus for c in placed["Qwen2.5-72B-Instruct"].copies] == [(4, 5, 6, 7)]
    assert placed["Llama-3.1-8B-Instruct"].copies == ()  # the 8B beside the first engine only
    # with its copies the 8B's in-process engine shares GPU 0 by memory share
    assert placed["Llama-3.1-8B-Instruct"].mode == placed["Qwen2.5-72B-Instruct"].mode == "in_process"
    # beside every engine: the 8B has a copy on the second engine's first GPU, each copy a managed server
    # started with the KV cache and memory share the model has in process beside the other
    layout, recorder = paired_runs
    placed = {p.config.name: p for p in layout.placements}
    small, big = placed["Llama-3.1-8B-Instruct"], placed["Qwen2.5-72B-Instruct"]
    assert [(c.gpus, c.mode) for c in big.copies] == [((4, 5, 6, 7), "managed_server")]
    assert [(c.gpus, c.mode) for c in small.copies] == [((4,), "managed_server")]
    assert held_by_gpu(layout)[4] == held_by_gpu(layout)[0] > held_by_gpu(layout)[5] == held_by_gpu(layout)[1]
    for p in (small, big):
        [c] = p.copies
        assert c.run_config.kv_cache_memory_bytes == p.run_config.kv_cache_memory_bytes > 0
        assert c.run_config.gpu_memory_utilization == p.run_config.gpu_memory_utilization < 0.5
    # generate's loader starts both copies as servers, builds both in-process engines and one engine per
    # model over its own and its copy, so each dialogue's turns meet both models on one group of GPUs
    assert [(d.config.name, d.device_ids) for d in recorder.served] == [
        ("Qwen2.5-72B-Instruct", ("4", "5", "6", "7")),
        ("Llama-3.1-8B-Instruct", ("4",)),
    ]
    assert sorted(c.name for c in recorder.built if c.engine == "vllm") == [
        "Llama-3.1-8B-Instruct",
        "Qwen2.5-72B-Instruct",
    ]
    assert all(len(e.engines) == 2 for e in engines.values())


def test_the_fastest_layout_that_fits_is_chosen_and_the_configured_one_is_shown(tmp_path):
    configs = model_configs(_release_models(tmp_path, "fp8"))
    configured = plan_layout(configs, NODE_8X80, frozenset(), WORK)
    tried = alternatives(configs, NODE_8X80, frozenset(), WORK)
    rows = compared(configured, tried, GPUS["h100"], [_dialogues(64, 6)], 10.0)
    assert rows[0]["name"] == "as configured" and (rows[0]["tp"], rows[0]["engines"]) == (4, 1)
    assert rows[0]["overrides"] == []
    # the configured layout is one of the alternatives: it is not repeated
    assert [(r["tp"], r["engines"]) for r in rows] == [(4, 1), (1, 7), (1, 8), (1, 8), (2, 3), (2, 4), (2, 4)] + [
        (4, 2),
        (4, 2),
        (8, 1),
    ]
    [chosen] = [r for r in rows if r["chosen"]]
    timed = [r for r in rows if "seconds" in r]
    assert chosen["seconds"] == min(r["seconds"] for r in timed) and len(timed) >= 4
    assert all(r["largest_shard_s"] == pytest.approx(r["seconds"] * 10.0) for r in timed)
    assert all(not r["fits"] and r["why"] for r in rows if r not in timed)


def test_the_ways_are_the_same_layouts_from_a_config_that_took_one_of_them(tmp_path):
    """A plan's chosen overrides applied (`layout=plan.json`), the next plan tries the same layouts: each
    way sets what it needs of the other models (placement, replicas) back where the config changed it."""
    raw = _release_models(tmp_path, "fp8")
    tried = alternatives(model_configs(raw), NODE_8X80, frozenset(), WORK)

    def shown(ways) -> list:
        return [(a.name, places(a.layout) if a.layout else None) for a in ways]

    for a in (a for a in tried if a.layout is not None):
        again = alternatives(model_configs(_overridden(raw, a.overrides)), NODE_8X80, frozenset(), WORK)
        assert shown(again) == shown(tried), a.name
    each = next(a for a in tried if a.paired and a.layout is not None)
    first = _overridden(raw, each.overrides)
    own = next(a for a in alternatives(model_configs(first), NODE_8X80) if (a.tp, a.beside) == (4, False))
    assert "assistant.placement=auto" in own.overrides and "assistant.replicas=auto" in own.overrides


def test_a_copy_of_the_8b_beside_every_72b_engine_is_modelled_faster_the_busier_the_8b_is(tmp_path):
    """Two engines of the 72B on 4 GPUs each: with the 8B beside the first only, one 8B engine answers
    every dialogue; with a copy beside each, each answers its group's half."""
    configs = model_configs(_release_models(tmp_path, "fp8"))
    tried = {(a.tp, a.engines, a.paired): a for a in alternatives(configs, NODE_8X80, frozenset(), WORK)}
    first, each = tried[(4, 2, False)], tried[(4, 2, True)]
    assert first.beside and each.beside
    gains = {}
    for reply in (20, 1000):  # the assistant's replies: the 8B nearly idle, then busy
        work = [_dialogues(64, 6, reply)]
        one, two = as_run(first.layout, GPUS["h100"], work), as_run(each.layout, GPUS["h100"], work)
        assert one.generated == two.generated
        gains[reply] = (one.seconds / two.seconds, one.busy["Llama-3.1-8B-Instruct"])
    (idle_gain, idle_share), (busy_gain, busy_share) = gains[20], gains[1000]
    assert busy_share > 0.6 > 0.2 > idle_share  # the one 8B engine is the job's bottleneck only when busy
    assert busy_gain > 1.4 and busy_gain > idle_gain + 0.3


def test_replicas_for_every_model_in_process_beyond_the_gpus_is_refused_in_one_line(tmp_path):
    raw = _release_models(tmp_path, "fp8")
    raw["user_agent"] |= {"placement": "in_process", "replicas": 3}
    raw["assistant"] |= {"placement": "in_process", "replicas": 3}
    with pytest.raises(PersonalensError, match="3 groups of the 4 GPU\\(s\\) they share: 12 GPUs, the job has 8"):
        plan_layout(model_configs(raw), NODE_8X80)


def test_the_widths_tried_are_those_vllm_shards_the_attention_over(tmp_path):
    """DeepSeek-R1-Distill-Qwen-7B's 28 heads divide over 7 GPUs, its 4 KV heads do not: not tried."""
    raw = conf(tmp_path, "llama31_8b") | {
        "name": "r1-7b",
        "path": str(model_dir(tmp_path, "deepseek_r1_distill_qwen_7b")),
    }
    tried = alternatives(model_configs({"assistant": raw}), NODE_8X80)
    assert [(a.tp, a.engines, a.alone) for a in tried] == [(1, 8, True), (2, 4, True), (4, 2, True)]
    assert tried[0].name == "r1-7b: 8 engines of 1 GPU(s)"


def test_a_pinned_bottleneck_or_no_local_model_has_no_alternatives(tmp_path):
    raw = _release_models(tmp_path)
    raw["user_agent"] |= {"gpus": [0, 1, 2, 3]}
    assert alternatives(model_configs(raw), NODE_8X80) == []
    configs = model_configs(_release_models(tmp_path))
    served = {role: dataclasses.replace(c, engine="server") for role, c in configs.items()}
    assert bottleneck(served) is None and alternatives(served, NODE_8X80) == []


# docs/cluster.md's release stand-in (its "every lever" section without the KV levers): a Qwen2.5-72B
# user agent and an 8B assistant, fp8 weights, 8 x 80 GB, H100 figures; on the bundled sample's users
# (the stand-in's 1,500 copies take minutes to render), its generate job alone
RELEASE = (
    "personalens plan protocol.max_rounds_sd=6 protocol.max_rounds_md=8 protocol.user_agent.max_tokens=200 "
    "protocol.assistant.max_tokens=300 model@assistant=llama31_8b assistant.path=/models/Llama-3.1-8B-Instruct "
    "model@user_agent=llama31_70b user_agent.name=Qwen2.5-72B-Instruct user_agent.path=/models/Qwen2.5-72B-Instruct "
    "model@judge=llama31_70b judge.name=Qwen2.5-72B-Instruct judge.path=/models/Qwen2.5-72B-Instruct "
    "user_agent.quantization=fp8 assistant.quantization=fp8 plan.gpus=8 plan.gpu_memory_gib=80 plan.gpu_type=h100 "
    "plan.jobs=[generate]"
)


def _plan(tmp_path, *extra: str) -> tuple[dict, str]:
    args = cp.runnable(RELEASE, tmp_path, str(embedded_model_dir()))
    out = tmp_path / f"plan{len(extra)}.json"
    proc = run_cli("plan", *args, *extra, f"plan.out={out}", f"run.out_dir={tmp_path / 'run'}", timeout=300)
    return json.loads(out.read_text()), proc.stdout


def test_plan_of_the_release_stand_in_with_fp8_prints_the_layouts_and_generate_runs_the_fastest(tmp_path):
    plan, printed = _plan(tmp_path)
    modelled = plan["placement"]["jobs"]["generate"]["throughput"]
    rows = modelled["alternatives"]
    # the configured layout, then every other way of placing the 72B: one line each
    assert rows[0]["name"] == "as configured" and (rows[0]["tp"], rows[0]["engines"]) == (4, 1)
    assert len(rows) == 10 and sum(not r["fits"] for r in rows) == 5
    block = printed.split("layouts for the job's bottleneck model")[1].splitlines()[1 : 1 + len(rows)]
    assert [line.strip().startswith(r["name"]) for line, r in zip(block, rows)] == [True] * len(rows)
    assert all("does not fit" in line for line, r in zip(block, rows) if not r["fits"])
    # the configured row is modelled as compare's chosen row (the same run, the same numbers)
    configured = next(r for r in modelled["layouts"] if r["chosen"])
    assert rows[0]["seconds"] == pytest.approx(configured["seconds"])
    [chosen] = [r for r in rows if r["chosen"]]
    assert chosen["seconds"] == min(r["seconds"] for r in rows if r["fits"])
    assert plan["time"]["rates_tokens_per_s"]["generate"] == chosen["tokens_per_s"]
    assert "rates modelled for each job's fastest layout (h100 figures)" in printed
    # the 72B's engine of 4 GPUs all-reduces twice in each of its 80 layers; the 8B on one GPU does not
    steps = modelled["decode_step"]
    assert (
        steps["Qwen2.5-72B-Instruct"]["allreduce"]["per_step"] == 160
        and "allreduce" not in steps["Llama-3.1-8B-Instruct"]
    )
    assert steps["Qwen2.5-72B-Instruct"]["allreduce"]["latency_s"] == pytest.approx(
        160 * GPUS["h100"].allreduce_latency
    )
    assert "160 all-reduces over its 4 GPUs, 0.96 ms a step + " in printed
    if chosen["overrides"]:
        assert f"the job builds it with {' '.join(chosen['overrides'])}" in printed
        # planned again with its overrides, the chosen layout is the one generate builds as configured
        again, _ = _plan(tmp_path, *chosen["overrides"])
        rows_again = again["placement"]["jobs"]["generate"]["throughput"]["alternatives"]
        assert rows_again[0]["seconds"] == pytest.approx(chosen["seconds"])
        assert rows_again[0]["chosen"] and again["time"]["rates_tokens_per_s"]["generate"] == chosen["tokens_per_s"]
