"""The planner against the KV levers measured on one H200 (docs/performance.md, `bench/gpu_row.py
--levers`): Llama-3.1-8B's architecture with random weights and SmolLM2's vocabulary, vLLM 0.26.0,
the excerpt's user 0 (89 dialogues: 73 SD, 16 MD), 2/3 rounds of 60/200-token replies, one engine
for every role, every dialogue in flight. Measured, in generate's wall time (55,749 generated tokens
each; the trace's prompt tokens prefilled / cached):

    bf16 KV, 882,048 KV tokens          3,171.5 tokens/s   48% / 52%
    fp8 KV, 1,764,112 KV tokens         3,273.5 tokens/s   48% / 52%
    4 GiB of KV (32,768 tokens)         2,602.4 tokens/s   70% / 30%
    the same + 48 GiB of host memory    2,513.9 tokens/s   48% / 52%

Modelled as that run went: random weights never say TERMINATE, so each dialogue ends at the user
agent's answer to the capped reply (2 x rounds + 1 turns), every reply at its budget, going back into
later prompts at the length SmolLM2's tokenizer re-reads it. The fixed parts are what `personalens
plan` printed for the run's config. The bands: the KV cache within 1% of vLLM's; the cached share
within 5 points; tokens/s within 1.4x either way; the gain of each lever (fp8 over bf16, host memory
over none) within 0.1 of the measured. The host link's effective rate (gpu_model.HOST_BANDWIDTH) was
fitted to the last row, so that row's gain is no prediction: no other run measured offloading, so
the rate is refitted from this row here (the constant must be that fit), and its gain is not claimed
as a prediction; the fp8 row's gain, fitted to nothing, is."""

import random

import pytest
from tokenizers import Tokenizer

from personalens.engines.models.config import ModelConfig
from personalens.engines.models.embedded import embedded_model_dir
from personalens.engines.placement.gpus import simulated
from personalens.engines.placement.layout import plan_layout
from personalens.plan import gpu_model
from personalens.plan.budget import Fixed, Turns, Workload
from personalens.plan.gpu_model import GPUS
from personalens.plan.throughput import compare, dialogues, sampled

# measured: KV tokens vLLM gave, generated tokens/s, share of prompt tokens from the prefix cache
MEASURED = {
    "bf16": (882_048, 55_749 / 17.578, 0.52),
    "fp8": (1_764_112, 55_749 / 17.030, 0.52),
    "4 GiB": (32_768, 55_749 / 21.422, 0.30),
    "4 GiB + host": (32_768, 55_749 / 22.176, 0.52),
}
# `personalens plan` of the row's config: "fixed parts of a SD dialogue: user agent 1,008 first, 1,194
# later; assistant 481 ... shared with the user's other dialogues: user agent 311, assistant 481, judge
# 567; not repeated by the role's next prompt: user agent's first 648, user agent 337, assistant 124"; MD
# alike with 2,119 / 2,305 / 481, shared 288, and the first prompt's 1,603
TAIL = {"user": 337, "assistant": 124}
FIXED = {
    "SD": Fixed(1008, 1194, 481, {}, {"user": 311, "assistant": 481}, {"user_first": 648, **TAIL}),
    "MD": Fixed(2119, 2305, 481, {}, {"user": 288, "assistant": 481}, {"user_first": 1603, **TAIL}),
}
ROUNDS, REPLY = {"SD": 2, "MD": 3}, {"user": 60, "assistant": 200}
CONFIG = (
    '{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, '
    '"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, '
    '"vocab_size": 49152, "max_position_embeddings": 131072, "tie_word_embeddings": false, "torch_dtype": "bfloat16"}'
)  # bench/gpu_row.py's llama31_8b with the tokenizer's vocabulary
LEVERS = {
    "bf16": {"max_model_len": 65536},
    "fp8": {"max_model_len": 65536, "kv_cache_dtype": "fp8"},
    "4 GiB": {"max_model_len": 8192, "kv_cache_memory_bytes": 4 * 2**30},
    "4 GiB + host": {"max_model_len": 8192, "kv_cache_memory_bytes": 4 * 2**30, "kv_offload_gib": 48.0},
}


