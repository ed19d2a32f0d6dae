"""The placement planner, pure: published architectures (tests/fixtures/architectures, sources in its
README.md) on simulated 80 GB GPUs."""

import dataclasses
import json
from pathlib import Path

import pytest

from personalens.engines.placement.architecture import Architecture
from personalens.engines.placement.copies import engine_time, with_copies
from personalens.engines.placement.fitting import largest_max_model_len, layouts, plan_placement
from personalens.engines.placement.gpus import GIB, visible_gpus
from personalens.engines.placement.inflight import dialogues_in_flight, in_flight
from personalens.engines.placement.sizing import ModelNeed, Rules, batched_tokens, weights_bytes
from personalens.errors import PersonalensError

FIXTURES = Path(__file__).parent / "fixtures" / "architectures"
GPU_80GB = 80 * 10**9
RULES = Rules(gpu_bytes=GPU_80GB)


def config(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def arch(name: str) -> Architecture:
    return Architecture.from_config(config(name))


def need(name: str, roles: tuple[str, ...], tp: int = 1, dtype_bytes: int = 2, **kw) -> ModelNeed:
    a = arch(name)
    return ModelNeed(
        key=name, roles=roles, arch=a, weights=a.parameters() * dtype_bytes, dtype_bytes=dtype_bytes, tp=tp, **kw
    )


def used_per_gpu(placed, gpu: int) -> int:
    return sum(p.held_per_gpu(RULES) for p in placed if gpu in p.gpus)


@pytest.mark.parametrize(
    ("name", "billions", "vision"),
    [
        ("llama31_8b", 8.03, 0),
        ("llama31_70b", 70.6, 0),
        ("mistral7b_v02", 7.24, 0),
        ("mixtral8x7b", 46.7, 0),
        ("gemma2_27b", 27.2, 0),
        ("gemma3_27b", 27.4, 0.4),  # the language model of text_config, without its SigLIP tower
        ("mistral_small31_24b", 24.0, 0.4),  # without its Pixtral tower
        ("qwen25_72b", 72.7, 0),
    ],
)
def test_parameter_counts_match_the_published_sizes(name, billions, vision):
    assert arch(name).parameters() / 1e9 == pytest.approx(billions - vision, rel=0.01)


def test_kv_per_token_follows_layers_kv_heads_and_head_size():
    a = arch("llama31_8b")
    assert a.kv_bytes_per_token(2) == 32 * 8 * 128 * 2 * 2  # 128 KiB in bf16
    assert a.kv_bytes_per_token(2, tp=4) == 32 * 2 * 128 * 2 * 2
    # 8 KV heads on 16 GPUs: each GPU keeps a replica of one head
    assert a.kv_bytes_per_token(2, tp=16) == 32 * 1 * 128 * 2 * 2
    assert arch("qwen25_72b").kv_bytes_per_token(2) == 80 * 8 * 128 * 2 * 2
    assert (a.context, a.checkpoint_dtype, a.windows) == (131_072, "bfloat16", (None,) * 32)


def test_a_nested_text_config_is_read_with_its_familys_defaults():
    """Gemma 3 and Mistral-Small-3.1 nest the language model in `text_config`; Gemma 3's leaves out
    its vocabulary, context and sliding-window pattern, which transformers fills in."""
    gemma3 = arch("gemma3_27b")
    assert (gemma3.layers, gemma3.kv_heads, gemma3.head_dim) == (62, 16, 128)
    assert (gemma3.vocab, gemma3.context, gemma3.tied_embeddings) == (262_208, 131_072, True)
    # five sliding layers of 1,024 tokens, then a global one: layers 5, 11, ..., 59 are global
    assert [i for i, w in enumerate(gemma3.windows) if w is None] == list(range(5, 62, 6))
    assert set(gemma3.windows) == {None, 1024}
    mistral = arch("mistral_small31_24b")
    assert (mistral.layers, mistral.kv_heads, mistral.vocab, mistral.context) == (40, 8, 131_072, 131_072)
    assert mistral.windows == (None,) * 40 and mistral.checkpoint_dtype == "bfloat16"


def test_sliding_window_layers_keep_only_their_window():
    per_layer = 16 * 128 * 2 * 2
    # Gemma 2's config has neither layer_types nor a pattern: its layers alternate, the first sliding
    gemma2 = arch("gemma2_27b")
    assert gemma2.windows[:4] == (4096, None, 4096, None) and gemma2.windows.count(None) == 23
    assert gemma2.kv_bytes_for(8192, 2) == 23 * per_layer * 4096 + 23 * per_layer * 8192
    # the same config listing its layer types is read from the list
    listed = dict(config("gemma2_27b"), layer_types=["full_attention"] * 46)
    assert Architecture.from_config(listed).windows == (None,) * 46
    # Gemma 3 at its full context: ten global layers hold it all, 52 hold 1,024 tokens
    gemma3 = arch("gemma3_27b")
    assert gemma3.kv_bytes_for(131_072, 2) == per_layer * (10 * 131_072 + 52 * 1024)
    # a sliding window that is switched off (Qwen2.5) or absent (Mistral v0.2) keeps every token
    assert arch("qwen25_72b").windows == (None,) * 80
    mistral = config("mistral7b_v02")
    windowed = Architecture.from_config(dict(mistral, sliding_window=4096))
    assert windowed.kv_bytes_for(8192, 2) == Architecture.from_config(mistral).kv_bytes_for(4096, 2)


def test_llama4s_chunked_attention_layers_keep_a_chunk():
    """Llama 4 (text_config): the layers with RoPE attend within chunks; every fourth is a global NoPE layer."""
    text = {
        "model_type": "llama4_text",
        "num_hidden_layers": 8,
        "hidden_size": 5120,
        "num_attention_heads": 40,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "intermediate_size": 8192,
        "vocab_size": 202_048,
        "attention_chunk_size": 8192,
    }
    a = Architecture.from_config({"model_type": "llama4", "text_config": text})
    assert a.windows == (8192, 8192, 8192, None) * 2


def test_weights_size_from_the_index_then_files_then_config_in_the_configured_dtype(tmp_path):
    a = arch("llama31_8b")  # a bfloat16 checkpoint
    assert weights_bytes(tmp_path, a, 2) == (a.parameters() * 2, "estimated from config.json's parameter count")
    assert weights_bytes(tmp_path, a, 4)[0] == a.parameters() * 4
    (tmp_path / "model-00001.safetensors").write_bytes(b"x" * 1000)
    assert weights_bytes(tmp_path, a, 2)[0] == 1000
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 12345}}))
    assert weights_bytes(tmp_path, a, 2)[0] == 12345
    # dtype float32 on a bfloat16 checkpoint takes twice its files
    assert weights_bytes(tmp_path, a, 4) == (24690, "model.safetensors.index.json total_size, bfloat16 on disk x 4/2")
    # a quantized checkpoint, or one whose dtype is not known, is taken as it is on disk
    assert weights_bytes(tmp_path, dataclasses.replace(a, quantization="fp8"), 4)[0] == 12345
    assert weights_bytes(tmp_path, dataclasses.replace(a, checkpoint_dtype=None), 4)[0] == 12345


