"""The engine model `plan` and bench/stragglers.py replay dialogues through (personalens/plan/engine_model.py),
and the engines plan/throughput.py makes of a layout, pure."""

import dataclasses
import json
import random
from pathlib import Path

import pytest

from personalens.engines.placement.architecture import Architecture
from personalens.engines.placement.copies import with_copies
from personalens.engines.placement.fitting import layouts
from personalens.engines.placement.sizing import ModelNeed, Rules
from personalens.plan.budget import Fixed, Turns, Workload, spread
from personalens.plan.engine_model import Turn, simulate
from personalens.plan.gpu_model import GPUS, GpuModel, engine_of
from personalens.plan.throughput import compare, dialogues, sampled

ARCHITECTURES = Path(__file__).parent / "fixtures" / "architectures"


@pytest.mark.parametrize(
    ("decodes", "context", "steps", "tp"),
    [(4, 0, 50, 1), (256, 0, 400, 1), (256, 300_000, 30, 1), (1, 10, 1, 1), (64, 1_000, 2, 1), (96, 5_000, 40, 4)],
    ids=["memory-bound", "compute-then-memory", "long-context", "one-step", "two-steps", "tensor-parallel"],
)
def test_decode_steps_in_closed_form_equal_the_steps_one_by_one(decodes, context, steps, tp):
    gpu = GpuModel(tp=tp)
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


def test_a_tensor_parallel_step_pays_two_all_reduces_a_layer_of_its_tokens_hidden_states():
    """Counted by hand: Qwen2.5-72B's 80 layers of hidden 8192 on 4 H100s, a step of 96 decodes and 512
    prompt tokens: 160 all-reduces of 608 x 8192 x 2 bytes, a ring moving 2 x 3/4 of them."""
    h100 = GPUS["h100"]
    one = GpuModel(params=72.7e9, layers=80, hidden=8192, link_bandwidth=h100.link_bandwidth)
    four = dataclasses.replace(one, tp=4, allreduce_latency=h100.allreduce_latency)
    paid = 160 * (h100.allreduce_latency + 608 * 8192 * 2 * 1.5 / h100.link_bandwidth)
    assert four.step_seconds(96, 512, 40_000) - one.step_seconds(96, 512, 40_000) == pytest.approx(paid)
    assert one.allreduce_seconds(608) == 0 and four.allreduce_seconds(0) == 0
    # the latency is a term of its own: without it only the bytes are paid
    assert dataclasses.replace(four, allreduce_latency=0).allreduce_seconds(608) == pytest.approx(
        paid - 160 * h100.allreduce_latency
    )


def test_one_engine_of_8_gpus_pays_more_communication_than_two_of_4_for_the_same_tokens():
    """The same 96 sequences a step: one engine of 8 GPUs all-reduces them all over a wider ring; two
    engines of 4 each all-reduce their half, side by side."""
    arch = Architecture.from_config(json.loads((ARCHITECTURES / "qwen25_72b.json").read_text()))
    rules = Rules(gpu_bytes=80 * 2**30)
    engines = {}
    for tp in (4, 8):
        need = ModelNeed("72b", ("user_agent",), arch, arch.parameters(), 2, tp=tp, max_model_len=16_384)
        [placed] = layouts([need], tp, rules).placements
        engines[tp] = engine_of(need, placed, GPUS["h100"])
    assert (engines[4].tp, engines[8].tp) == (4, 8)
    wide, narrow = engines[8].allreduce_seconds(96), engines[4].allreduce_seconds(48)
    assert wide > narrow and wide - narrow == pytest.approx(
        160 * (96 * 7 / 4 - 48 * 3 / 2) * 8192 * 2 / GPUS["h100"].link_bandwidth
    )


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
    # its 4 GPUs all-reduce at the H100's NVLink figures
    assert (engine.tp, engine.link_bandwidth, engine.allreduce_latency) == (4, 370e9, 6e-6)
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


def paper_need(name: str, roles: tuple[str, ...], tp: int) -> ModelNeed:
    """A model of tests/fixtures/architectures in bf16 at the paper protocol's max_model_len."""
    arch = Architecture.from_config(json.loads((ARCHITECTURES / f"{name}.json").read_text()))
    return ModelNeed(name, roles, arch, arch.parameters() * 2, 2, tp=tp, max_model_len=65_536)


