"""The engine model `plan` and bench/stragglers.py replay dialogues through (personalens/plan/engine_model.py),
and the engines plan/throughput.py makes of a layout, pure."""

import dataclasses
import json
from pathlib import Path

import pytest

from personalens.engines.placement.architecture import Architecture
from personalens.engines.placement.layout import layouts, with_copies
from personalens.engines.placement.sizing import ModelNeed, Rules
from personalens.plan.budget import Fixed, Turns, Workload
from personalens.plan.engine_model import GpuModel, Turn, simulate
from personalens.plan.throughput import GPUS, compare, dialogues, engine_of, sampled

ARCHITECTURES = Path(__file__).parent / "fixtures" / "architectures"


@pytest.mark.parametrize(
    ("decodes", "context", "steps"),
    [(4, 0, 50), (256, 0, 400), (256, 300_000, 30), (1, 10, 1), (64, 1_000, 2)],
    ids=["memory-bound", "compute-then-memory", "long-context", "one-step", "two-steps"],
)
def test_decode_steps_in_closed_form_equal_the_steps_one_by_one(decodes, context, steps):
    gpu = GpuModel()
    one_by_one = sum(gpu.step_seconds(decodes, 0, context + i * decodes) for i in range(steps))
    assert gpu.decode_seconds(decodes, context, steps) == pytest.approx(one_by_one, rel=1e-12)


def test_256_decodes_switch_from_compute_to_memory_within_the_stretch():
    gpu = GpuModel()
    terms = [
        (
            gpu.step_seconds(256, 0, i * 256) - gpu.overhead,
            (2 * gpu.params + i * 256 * gpu.kv_bytes_per_token) / gpu.bandwidth,
        )
        for i in (0, 399)
    ]
    assert terms[0][0] > terms[0][1] and terms[1][0] == terms[1][1]  # compute first, memory last


def one_turn_dialogues(n: int, prompt: int = 1000, reply: int = 100) -> list[list[Turn]]:
    return [[Turn("assistant", prompt, 0, reply)] for _ in range(n)]


def test_replicas_take_a_share_of_the_batch_each_and_run_side_by_side():
    work = one_turn_dialogues(512)
    one = simulate(work, {"assistant": [GpuModel()]}, "lockstep")
    two = simulate(work, {"assistant": [GpuModel(), GpuModel()]}, "lockstep")
    same = simulate(work, {"assistant": [GpuModel()] * 2}, "lockstep")  # one engine named twice
    assert one.generated == two.generated == 512 * 100
    assert two.seconds == pytest.approx(simulate(work[:256], GpuModel(), "lockstep").seconds)
    assert two.seconds < 0.6 * one.seconds and same.seconds == one.seconds


def test_a_model_serving_two_roles_is_one_engine_with_one_cache():
    """A dialogue's user and assistant turns on one engine share its KV cache; on two engines each has its own."""
    turns = [Turn("user", 2000, 0, 50), Turn("assistant", 2100, 0, 50), Turn("user", 2200, 2000, 50)]
    small = GpuModel(kv_tokens=2200)  # holds one sequence: the assistant's turn evicts the user's
    shared = simulate([turns], small, "lockstep")
    apart = simulate([turns], {"user": [small], "assistant": [dataclasses.replace(small)]}, "lockstep")
    assert apart.computed == shared.computed - 2000  # the user's history stayed in its own cache
    with pytest.raises(ValueError, match="one engine"):
        simulate([turns], {"user": [small], "assistant": [dataclasses.replace(small)]}, "continuous")