def test_activations_are_bounded_by_the_batched_tokens():
    """vLLM profiles one forward pass of max_num_batched_tokens; with chunked prefill off a whole
    max_model_len prompt goes through at once, and a pinned KV cache must leave room for it."""
    a = arch("llama31_8b")
    assert batched_tokens(None, None, 131_072) == batched_tokens(None, True, 131_072) == 16_384
    assert batched_tokens(None, False, 131_072) == 131_072 and batched_tokens(4096, False, 131_072) == 4096
    per_token = 2 * (4 * 4096 + (2 * 32 + 2 * 8) * 128 + 4 * 14336)
    sampler = 256 * 128_256 * 32
    assert a.activation_bytes(16_384, 256, 2) == 16_384 * per_token + sampler
    assert a.activation_bytes(131_072, 256, 2) > 8 * a.activation_bytes(16_384, 256, 2) - 8 * sampler
    chunked = need("llama31_8b", ("assistant",), max_model_len=131_072)
    whole = dataclasses.replace(chunked, batched_tokens=131_072)
    [p], [q] = plan_placement([chunked], 1, RULES), plan_placement([whole], 1, RULES)
    assert p.activation_per_gpu < 4 * GIB < 21 * GIB < q.activation_per_gpu  # 3.5 and 21.5 GiB
    # the KV cache gives way to the activations: the GPU holds the same in both
    assert p.kv_cache_memory_bytes - q.kv_cache_memory_bytes == q.activation_per_gpu - p.activation_per_gpu
    assert p.held_per_gpu(RULES) == q.held_per_gpu(RULES) <= GPU_80GB * 0.9


