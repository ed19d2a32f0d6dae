"""The placement planner, pure: published architectures on simulated 80 GB GPUs."""

import json
from pathlib import Path

import pytest

from personalens.engines.placement import (
    Architecture,
    ModelNeed,
    Rules,
    plan_placement,
    visible_gpus,
    weights_bytes,
)
from personalens.errors import PersonalensError

FIXTURES = Path(__file__).parent / "fixtures" / "architectures"
GPU_80GB = 80 * 10**9
RULES = Rules(gpu_bytes=GPU_80GB)


def arch(name: str) -> Architecture:
    return Architecture.from_config(json.loads((FIXTURES / f"{name}.json").read_text()))


def need(name: str, roles: tuple[str, ...], tp: int = 1, **kw) -> ModelNeed:
    a = arch(name)
    return ModelNeed(key=name, roles=roles, arch=a, weights=a.parameters() * 2, dtype_bytes=2, tp=tp, **kw)


@pytest.mark.parametrize(
    ("name", "billions"),
    [("llama31_8b", 8.03), ("llama31_70b", 70.6), ("mistral7b_v02", 7.24), ("mixtral8x7b", 46.7)],
)
def test_parameter_counts_match_the_published_sizes(name, billions):
    assert arch(name).parameters() / 1e9 == pytest.approx(billions, rel=0.01)


def test_kv_per_token_follows_layers_kv_heads_and_head_size():
    a = arch("llama31_8b")
    assert a.kv_bytes_per_token(2) == 32 * 8 * 128 * 2 * 2  # 128 KiB in bf16
    assert a.kv_bytes_per_token(2, tp=4) == 32 * 2 * 128 * 2 * 2
    # 8 KV heads on 16 GPUs: each GPU keeps a replica of one head
    assert a.kv_bytes_per_token(2, tp=16) == 32 * 1 * 128 * 2 * 2


def test_sliding_window_layers_keep_only_their_window():
    config = json.loads((FIXTURES / "mistral7b_v02.json").read_text())
    full = Architecture.from_config(config)
    windowed = Architecture.from_config(dict(config, sliding_window=4096))
    assert windowed.kv_bytes_for(8192, 2) == full.kv_bytes_for(4096, 2)
    mixed = Architecture.from_config(
        dict(config, sliding_window=1024, layer_types=["sliding_attention", "full_attention"] * 16)
    )
    per_layer = 8 * 128 * 2 * 2
    assert mixed.kv_bytes_for(4096, 2) == 16 * per_layer * 1024 + 16 * per_layer * 4096


def test_weights_size_from_the_index_then_files_then_config(tmp_path):
    a = arch("llama31_8b")
    assert weights_bytes(tmp_path, a, 2) == (a.parameters() * 2, "estimated from config.json's parameter count")
    (tmp_path / "model-00001.safetensors").write_bytes(b"x" * 1000)
    assert weights_bytes(tmp_path, a, 2)[0] == 1000
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 12345}}))
    assert weights_bytes(tmp_path, a, 2)[0] == 12345


def test_visible_gpus_prefers_cuda_then_slurm_then_the_device_count():
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "2,3", "SLURM_JOB_GPUS": "0,1,2,3"}, 8) == ("2", "3")
    assert visible_gpus({"SLURM_STEP_GPUS": "4,5"}, 8) == ("4", "5")
    assert visible_gpus({"SLURM_JOB_GPUS": "1"}, 8) == ("1",)
    assert visible_gpus({}, 2) == ("0", "1")
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}, 2) == ()


def test_8b_assistant_with_70b_user_and_judge_on_four_gpus_share_them_in_process():
    models = [need("llama31_8b", ("assistant",)), need("llama31_70b", ("user", "judge"), tp=4)]
    placed = {p.key: p for p in plan_placement(models, 4, RULES)}
    assert {p.mode for p in placed.values()} == {"in_process"}
    assert placed["llama31_70b"].gpus == (0, 1, 2, 3) and placed["llama31_8b"].gpus == (0,)
    # GPU 0 holds both: weights, overheads and both KV budgets stay within 90% of it
    used = sum(p.weights_per_gpu + RULES.overhead_bytes + p.kv_cache_memory_bytes for p in placed.values())
    assert used <= GPU_80GB * 0.9
    assert all(p.seqs_that_fit >= RULES.min_seqs for p in placed.values())


def test_70b_alone_on_one_or_two_gpus_is_refused_before_loading_with_the_sizes():
    with pytest.raises(PersonalensError, match=r"do not fit on 1 GPU.*llama31_70b.*Ways out.*engine: server"):
        plan_placement([need("llama31_70b", ("user",), tp=4)], 1, RULES)
    with pytest.raises(PersonalensError, match="GiB per GPU"):
        plan_placement([need("llama31_70b", ("user",), tp=2)], 2, RULES)