def test_a_layouts_engines_follow_its_models_gpus_and_kv():
    arch = Architecture.from_config(json.loads((ARCHITECTURES / "llama31_70b.json").read_text()))
    need = ModelNeed("70b", ("judge",), arch, arch.parameters() * 2, 2, tp=4, max_model_len=16_384)
    [placed] = layouts([need], 4, Rules(gpu_bytes=80 * 10**9)).placements
    engine = engine_of(need, placed, GPUS["h100"])
    assert engine.bandwidth == pytest.approx(4 * 3.35e12 * 0.75) and engine.flops == pytest.approx(4 * 989e12 * 0.5)
    assert engine.kv_bytes_per_token == arch.kv_bytes_per_token(2) == 4 * placed.kv_per_token_per_gpu
    assert engine.kv_tokens == placed.kv_tokens == placed.kv_cache_memory_bytes // placed.kv_per_token_per_gpu
    # a 70B judge on 8 GPUs: the run's second copy on GPUs 4-7 is modelled, faster than the judge alone
    fixed = Fixed(600, 800, 500, {"task_completion/": 700})
    workload = Workload(
        {"SD": fixed},
        {"SD": Turns({4: 1.0}, {"user": 50, "assistant": 200}, 130, "test")},
        100,
        ["task_completion/"],
        False,
        "test",
    )
    _, judged = dialogues(sampled({"SD": 64}, workload, 64), workload, {"judge": 16_000})
    rules = Rules(gpu_bytes=80 * 10**9)
    eight = layouts([need], 8, rules)
    with_copy, alone = compare(with_copies(eight, 8), GPUS["h100"], [judged])["layouts"]
    assert (with_copy["name"], with_copy["chosen"], with_copy["copies"]) == (
        "in process + 1 copy of 70b on GPU 4,5,6,7",
        True,
        {"70b": [[4, 5, 6, 7]]},
    )
    assert (alone["name"], alone["chosen"]) == ("in process without the copies", False)
    assert with_copy["kv_tokens"] == alone["kv_tokens"]  # the copy holds what the model holds alone
    assert with_copy["tokens_per_s"] > 1.5 * alone["tokens_per_s"]
    assert with_copy["best"] and with_copy["busy_share"]["70b"] > 0.99  # a judge alone: its engines never wait
    # without copies (replicas: 1) the layout alone is modelled
    held = layouts([dataclasses.replace(need, replicas=1)], 8, rules)
    [only] = compare(with_copies(held, 8), GPUS["h100"], [judged])["layouts"]
    assert (only["name"], only["chosen"], only["tokens_per_s"]) == ("in process", True, alone["tokens_per_s"])


def test_sampled_dialogues_keep_the_kinds_and_turn_counts_and_end_at_max_model_len():
    fixed = Fixed(600, 800, 500, {"task_completion/": 700})
    turns = Turns({2: 0.3, 4: 0.7}, {"user": 50, "assistant": 200}, 130, "test")
    workload = Workload({"SD": fixed, "MD": fixed}, {"SD": turns, "MD": turns}, 100, ["task_completion/"], False, "t")
    shapes = sampled({"SD": 300, "MD": 100}, workload, 40)
    assert sorted(shapes) == sorted([("MD", 2)] * 3 + [("MD", 4)] * 7 + [("SD", 2)] * 9 + [("SD", 4)] * 21)
    assert len(sampled({"SD": 2, "MD": 1}, workload, 40)) == 3  # fewer than the limit: all of them
    made, judged = dialogues([("SD", 4)], workload, {"user": 1000, "assistant": None, "judge": None})
    # turn 3 (the user agent's, 800 + 2 x 130 prompt tokens) is longer than its 1,000: the dialogue ends
    assert [(t.role, t.prompt, t.reusable, t.reply) for t in made[0]] == [
        ("user", 600, 0, 50),
        ("assistant", 630, 0, 200),
    ]
    assert [[(t.role, t.prompt)] for [t] in judged] == [[("judge", 700 + 2 * 130)]]


def test_dialogues_in_flight_as_the_kv_cache_holds_keep_histories_cached():
    """The complete release's shape on 8 x 80 GB: a Qwen2.5-72B user agent (tp 4, 431,756 tokens of KV
    cache) and an 8B assistant with three copies, 8 rounds of 200/300-token replies, 256 dialogues.
    All in flight, the 72B's cache cannot keep their histories and most prompt tokens are computed
    again; as many in flight as it keeps (the rest waiting their turn), most are served from cache,
    and the layout is modelled faster."""
    rules = Rules(gpu_bytes=80 * 10**9)

    def need(name: str, roles: tuple[str, ...], tp: int) -> ModelNeed:
        arch = Architecture.from_config(json.loads((ARCHITECTURES / f"{name}.json").read_text()))
        return ModelNeed(name, roles, arch, arch.parameters() * 2, 2, tp=tp, max_model_len=65_536)

    layout = with_copies(
        layouts([need("qwen25_72b", ("user_agent",), 4), need("llama31_8b", ("assistant",), 1)], 8, rules), 8
    )
    fixed = Fixed(700, 900, 500, {"task_completion/": 700})
    workload = Workload(
        {"MD": fixed}, {"MD": Turns({16: 1.0}, {"user": 200, "assistant": 300}, 250, "test")}, 100, [], False, "t"
    )
    turns, _ = dialogues(sampled({"MD": 256}, workload, 256), workload, {})
    result = compare(layout, GPUS["h100"], [turns])
    held, every = result["layouts"][:2]
    assert held["in_flight"] == result["in_flight"] < 256 and "in_flight" not in every
    assert every["prefilled_share"] > 0.4 > 0.25 > held["prefilled_share"]
    assert held["chosen"] and not every["chosen"] and held["tokens_per_s"] > every["tokens_per_s"]
    assert held["busy_share"]["qwen25_72b"] > held["busy_share"]["llama31_8b"]