def test_visible_gpus_prefers_cuda_then_slurm_then_the_device_count():
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "2,3", "SLURM_JOB_GPUS": "0,1,2,3"}, 8) == ("2", "3")
    assert visible_gpus({"SLURM_STEP_GPUS": "4,5"}, 8) == ("4", "5")
    assert visible_gpus({"SLURM_JOB_GPUS": "1"}, 8) == ("1",)
    assert visible_gpus({}, 2) == ("0", "1")
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}, 2) == ()


def test_8b_assistant_with_70b_user_and_judge_on_four_gpus_share_them_in_process():
    models = [need("llama31_8b", ("assistant",)), need("llama31_70b", ("user", "judge"), tp=4, max_model_len=16_384)]
    chosen = layouts(models, 4, RULES)
    [own] = chosen.others
    assert chosen.name == "in process" and own.placements is None and "they need 5 GPUs, the job has 4" in own.why
    placed = {p.key: p for p in chosen.placements}
    assert {p.mode for p in placed.values()} == {"in_process"}
    assert placed["llama31_70b"].gpus == (0, 1, 2, 3) and placed["llama31_8b"].gpus == (0,)
    # GPU 0 holds both: weights, overheads, activations and both KV budgets stay within 90% of it
    assert used_per_gpu(chosen.placements, 0) <= GPU_80GB * 0.9 < used_per_gpu(chosen.placements, 0) + GIB
    # the free memory is split so that both hold as many tokens
    tokens = [p.kv_cache_memory_bytes / p.kv_per_token_per_gpu for p in placed.values()]
    assert tokens[0] == pytest.approx(tokens[1], rel=1e-6)
    assert placed["llama31_70b"].max_len_seqs >= 1


def test_with_free_gpus_each_model_gets_gpus_of_its_own():
    """On 8 GPUs the same models fit either way: the 70B takes the first four in this process, the 8B a
    server on the fifth, each with a whole GPU's memory instead of sharing GPU 0."""
    models = [need("llama31_8b", ("assistant",)), need("llama31_70b", ("user", "judge"), tp=4, max_model_len=16_384)]
    chosen = layouts(models, 8, RULES)
    [other] = chosen.others
    assert (chosen.name, other.name) == ("own GPUs", "in process") and other.placements is not None
    placed = {p.key: p for p in chosen.placements}
    assert (placed["llama31_70b"].mode, placed["llama31_70b"].gpus) == ("in_process", (0, 1, 2, 3))
    assert (placed["llama31_8b"].mode, placed["llama31_8b"].gpus) == ("managed_server", (4,))
    shared = {p.key: p for p in other.placements}
    for key in placed:
        assert placed[key].kv_cache_memory_bytes > shared[key].kv_cache_memory_bytes
        assert placed[key].held_per_gpu(RULES) <= GPU_80GB * 0.9
    # a model that must run in this process (scheduling=continuous) takes the first GPUs instead
    held = [dataclasses.replace(models[0], placement="in_process"), models[1]]
    placed = {p.key: (p.mode, p.gpus) for p in plan_placement(held, 8, RULES)}
    assert placed == {"llama31_8b": ("in_process", (0,)), "llama31_70b": ("managed_server", (1, 2, 3, 4))}
    both = [dataclasses.replace(m, placement="in_process") for m in models]
    assert {p.mode for p in plan_placement(both, 8, RULES)} == {"in_process"}  # shared, in this process


def test_one_model_runs_in_this_process_on_the_first_gpus():
    [p] = plan_placement([need("llama31_70b", ("judge",), tp=4)], 8, RULES)
    assert (p.mode, p.gpus) == ("in_process", (0, 1, 2, 3))