def test_the_kv_budget_holds_at_least_one_sequence_of_max_model_len():
    """vLLM refuses to start unless the KV cache holds one max_model_len sequence: at Llama-3.1's full
    131,072-token context the 70B's KV (10 GiB per GPU at tp 4) beside the 8B's (16 GiB) no longer fits
    one node of 4 x 80 GB in process, which 32 sequences of 2,048 tokens alone would allow."""
    full = 131_072
    a = arch("llama31_8b")
    [alone] = plan_placement([need("llama31_8b", ("assistant",), max_model_len=full)], 1, RULES)
    assert alone.kv_cache_memory_bytes >= a.kv_bytes_for(full, 2)
    models = [
        need("llama31_8b", ("assistant",), max_model_len=full),
        need("llama31_70b", ("user", "judge"), tp=4, max_model_len=full),
    ]
    with pytest.raises(PersonalensError, match="at least one max_model_len of 131072"):
        plan_placement(models, 4, RULES)
    placed = plan_placement(models, 8, RULES)  # each on its own GPUs instead
    assert [(p.mode, p.gpus) for p in placed] == [("managed_server", (0,)), ("managed_server", (1, 2, 3, 4))]
    assert all(p.kv_cache_memory_bytes >= p.kv_per_token_per_gpu * full for p in placed)


def test_two_8b_class_models_share_one_gpu_in_process():
    models = [need("llama31_8b", ("assistant",)), need("mistral7b_v02", ("user", "judge"))]
    placed = plan_placement(models, 1, RULES)
    assert [p.mode for p in placed] == ["in_process", "in_process"]
    assert sum(p.kv_cache_memory_bytes for p in placed) > 0


def test_models_too_large_together_become_servers_on_their_own_gpus():
    # Mixtral at tp 2 (~47 GB per GPU) and a 70B at tp 4 (~35 GB per GPU) overflow shared GPUs
    models = [need("mixtral8x7b", ("assistant",), tp=2), need("llama31_70b", ("user", "judge"), tp=4)]
    with pytest.raises(PersonalensError):
        plan_placement(models, 4, RULES)
    placed = plan_placement(models, 8, RULES)
    assert [(p.mode, p.gpus) for p in placed] == [("managed_server", (0, 1)), ("managed_server", (2, 3, 4, 5))]


def test_explicit_placement_and_gpus_are_honoured_or_refused():
    models = [
        need("llama31_8b", ("assistant",), placement="managed_server", gpus=(3,)),
        need("mistral7b_v02", ("user",), gpus=(0,)),
    ]
    assert [(p.mode, p.gpus) for p in plan_placement(models, 4, RULES)] == [
        ("managed_server", (3,)),
        ("managed_server", (0,)),
    ]
    # a model without explicit GPUs takes the lowest one left, not one after the explicit ones
    models = [
        need("llama31_8b", ("assistant",), gpus=(3,), placement="managed_server"),
        need("mistral7b_v02", ("user",)),
    ]
    assert [p.gpus for p in plan_placement(models, 4, RULES)] == [(3,), (0,)]
    with pytest.raises(PersonalensError, match="must list tensor_parallel_size=1"):
        plan_placement([need("llama31_8b", ("assistant",), gpus=(0, 1))], 2, RULES)
    with pytest.raises(PersonalensError, match="not among the 1 visible"):
        plan_placement([need("llama31_8b", ("assistant",), gpus=(1,))], 1, RULES)
    big = [need("mixtral8x7b", ("assistant",), tp=2), need("llama31_70b", ("user",), tp=4, placement="in_process")]
    with pytest.raises(PersonalensError):
        plan_placement(big, 8, RULES)


@pytest.mark.parametrize("n_gpus", [1, 2, 4, 8])
def test_each_8b_class_model_alone_fits_every_node_size(n_gpus):
    for name in ("llama31_8b", "mistral7b_v02"):
        [p] = plan_placement([need(name, ("assistant",))], n_gpus, RULES)
        assert p.mode == "in_process" and p.seqs_that_fit >= RULES.min_seqs


@pytest.mark.parametrize(("n_gpus", "fits"), [(1, False), (2, False), (4, True), (8, True)])
def test_70b_user_agent_and_judge_with_8b_assistant_by_node_size(n_gpus, fits):
    models = [need("llama31_8b", ("assistant",)), need("llama31_70b", ("user", "judge"), tp=min(4, n_gpus))]
    if not fits:
        with pytest.raises(PersonalensError, match="do not fit"):
            plan_placement(models, n_gpus, RULES)
        return
    placed = plan_placement(models, n_gpus, RULES)
    gpu0 = sum(p.weights_per_gpu + RULES.overhead_bytes + p.kv_cache_memory_bytes for p in placed if 0 in p.gpus)
    assert gpu0 <= GPU_80GB * 0.9
    assert all(p.seqs_that_fit >= RULES.min_seqs for p in placed)
