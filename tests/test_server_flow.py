"""How many requests a server engine keeps in flight (engines/flow.py), pure: from a KV cache
sized with a published architecture, and from vLLM's /metrics text. tests/test_server.py checks it
against a real `vllm serve`."""

from __future__ import annotations

import json
from pathlib import Path

from engine_fixtures import chat

from personalens.engines.flow import (
    PromptSizes,
    ReplySizes,
    in_flight,
    kv_cache_tokens,
    needs,
    shared_prefix_chars,
)
from personalens.engines.placement.architecture import Architecture

FIXTURES = Path(__file__).parent / "fixtures" / "architectures"
GIB = 1024**3


def test_a_70b_on_four_gpus_runs_a_handful_of_paper_length_requests_not_max_num_seqs():
    # the case: Llama-3.1-70B with tensor parallelism 4, 30 GiB of KV cache per GPU, the
    # paper protocol's ~20k-token prompts with 800-token replies, max_num_seqs 256
    arch = Architecture.from_config(json.loads((FIXTURES / "llama31_70b.json").read_text()))
    kv_tokens = 30 * GIB // arch.kv_bytes_per_token(2, tp=4)
    assert kv_tokens == 393_216  # 80 layers x 2 KV heads per GPU x 128 x K,V x 2 bytes = 80 KiB a token
    n = in_flight(kv_tokens, [20_000 + 800] * 256, limit=256)
    assert n == 18
    # shorter prompts: more at once, up to the limit
    assert in_flight(kv_tokens, [1_000 + 800] * 256, limit=256) == 218
    assert in_flight(kv_tokens, [100 + 100] * 256, limit=256) == 256


def test_the_mean_need_counts_not_the_longest_and_at_least_one_runs():
    assert in_flight(10_000, [1_000, 3_000], limit=64) == 5  # 10,000 / 2,000
    # one request larger than the whole cache still goes (the server answers or refuses it)
    assert in_flight(1_000, [50_000], limit=64) == 1


def test_without_a_reported_cache_the_limit_holds():
    assert in_flight(None, [20_000] * 10, limit=7) == 7
    assert in_flight(5_000, [], limit=7) == 7


METRICS = """# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="0",num_gpu_blocks="27000"} 1.0
vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="1",num_gpu_blocks="26000"} 1.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
"""


def test_the_kv_cache_size_is_read_from_vllm_metrics_summed_over_its_engines():
    assert kv_cache_tokens(METRICS) == (27_000 + 26_000) * 16
    # a server that does not report it, has not sized its cache, or answers /metrics with no metrics
    assert kv_cache_tokens(METRICS.split("# HELP vllm:num_requests_running")[0].replace("27000", "None")) == 26_000 * 16
    assert kv_cache_tokens(METRICS[METRICS.index("# HELP vllm:num_requests_running") :]) is None
    assert kv_cache_tokens("<html>not found</html>") is None


def test_prompt_sizes_start_conservative_then_follow_the_servers_counts():
    sizes = PromptSizes()
    request = chat("x" * 300)
    assert sizes.estimate(request) == 100  # 3 characters a token before any reply
    sizes.add(request, 0)  # a refused request reports no tokens: nothing learned
    assert sizes.estimate(request) == 100
    sizes.add(request, 60)
    sizes.add(chat("y" * 100), 40)  # 100 tokens for 400 characters
    assert sizes.estimate(chat("z" * 800)) == 200


def test_replies_count_at_what_their_kind_has_taken_so_far():
    """A judge-like workload: 4,000-token budgets, replies of a few hundred. Before any reply each
    request counts its whole budget; once replies are in, their mean (never above the budget), per
    kind of request, so a dialogue role's replies do not change the judge's count."""
    replies = ReplySizes()
    judge = chat("x", grammar="root ::= x", max_tokens=4_000)
    assistant = chat("y", max_tokens=800)
    assert (replies.expect(judge), replies.expect(assistant)) == (4_000, 800)
    replies.add(judge, 250)
    replies.add(chat("z", grammar="root ::= z", max_tokens=4_000), 350)
    assert (replies.expect(judge), replies.expect(assistant)) == (300, 800)
    replies.add(assistant, 5_000)  # as a server reports it; counted at most at the budget
    assert replies.expect(assistant) == 800


def test_a_shared_prefix_counts_once_and_the_cap_grows_with_learned_replies():
    """256 judge prompts that share 6,000 characters of instructions and differ in a 600-character
    dialogue, on a 70B's 393,216 KV tokens (tp 4, 30 GiB per GPU), at 3 characters a token: counted
    with every prompt whole and every reply at 4,000 tokens 63 fit; with the instructions once, 93;
    with the replies at their learned 300 tokens, 786 (so the limit, max_num_seqs, holds), and the
    tokens they hold stay within the cache."""
    instructions = "Rate the dialogue below. " * 240
    requests = [
        chat(instructions + f"dialogue {i}: " + "w" * 588, grammar="root ::= x", max_tokens=4_000) for i in range(256)
    ]
    assert shared_prefix_chars(requests) == len(instructions) + len("dialogue ")
    assert shared_prefix_chars(requests[:1]) == 0
    prompts, replies = PromptSizes(chars=3, tokens=1), ReplySizes()  # 3 characters a token
    kv_tokens = 393_216
    today = in_flight(kv_tokens, [prompts.estimate(r) + 4_000 for r in requests], limit=256)
    shared, each = needs(requests, prompts, replies)
    assert shared == 2_003 and each[0] == 2_200 - 2_003 + 4_000
    first = in_flight(kv_tokens, each, limit=256, shared=shared)
    for r in requests[:8]:
        replies.add(r, 300)
    shared, each = needs(requests, prompts, replies)
    learned = in_flight(kv_tokens, each, limit=4_096, shared=shared)
    assert (today, first, learned) == (63, 93, 786)
    assert shared + sum(each) * learned / len(each) <= kv_tokens < shared + sum(each) * (learned + 1) / len(each)
    assert in_flight(kv_tokens, each, limit=256, shared=shared) == 256