def test_70b_alone_on_one_or_two_gpus_is_refused_before_loading_with_the_sizes():
    with pytest.raises(PersonalensError, match=r"do not fit on 1 GPU.*llama31_70b.*Ways out.*engine: server"):
        plan_placement([need("llama31_70b", ("user",), tp=4)], 1, RULES)
    with pytest.raises(PersonalensError, match="GiB per GPU with overhead and activations"):
        plan_placement([need("llama31_70b", ("user",), tp=2)], 2, RULES)


def test_the_kv_budget_holds_at_least_one_sequence_of_max_model_len():
    """vLLM refuses to start unless the KV cache holds one max_model_len sequence: at Llama-3.1's full
    131,072-token context the 70B's KV (10 GiB per GPU at tp 4) beside the 8B's (16 GiB) no longer fits
    one node of 4 x 80 GB in process."""
    full = 131_072
    a = arch("llama31_8b")
    [alone] = plan_placement([need("llama31_8b", ("assistant",), max_model_len=full)], 1, RULES)
    assert alone.kv_cache_memory_bytes >= a.kv_bytes_for(full, 2) and alone.max_len_seqs >= 1
    models = [
        need("llama31_8b", ("assistant",), max_model_len=full),
        need("llama31_70b", ("user", "judge"), tp=4, max_model_len=full),
    ]
    with pytest.raises(PersonalensError, match="one max_model_len of 131072 tokens"):
        plan_placement(models, 4, RULES)
    placed = plan_placement(models, 8, RULES)  # each on its own GPUs instead
    assert [(p.mode, p.gpus) for p in placed] == [("managed_server", (4,)), ("in_process", (0, 1, 2, 3))]
    assert all(p.kv_cache_memory_bytes >= p.kv_per_token_per_gpu * full for p in placed)


def test_sliding_layers_let_gemma_hold_long_contexts():
    """Gemma-3-27B with 65,536 tokens on one 80 GB GPU: ten global layers hold the context (5 GiB),
    where 62 full layers would need 31 GiB beside 54 GB of weights."""
    gemma3 = need("gemma3_27b", ("assistant",), max_model_len=65_536)
    [p] = plan_placement([gemma3], 1, RULES)
    assert p.max_len_seqs >= 1
    as_if_full = dataclasses.replace(gemma3, arch=dataclasses.replace(gemma3.arch, windows=(None,) * 62))
    with pytest.raises(PersonalensError, match="do not fit"):
        plan_placement([as_if_full], 1, RULES)


def test_a_float32_dtype_doubles_the_weights_and_the_kv():
    qwen = need("qwen25_72b", ("judge",), tp=4, max_model_len=32_768)
    [p] = plan_placement([qwen], 4, RULES)
    float32 = need("qwen25_72b", ("judge",), tp=4, dtype_bytes=4, max_model_len=32_768)
    assert float32.weights == 2 * qwen.weights and float32.kv_per_token == 2 * qwen.kv_per_token
    with pytest.raises(PersonalensError, match=r"qwen25_72b \(judge\): weights 270\.\d GiB"):
        plan_placement([float32], 4, RULES)
    [wider] = plan_placement([dataclasses.replace(float32, tp=8)], 8, RULES)
    assert (
        wider.gpus == tuple(range(8)) and wider.weights_per_gpu == p.weights_per_gpu
    )  # twice the bytes, twice the GPUs


def test_two_8b_class_models_share_one_gpu_in_process():
    models = [need("llama31_8b", ("assistant",)), need("mistral7b_v02", ("user", "judge"))]
    placed = plan_placement(models, 1, RULES)
    assert [p.mode for p in placed] == ["in_process", "in_process"]
    assert all(p.kv_cache_memory_bytes > 0 for p in placed)


def test_models_too_large_together_get_gpus_of_their_own():
    # Mixtral at tp 2 (~47 GB per GPU) and a 70B at tp 4 (~35 GB per GPU) overflow shared GPUs
    models = [need("mixtral8x7b", ("assistant",), tp=2), need("llama31_70b", ("user", "judge"), tp=4)]
    with pytest.raises(PersonalensError):
        plan_placement(models, 4, RULES)
    placed = plan_placement(models, 8, RULES)
    assert [(p.mode, p.gpus) for p in placed] == [("managed_server", (4, 5)), ("in_process", (0, 1, 2, 3))]


