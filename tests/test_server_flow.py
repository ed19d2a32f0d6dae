"""How many requests a server engine keeps in flight (engines/flow.py), pure: from a KV cache
sized with a published architecture, and from vLLM's /metrics text; the budget its concurrent calls
share, from threads with event loops of their own. tests/test_server.py checks it against a real
`vllm serve`."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from fractions import Fraction
from pathlib import Path

import pytest
from engine_fixtures import chat

from personalens.engines.flow import (
    InFlight,
    PromptSizes,
    ReplySizes,
    in_flight,
    kv_cache_tokens,
    needs,
    share,
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


def test_the_shares_in_flight_never_add_up_to_more_than_one_and_waiters_go_first():
    budget = InFlight()
    assert [budget.try_take(share(3)) for _ in range(4)] == [True, True, True, False]
    budget.give(share(3))
    # a call of larger requests (2 in flight) beside one of 3: its share fits once two thirds are back
    assert not budget.try_take(share(2))
    budget.give(share(3))
    assert budget.try_take(share(2)) and budget.held == Fraction(5, 6)
    budget.give(share(2))
    budget.give(share(3))
    # one request larger than the cache (a call of 1) fits an engine with nothing in flight, alone
    assert budget.held == 0 and budget.try_take(share(1)) and not budget.try_take(share(1000))
    budget.give(share(1))

    async def queued_behind_a_waiter():
        budget.try_take(share(2))
        first = asyncio.ensure_future(budget.take(share(1)))
        await asyncio.sleep(0)
        # the half left is enough for a third, but it does not pass the request that waits before it
        assert not first.done() and not budget.try_take(share(3))
        budget.give(share(2))
        await first
        assert budget.held == 1

    asyncio.run(queued_behind_a_waiter())


def test_calls_that_try_again_take_the_budget_in_the_order_they_came():
    """The in-process engine's calls (`try_take` with the call as `caller`): a call of large requests
    that does not fit waits, and later calls of smaller ones that would fit the room left do not take
    it before it; once in, its next request waits behind them."""
    budget = InFlight()
    assert budget.try_take(share(3), "earlier") and budget.try_take(share(3), "earlier")  # two thirds held
    assert not budget.try_take(share(2), "large")  # a half does not fit: it waits, first in line
    assert not budget.try_take(share(3), "small")  # a third fits, but came after `large`
    assert not budget.try_take(share(3))  # nor does a caller with no place in line
    budget.give(share(3))  # a third held: `large` fits
    assert not budget.try_take(share(3), "small")
    assert budget.try_take(share(2), "large") and budget.held == Fraction(5, 6)
    assert not budget.try_take(share(2), "large")  # its next request: in line behind `small`
    budget.give(share(3))  # a half held: either fits
    assert not budget.try_take(share(2), "large")
    assert budget.try_take(share(3), "small") and budget.held == Fraction(5, 6)
    budget.give(share(2))
    assert budget.try_take(share(2), "large")
    budget.give(share(2))
    budget.give(share(3))
    assert budget.held == 0

    async def a_coroutine_behind_a_call():
        budget.try_take(share(1), "whole")
        assert not budget.try_take(share(1), "next")  # in line behind nothing, but nothing fits
        waiter = asyncio.ensure_future(budget.take(share(4)))  # after `next`, which it does not pass
        await asyncio.sleep(0)
        budget.give(share(1))
        await asyncio.sleep(0)
        assert not waiter.done() and budget.try_take(share(1), "next")
        budget.give(share(1))  # `next` took its turn: the coroutine's comes
        await asyncio.wait_for(waiter, 5)
        assert budget.held == Fraction(1, 4)
        assert not budget.try_take(share(1), "gone")
        budget.leave("gone")  # its call ended while it waited: no one waits behind it
        budget.give(share(4))
        assert budget.try_take(share(1)) and budget.held == 1

    asyncio.run(a_coroutine_behind_a_call())


def test_a_cancelled_waiter_takes_nothing_and_lets_those_behind_it_go():
    async def run():
        budget = InFlight()
        budget.try_take(share(2))
        big = asyncio.ensure_future(budget.take(share(1)))  # waits for the half in flight
        small = asyncio.ensure_future(budget.take(share(4)))  # fits, but waits behind `big`
        await asyncio.sleep(0)
        assert not big.done() and not small.done()
        big.cancel()
        await asyncio.wait_for(small, 5)  # its turn once `big` stops waiting
        assert budget.held == Fraction(3, 4)
        with pytest.raises(asyncio.CancelledError):
            await big
        budget.give(share(4))
        # granted, then cancelled before it could go on (its wake-up still pending): the share goes back
        late = asyncio.ensure_future(budget.take(share(1)))
        await asyncio.sleep(0)
        budget.give(share(2))  # makes room: `late` holds the whole budget
        assert budget.held == 1
        late.cancel()
        with pytest.raises(asyncio.CancelledError):
            await late
        assert budget.held == 0

    asyncio.run(run())


def test_calls_in_threads_with_loops_of_their_own_share_one_budget():
    """Three calls at once, each in its own thread and event loop as a server engine's: at most 6
    requests of the engine in flight together (each call alone would keep 6), all of them served."""
    budget, lock = InFlight(), threading.Lock()
    in_flight, most, served = [0], [0], []

    async def call(tag: str) -> None:
        async def one(i: int) -> None:
            await budget.take(share(6))
            try:
                with lock:
                    in_flight[0] += 1
                    most[0] = max(most[0], in_flight[0])
                await asyncio.sleep(0.002)
                with lock:
                    in_flight[0] -= 1
                    served.append((tag, i))
            finally:
                budget.give(share(6))

        await asyncio.gather(*(one(i) for i in range(40)))

    threads = [threading.Thread(target=asyncio.run, args=(call(tag),)) for tag in "abc"]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert sorted(served) == [(tag, i) for tag in "abc" for i in range(40)]
    assert most[0] == 6 and budget.held == 0 and time.monotonic() - started < 10