def test_dialogues_in_flight_as_the_kv_cache_holds_keep_histories_cached():
    """The complete release's shape on 8 x 80 GB: a Qwen2.5-72B user agent (tp 4, 431,756 tokens of KV
    cache) and an 8B assistant with three copies, 8 rounds of 200/300-token replies, 256 dialogues.
    All in flight, the 72B's cache cannot keep their histories and most prompt tokens are computed
    again; as many in flight as it keeps (the rest waiting their turn), most are served from cache,
    and the layout is modelled faster."""
    rules = Rules(gpu_bytes=80 * 10**9)
    layout = with_copies(
        layouts([paper_need("qwen25_72b", ("user_agent",), 4), paper_need("llama31_8b", ("assistant",), 1)], 8, rules),
        8,
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
    # lockstep.cohorts auto: one per 16 of the 256 dialogues; the window leaves dialogues to as many
    # of them as its parts of 16 make (engines/placement/cohorts.py window_share)
    assert (every["cohorts"], every["cohorts_at_once"]) == (16, 16)
    assert (held["cohorts"], held["cohorts_at_once"]) == (16, -(-held["in_flight"] // 16))


def varied_dialogues(n: int, seed: int = 0) -> list[list[Turn]]:
    """Dialogues of 2-6 rounds whose replies differ as bench/stragglers.py assumes: log-normal around
    200 tokens (sigma 0.7), capped at 800; seeded."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        turns, prompt, last = [], 900, {"user": 0, "assistant": 0}
        for t in range(2 * rng.randint(2, 6)):
            role = ("user", "assistant")[t % 2]
            reply = min(800, max(1, int(rng.lognormvariate(0, 0.7) * 200)))
            turns.append(Turn(role, prompt, last[role], reply))
            last[role], prompt = prompt, prompt + reply + 20
        out.append(turns)
    return out


def two_engines() -> dict[str, list[GpuModel]]:
    return {"user": [GpuModel(name="user")], "assistant": [GpuModel(name="assistant")]}


def test_cohorts_whose_calls_join_keep_two_equal_engines_busier_and_run_each_turn_once():
    """Lockstep in cohorts (simulate/lockstep.py with engines that join calls): the same requests as
    strict alternation, each cohort one call per turn with its requests finishing inside it; with
    replies that differ, a cohort's next turns join the other engine's running batch while other
    cohorts' last replies finish, so both engines compute more of the time and the run ends sooner."""
    work = varied_dialogues(128)
    strict = simulate(work, two_engines(), "lockstep")
    two = simulate(work, two_engines(), "lockstep", cohorts=2)
    small = simulate(work, two_engines(), "lockstep", cohorts=8, least=16)
    tokens = (sum(t.reply for d in work for t in d), sum(t.prompt for d in work for t in d))
    for result, count in ((strict, 1), (two, 2), (small, 8)):
        assert (result.generated, result.prompt) == tokens
        assert len(result.calls) == sum(max(len(d) for d in work[k::count]) for k in range(count))
        assert all(start <= min(done) and max(done) <= end for start, end, done in result.calls)
        assert sum(len(done) for _, _, done in result.calls) == sum(map(len, work))
    # strict alternation: one engine at a time, so the busy shares add up to the whole run
    assert sum(strict.busy.values()) == pytest.approx(strict.seconds, rel=1e-9)
    # two cohorts of 64 start together and their calls join into one batch: each ends with the
    # longest of its 64 replies, nearly together, so they stay nearly in step; cohorts of 16 (auto's)
    # drift apart and overlap the engines
    assert strict.seconds > two.seconds > small.seconds and strict.seconds > 1.25 * small.seconds
    assert sum(small.busy.values()) > 1.4 * small.seconds


def test_a_window_smaller_than_the_cohorts_parts_runs_fewer_cohorts():
    # 20 dialogues in flight in parts of at least 16: the first cohort takes 16, the second 4, the
    # other two none until dialogues end (engines/placement/cohorts.py window_share)
    result = simulate(varied_dialogues(64), two_engines(), "lockstep", window=20, cohorts=4, least=16)
    assert sorted(len(done) for start, _, done in result.calls if start == 0) == [4, 16]
    assert result.generated == sum(t.reply for d in varied_dialogues(64) for t in d)


def test_calibrated_replies_that_differ_make_plan_model_the_runs_cohorts_faster_than_one():
    """plan with a calibration run: each role's replies as long as the run's were (budget.spread),
    so that the cohorts the run makes (auto: one per 16 dialogues on a 72B user agent and 8B
    assistant of their own GPUs) drift apart and keep the models busier than one cohort."""
    rules = Rules(gpu_bytes=80 * 10**9)
    layout = with_copies(
        layouts([paper_need("qwen25_72b", ("user_agent",), 4), paper_need("llama31_8b", ("assistant",), 1)], 8, rules),
        8,
    )
    rng = random.Random(1)
    measured = spread([min(800, rng.lognormvariate(0, 0.7) * 200) for _ in range(2_000)])
    fixed = Fixed(700, 900, 500, {"task_completion/": 700})
    calibrated = Turns(
        {8: 0.5, 12: 0.5}, {"user": 200, "assistant": 300}, 250, "t", {"user": measured, "assistant": measured}
    )
    workload = Workload({"MD": fixed}, {"MD": calibrated}, 100, [], False, "t")
    turns, _ = dialogues(sampled({"MD": 64}, workload, 64), workload, {})
    assistant = sorted(t.reply for d in turns for t in d if t.role == "assistant")
    assert assistant[0] < 100 < 600 < assistant[-1]  # 300 x the measured quantiles
    assert sum(assistant) / len(assistant) == pytest.approx(300, rel=0.05)
    rows = compare(layout, GPUS["h100"], [turns], "all")["layouts"]
    auto, one = rows[0], next(r for r in rows if r["name"].endswith("one cohort (lockstep.cohorts=1)"))
    assert (auto["cohorts"], one["cohorts"]) == (4, 1) and one["name"] == auto[
        "name"
    ] + ", one cohort (lockstep.cohorts=1)"
    assert auto["tokens_per_s"] > 1.2 * one["tokens_per_s"] and auto["best"]
    # at the mean every reply is alike: the cohorts stay in step, about as fast as one (a cohort whose
    # prompts were prefilled first may finish its turn a little sooner)
    alike = Workload({"MD": fixed}, {"MD": dataclasses.replace(calibrated, spread={})}, 100, [], False, "t")
    turns, _ = dialogues(sampled({"MD": 64}, alike, 64), alike, {})
    rows = compare(layout, GPUS["h100"], [turns], "all")["layouts"]
    one = next(r for r in rows if r["name"].endswith("one cohort (lockstep.cohorts=1)"))
    assert rows[0]["tokens_per_s"] == pytest.approx(one["tokens_per_s"], rel=0.02)


def test_a_prefix_other_dialogues_share_is_a_hit_and_a_prompts_tail_is_not():
    """A KV cache that keeps no history (every dialogue in flight, 2,000 tokens): only the prompts'
    shared beginnings (`Fixed.shared`: instructions, the user's profile) are served from cache. With
    room for every history, a turn repeats its role's previous prompt but for that prompt's tail
    (`Fixed.tail`: instructions after the conversation), which is computed again."""
    turns = Turns({6: 1.0}, {"user": 50, "assistant": 100}, 80, "test")
    plain = Fixed(600, 800, 500, {})
    shared = Fixed(600, 800, 500, {}, {"user": 300, "assistant": 500}, {"user_first": 400, "user": 200})
    out = {}
    for name, fixed in (("plain", plain), ("shared", shared)):
        workload = Workload({"SD": fixed}, {"SD": turns}, 100, [], False, "t")
        work, _ = dialogues(sampled({"SD": 64}, workload, 64), workload, {})
        out[name] = [simulate(work, GpuModel(kv_tokens=k), "lockstep") for k in (2_000, 10**7)]
        out[name, "turns"] = work
    prompt = sum(t.prompt for d in out["shared", "turns"] for t in d)
    small, large = out["shared"]
    assert out["plain"][0].computed == prompt  # nothing kept, nothing shared: every token computed
    assert small.computed == prompt - sum(t.shared for d in out["shared", "turns"] for t in d)
    # with every history kept, a turn computes what follows the larger of its shared beginning and
    # the part of its role's previous prompt before that prompt's tail
    [t1, _, t3, _, t5, _] = out["shared", "turns"][0]
    assert (t3.reusable, t5.reusable) == (t1.prompt - 400, t3.prompt - 200)
    for name, result in (("plain", out["plain"][1]), ("shared", large)):
        work = out[name, "turns"]
        assert result.computed == sum(t.prompt - max(t.reusable, t.shared) for d in work for t in d)