def reread(tokens: int, tokenizer: Tokenizer, rng: random.Random, n: int = 200) -> float:
    """The mean tokens a reply of `tokens` random ids of the tokenizer's vocabulary adds to a later prompt."""
    vocab = tokenizer.get_vocab_size()
    texts = (tokenizer.decode([rng.randrange(vocab) for _ in range(tokens)]) for _ in range(n))
    return sum(len(tokenizer.encode(t, add_special_tokens=False).ids) for t in texts) / n


@pytest.fixture(scope="module")
def modelled(tmp_path_factory):
    """The row's dialogues and model folder: a lever's (KV tokens, tokens/s, cached share) as modelled."""
    tokenizer = Tokenizer.from_file(str(embedded_model_dir() / "tokenizer.json"))
    rng = random.Random(0)
    history = sum(reread(n, tokenizer, rng) for n in REPLY.values()) / len(REPLY)
    turns = {k: Turns({2 * r + 1: 1.0}, REPLY, history, "the row") for k, r in ROUNDS.items()}
    workload = Workload(FIXED, turns, 120, (), False, "the row")
    work, _ = dialogues(sampled({"SD": 73, "MD": 16}, workload, 256), workload, {})
    folder = tmp_path_factory.mktemp("model")
    (folder / "config.json").write_text(CONFIG)

    def lever(name: str) -> tuple[int, float, float]:
        config = ModelConfig("Llama-3.1-8B-Instruct", path=str(folder), **LEVERS[name])
        layout = plan_layout({"user_agent": config, "assistant": config}, simulated(1, 140.4))  # 143,771 MiB
        [row] = [r for r in compare(layout, GPUS["h200"], [work], "all")["layouts"] if r["chosen"]]
        return layout.placements[0].kv_tokens, row["tokens_per_s"], row["cached_share"]

    return lever


@pytest.fixture(scope="module")
def predicted(modelled):
    return {name: modelled(name) for name in LEVERS}


@pytest.mark.parametrize("lever", list(LEVERS))
def test_each_lever_row_is_predicted_within_the_band(predicted, lever):
    kv, rate, cached = predicted[lever]
    kv_measured, rate_measured, cached_measured = MEASURED[lever]
    assert kv == pytest.approx(kv_measured, rel=0.01)
    assert cached == pytest.approx(cached_measured, abs=0.05)
    assert 1 / 1.4 < rate / rate_measured < 1.4


def test_the_fp8_kv_gain_is_predicted(predicted):
    gain, measured = predicted["fp8"][1] / predicted["bf16"][1], MEASURED["fp8"][1] / MEASURED["bf16"][1]
    assert gain == pytest.approx(measured, abs=0.1)


def test_the_host_link_rate_is_the_fit_to_the_offloading_row(modelled, predicted, monkeypatch):
    """HOST_BANDWIDTH is the rate at which the modelled offloading gain equals the measured 0.97: found
    again here by bisection (the gain grows with the rate), so a change to the model that moves the fit
    fails until the constant is fitted again. It predicts nothing: no other run measured offloading."""
    measured = MEASURED["4 GiB + host"][1] / MEASURED["4 GiB"][1]
    small = predicted["4 GiB"][1]
    low, high = 1e9, 64e9  # up to a direction of PCIe 5.0 x16
    for _ in range(8):
        middle = (low * high) ** 0.5
        monkeypatch.setattr(gpu_model, "HOST_BANDWIDTH", middle)
        low, high = (middle, high) if modelled("4 GiB + host")[1] / small < measured else (low, middle)
    assert gpu_model.HOST_BANDWIDTH == pytest.approx((low * high) ** 0.5, rel=0.1)