def test_explicit_placement_and_gpus_are_honoured_or_refused():
    models = [
        need("llama31_8b", ("assistant",), placement="managed_server", gpus=(3,)),
        need("mistral7b_v02", ("user",), gpus=(0,)),
    ]
    assert [(p.mode, p.gpus) for p in plan_placement(models, 4, RULES)] == [
        ("managed_server", (3,)),
        ("in_process", (0,)),
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
    big = [need("mixtral8x7b", ("assistant",), tp=2, placement="in_process"), need("llama31_70b", ("user",), tp=4)]
    with pytest.raises(PersonalensError, match="placement auto for mixtral8x7b"):
        plan_placement(big, 4, RULES)


@pytest.mark.parametrize("n_gpus", [1, 2, 4, 8])
def test_each_8b_class_model_alone_fits_every_node_size(n_gpus):
    for name in ("llama31_8b", "mistral7b_v02", "gemma2_27b"):
        [p] = plan_placement([need(name, ("assistant",), max_model_len=8192)], n_gpus, RULES)
        assert p.mode == "in_process" and p.max_len_seqs >= 1


@pytest.mark.parametrize(("n_gpus", "fits"), [(1, False), (2, False), (4, True), (8, True)])
def test_70b_user_agent_and_judge_with_8b_assistant_by_node_size(n_gpus, fits):
    models = [
        need("llama31_8b", ("assistant",), max_model_len=16_384),
        need("llama31_70b", ("user", "judge"), tp=min(4, n_gpus), max_model_len=16_384),
    ]
    if not fits:
        with pytest.raises(PersonalensError, match="do not fit"):
            plan_placement(models, n_gpus, RULES)
        return
    placed = plan_placement(models, n_gpus, RULES)
    assert all(used_per_gpu(placed, g) <= GPU_80GB * 0.9 for g in range(n_gpus))
    assert all(p.max_len_seqs >= 1 for p in placed)


def test_each_models_memory_share_is_its_own():
    """A small model with a CPU-sized share (0.15, as the embedded default) beside an 8B at 0.9 on one
    80 GB GPU: the 8B fills the GPU to its own share, the small model holds no more than its own."""
    small = need("mistral7b_v02", ("user", "judge"), utilization=0.15, kv_cache_bytes=GIB, max_model_len=8192)
    small = dataclasses.replace(small, weights=GIB)  # a 135M-class model's weights and a fixed KV cache
    eight = need("llama31_8b", ("assistant",), max_model_len=65_536)
    placed = {p.key: p for p in plan_placement([small, eight], 1, RULES)}
    assert placed["mistral7b_v02"].held_per_gpu(RULES) <= 0.15 * GPU_80GB
    assert used_per_gpu(placed.values(), 0) <= 0.9 * GPU_80GB < used_per_gpu(placed.values(), 0) + GIB
    # the small share caps only its own model: alone, the 8B gets the same GPU up to 0.9 either way
    [alone] = plan_placement([eight], 1, RULES)
    assert placed["llama31_8b"].kv_cache_memory_bytes > 0.8 * (alone.kv_cache_memory_bytes - small.fixed_per_gpu(RULES))
    # a model that needs more than its own share is refused, whatever the GPU has free
    with pytest.raises(PersonalensError, match=r"llama31_8b \(assistant\).*memory share 0.15 \(11.2 GiB\)"):
        plan_placement([dataclasses.replace(eight, utilization=0.15)], 1, RULES)


def test_free_gpus_go_to_copies_by_work():
    """Two 8B-class models on 8 GPUs: one each, then the six free GPUs shared out in proportion to the
    work (generated tokens per dialogue x weights per GPU), not all to one model."""
    user, assistant = need("llama31_8b", ("user_agent",)), need("mistral7b_v02", ("assistant",))
    chosen = layouts([user, assistant], 8, RULES)
    copies = {p.key: [c.gpus for c in p.copies] for p in with_copies(chosen, 8, {}).placements}
    assert {k: len(v) for k, v in copies.items()} == {"llama31_8b": 3, "mistral7b_v02": 3}  # 4 + 4 engines
    assert sorted(g for v in copies.values() for (g,) in v) == [2, 3, 4, 5, 6, 7]
    # three times the assistant's tokens (its 300-token replies against the user agent's 100): 2 + 6 engines
    by_work = with_copies(chosen, 8, {"user_agent": 100, "assistant": 300})
    assert {p.key: len(p.copies) for p in by_work.placements} == {"llama31_8b": 1, "mistral7b_v02": 5}
    assert "by work (1 copy of llama31_8b, 5 copies of mistral7b_v02" in by_work.copies_why
    # a 70B (tp 4) with an 8B on 8 GPUs: the 70B's work is larger, but no copy of it fits the three left
    seventy = need("llama31_70b", ("user_agent",), tp=4)
    wide = with_copies(layouts([seventy, assistant], 8, RULES), 8, {})
    assert {p.key: [c.gpus for c in p.copies] for p in wide.placements} == {
        "llama31_70b": [],
        "mistral7b_v02": [(5,), (6,), (7,)],
    }
    assert engine_time(seventy, {}) > 2 * engine_time(assistant, {})  # 35 against 14.5 GB read per GPU a step
    # replicas 1 keeps a model to one engine: the free GPUs go to the other
    held = layouts([dataclasses.replace(user, replicas=1), assistant], 8, RULES)
    assert {p.key: len(p.copies) for p in with_copies(held, 8, {}).placements} == {"llama31_8b": 0, "mistral7b_v02": 6}


def test_the_largest_max_model_len_that_fits_is_found():
    """The README's cluster example with Qwen2.5-72B's published sizes: a 72B user agent and judge (tp
    4) with an 8B assistant at max_model_len 65,536 do not fit 4 x 80 GB, at 16,384 they do."""
    models = [
        need("llama31_8b", ("assistant",), max_model_len=65_536),
        need("qwen25_72b", ("user_agent", "judge"), tp=4, max_model_len=65_536),
    ]
    assert not layouts(models, 4, RULES).fits
    fitting = largest_max_model_len(models, 4, RULES)
    assert 16_384 <= fitting < 65_536 and fitting % 256 == 0

    def at(length: int) -> bool:
        return layouts([dataclasses.replace(m, max_model_len=length) for m in models], 4, RULES).fits

    assert at(fitting) and not at(fitting + 256)
    with pytest.raises(PersonalensError, match=rf"max_model_len {fitting:,} \(the largest that fits\)"):
        plan_placement(models, 4, RULES)
    assert largest_max_model_len(models, 8, RULES) is None  # they fit as they are
    assert largest_max_model_len([need("llama31_70b", ("user",), tp=4, max_model_len=8192)], 1, RULES) is None


def test_dialogues_in_flight_keep_their_histories_in_the_kv_cache():
    """Qwen2.5-72B at tp 4 on 80 GB GPUs holds 431,756 tokens beside its weights; a dialogue of 8 rounds
    of 200/300-token replies keeps its last user-agent prompt and reply there, about 4,600 tokens."""
    assert dialogues_in_flight(431_756, 4_600, 256) == 93
    assert dialogues_in_flight(431_756, 1_000, 256) == 256  # never above max_num_seqs
    assert dialogues_in_flight(3_000, 4_600, 256) == 1  # at least one
    user = need("qwen25_72b", ("user_agent", "judge"), tp=4, max_model_len=32_768)
    assistant = need("llama31_8b", ("assistant",), max_model_len=32_768)
    layout = with_copies(layouts([user, assistant], 8, RULES), 8, {})
    placed = {p.key: p for p in layout.placements}
    kv = placed["qwen25_72b"].kv_tokens
    # the 72B's one engine bounds the layout; the 8B's four engines hold four times its own limit
    limit = in_flight(layout.placements, {"user_agent": 4_600, "assistant": 4_900, "judge": 10**9})
    assert (
        limit
        == dialogues_in_flight(kv, 4_600, 256)
        < 4 * dialogues_in_flight(placed["llama31_8b"].kv_tokens, 4_900, 256)
    )
